"""Image files on disk: class-per-subfolder trees, per-site trees, and CSV manifests.

Images are decoded with Pillow (``pip install fedxrisk[images]``), converted to
RGB (or L) and resized to ``image_size`` × ``image_size``; the whole set is held
in memory as float32 in [0, 1] (N × C × S × S × 4 bytes).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedxrisk.data.checks import read_text
from fedxrisk.data.datasets import TEST_FRACTION, LabeledData
from fedxrisk.data.lazy import ImageFiles, LazySamples, reading_lazily
from fedxrisk.data.readers.base import (
    DataFileError,
    MissingDataError,
    codes,
    images_to_float,
    require_dir,
    split_labeled,
)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".ppm", ".pgm"}
UNCERTAIN_POLICIES = ("ones", "zeros", "ignore")
RESERVED_COLUMNS = ("path", "split", "source", "patient")
FOLDER_LAYOUT = (
    "  <data_dir>/train/<class>/<image>  and  <data_dir>/test/<class>/<image>\n"
    "  or <data_dir>/<class>/<image> (then split 70/30, stratified, fixed seed);\n"
    "  class ids follow the sorted subfolder names"
)
SITES_LAYOUT = (
    "  <data_dir>/<site>/<class>/<image>  or  <data_dir>/<site>/{train,test}/<class>/<image>\n"
    "  one client per site with partition='source'"
)
MANIFEST_LAYOUT = (
    "  <data_dir>/manifest.csv with a header: path,<label>[,<label>…][,split][,source][,patient]\n"
    "  path: image path relative to the CSV's folder; one label column = integer classes,\n"
    "  several = multi-label (1 positive, 0 or blank negative, -1 uncertain); split: train|test"
)


def load_image(path: Path, image_size: int | None, mode: str = "RGB") -> np.ndarray:
    """One image as uint8 ``[C, H, W]``; errors name the file."""
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - Pillow ships with matplotlib
        raise ImportError("reading image files needs Pillow: pip install 'fedxrisk[images]'") from e
    if not path.is_file():
        raise MissingDataError(f"image {str(path)!r} not found")
    try:
        with Image.open(path) as img:
            img = img.convert(mode)
            if image_size is not None and img.size != (image_size, image_size):
                img = img.resize((image_size, image_size), Image.BILINEAR)
            arr = np.asarray(img, dtype=np.uint8)
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise DataFileError(f"{path}: cannot decode image ({e})") from None
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


MAX_LISTED = 20  # missing files named in one error message


def check_files_exist(paths: Sequence[Path | str]) -> None:
    """Every listed image file exists, or one error naming all the missing ones (up to
    :data:`MAX_LISTED`, then a count): a manifest is checked whole before anything runs."""
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        shown = ", ".join(missing[:MAX_LISTED])
        more = f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
        raise MissingDataError(f"{len(missing)} of {len(paths)} image file(s) not found: {shown}{more}")


def load_images(paths: Sequence[Path], image_size: int | None, mode: str = "RGB") -> np.ndarray:
    """Images stacked as float32 ``[N, C, S, S]`` in [0, 1]; all must share a size.

    Inside :func:`~fedxrisk.data.lazy.lazy_reading` nothing is decoded: the result is a
    :class:`~fedxrisk.data.lazy.LazySamples` over the files. Either way every file must exist.
    """
    check_files_exist(paths)
    if reading_lazily():
        if not paths:
            raise DataFileError("no images to read")
        return LazySamples(ImageFiles(paths, image_size, mode))  # type: ignore[return-value]
    arrays = [load_image(p, image_size, mode) for p in paths]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DataFileError(f"images differ in size {sorted(shapes)[:3]}; pass image_size to resize them")
    if not arrays:
        raise DataFileError("no images to read")
    return images_to_float(np.stack(arrays))


def _class_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def scan_class_folders(
    root: Path, classes: Sequence[str] | None = None
) -> tuple[list[Path], np.ndarray, list[str]]:
    """(image paths, class ids, class names) of ``root/<class>/…``."""
    dirs = _class_dirs(root)
    names = list(classes) if classes is not None else [d.name for d in dirs]
    found = {d.name for d in dirs}
    if classes is not None and found - set(names):
        raise DataFileError(f"{root}: classes {sorted(found - set(names))} are not among {names}")
    paths, labels = [], []
    for c, name in enumerate(names):
        files = _image_files(root / name) if (root / name).is_dir() else []
        paths += files
        labels += [c] * len(files)
    if len(names) < 2 or not paths:
        raise DataFileError(
            f"{root}: found {len(names)} class folder(s) and {len(paths)} image(s); "
            f"need ≥ 2 classes with images; expected:\n{FOLDER_LAYOUT}"
        )
    return paths, np.array(labels, dtype=np.int64), names


def read_image_folder(
    data_dir: str | Path | None, image_size: int | None = 32, mode: str = "RGB", name: str = "folder"
) -> LabeledData:
    """Class-per-subfolder images (CATvsDOG, Melanoma-style), with or without train/ and test/."""
    root = require_dir(data_dir, name, FOLDER_LAYOUT)
    if (root / "train").is_dir() != (root / "test").is_dir():
        raise MissingDataError(f"{name}: {root} has only one of train/ and test/; expected:\n{FOLDER_LAYOUT}")
    if (root / "train").is_dir():
        tr_paths, y_train, classes = scan_class_folders(root / "train")
        te_paths, y_test, _ = scan_class_folders(root / "test", classes)
        return LabeledData(
            name, load_images(tr_paths, image_size, mode), y_train,
            load_images(te_paths, image_size, mode), y_test, len(classes), label_names=tuple(classes),
        )  # fmt: skip
    paths, y, classes = scan_class_folders(root)
    return split_labeled(
        name, load_images(paths, image_size, mode), y, len(classes), label_names=tuple(classes)
    )


def read_site_folders(
    data_dir: str | Path | None, image_size: int | None = 32, mode: str = "RGB", name: str = "sites"
) -> LabeledData:
    """One folder per site (hospital) holding a class-per-subfolder tree; ``groups_train['source']`` = site.

    Every site uses the same class names (the union, sorted). The test set is the
    union of the sites' test sets (their ``test/`` folders, or 30% of each site).
    """
    root = require_dir(data_dir, name, SITES_LAYOUT)
    sites = _class_dirs(root)
    if not sites:
        raise MissingDataError(f"{name}: no site folders in {root}; expected:\n{SITES_LAYOUT}")
    trees = {s.name: (s / "train" if (s / "train").is_dir() else s) for s in sites}
    classes = sorted({d.name for tree in trees.values() for d in _class_dirs(tree)})
    parts = []
    for i, site in enumerate(sites):
        paths, y, _ = scan_class_folders(trees[site.name], classes)
        if (site / "test").is_dir():
            te_paths, te_y, _ = scan_class_folders(site / "test", classes)
            part = LabeledData(name, np.arange(len(paths)), y, np.arange(len(te_paths)), te_y, len(classes))
            files = (paths, te_paths)
        else:
            part = split_labeled(name, np.arange(len(paths)), y, len(classes))
            files = ([paths[j] for j in part.x_train], [paths[j] for j in part.x_test])
        parts.append((i, part.y_train, part.y_test, files))
    tr_files = [p for _, _, _, f in parts for p in f[0]]
    te_files = [p for _, _, _, f in parts for p in f[1]]
    return LabeledData(
        name,
        load_images(tr_files, image_size, mode),
        np.concatenate([p[1] for p in parts]),
        load_images(te_files, image_size, mode),
        np.concatenate([p[2] for p in parts]),
        len(classes),
        groups_train={"source": np.concatenate([np.full(len(p[1]), p[0]) for p in parts]).astype(np.int64)},
        label_names=tuple(classes),
    )


def apply_uncertain(values: np.ndarray, policy: str) -> np.ndarray:
    """Map CheXpert's uncertain label -1 to 1 (``ones``), 0 (``zeros``) or NaN (``ignore``)."""
    if policy not in UNCERTAIN_POLICIES:
        raise ValueError(f"uncertain-label policy must be one of {UNCERTAIN_POLICIES}, got {policy!r}")
    out = values.astype(np.float64)
    out[values == -1] = {"ones": 1.0, "zeros": 0.0, "ignore": np.nan}[policy]
    return out


def _parse_label(raw: str, where: str) -> float:
    text = raw.strip()
    if text == "":
        return 0.0  # CheXpert: blank = not mentioned = negative
    try:
        value = float(text)
    except ValueError:
        raise DataFileError(f"{where}: label {raw!r} is not a number") from None
    if value not in (-1.0, 0.0, 1.0) and not value.is_integer():
        raise DataFileError(f"{where}: label {raw!r} must be an integer (1, 0, -1 uncertain)")
    return value


@dataclass
class ManifestTable:
    """The rows of a manifest after the uncertain-label policy, images decoded."""

    x: np.ndarray
    y: np.ndarray  # int classes [N] (one label column) or float {0, 1} [N, L]
    num_classes: int
    groups: dict[str, np.ndarray]
    label_names: tuple[str, ...]
    split: np.ndarray | None  # "train"/"test" per row, when the manifest has a split column


def read_manifest_table(
    csv_path: str | Path,
    *,
    image_root: str | Path | None = None,
    path_column: str = "path",
    label_columns: Sequence[str] | None = None,
    source_column: str | None = "source",
    patient_column: str | None = "patient",
    split_column: str | None = "split",
    uncertain: str | Mapping[str, str] = "ones",
    image_size: int | None = 224,
    mode: str = "RGB",
    patient_pattern: str | None = None,
    name: str = "manifest",
) -> ManifestTable:
    """Parse a manifest CSV and decode its images, without splitting (see :func:`read_manifest`)."""
    path = Path(csv_path)
    if not path.is_file():
        raise MissingDataError(f"{name}: manifest {str(path)!r} not found; expected:\n{MANIFEST_LAYOUT}")
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    rows = list(reader)
    header = list(reader.fieldnames or [])
    for i, r in enumerate(rows):
        if None in r or None in r.values():  # too many fields / too few
            count = len(header) + len(r.get(None, [])) - sum(v is None for v in r.values())
            raise DataFileError(f"{path} row {i + 2}: {count} field(s), the header has {len(header)}")
    if not rows:
        raise DataFileError(f"{path}: no rows below the header; expected:\n{MANIFEST_LAYOUT}")
    if path_column not in header:
        raise DataFileError(
            f"{path}: no {path_column!r} column (header: {header}); expected:\n{MANIFEST_LAYOUT}"
        )
    optional = {c for c in (source_column, patient_column, split_column) if c}
    skip = {path_column, *optional, *RESERVED_COLUMNS}
    labels = list(label_columns) if label_columns else [c for c in header if c not in skip]
    missing = [c for c in labels if c not in header]
    if not labels or missing:
        raise DataFileError(
            f"{path}: label column(s) {missing or 'none'} not in header {header}; expected:\n{MANIFEST_LAYOUT}"
        )
    raw = np.array(
        [[_parse_label(r[c] or "", f"{path} row {i + 2}") for c in labels] for i, r in enumerate(rows)]
    )
    policies = uncertain if isinstance(uncertain, Mapping) else {c: uncertain for c in labels}
    y = np.stack([apply_uncertain(raw[:, j], policies.get(c, "ones")) for j, c in enumerate(labels)], axis=1)
    keep = ~np.isnan(y).any(axis=1)
    rows, y = [r for r, k in zip(rows, keep) if k], y[keep]
    if not rows:
        raise DataFileError(f"{path}: no rows left after the uncertain-label policy {uncertain!r}")
    groups: dict[str, np.ndarray] = {}
    if source_column and source_column in header:
        groups["source"], _ = codes([r[source_column] for r in rows])
    if patient_column and patient_column in header:
        groups["patient"], _ = codes([r[patient_column] for r in rows])
    elif patient_pattern:
        found = [re.search(patient_pattern, r[path_column]) for r in rows]
        if not all(found):
            raise DataFileError(f"{path}: patient_pattern {patient_pattern!r} does not match every path")
        groups["patient"], _ = codes([m.group(1) for m in found])  # type: ignore[union-attr]
    split = None
    if split_column and split_column in header:
        split = np.array([r[split_column].strip().lower() for r in rows])
        bad = sorted(set(split) - {"train", "test"})
        if bad:
            raise DataFileError(f"{path}: split values must be train or test, found {bad}")
    base = Path(image_root) if image_root is not None else path.parent
    x = load_images([base / r[path_column] for r in rows], image_size, mode)
    if len(labels) == 1:
        target, num_classes = y[:, 0].astype(np.int64), int(y.max()) + 1
        if target.min() < 0:
            raise DataFileError(f"{path}: class labels must be ≥ 0")
    else:
        target, num_classes = y.astype(np.float32), len(labels)
    return ManifestTable(x, target, num_classes, groups, tuple(labels), split)


def read_manifest(
    csv_path: str | Path, *, test_fraction: float = TEST_FRACTION, name: str = "manifest", **kwargs
) -> LabeledData:
    """A CSV of image paths and labels (CheXpert-style).

    One label column: integer classes (an uncertain -1 follows ``uncertain``).
    Several: multi-label ``y`` of shape ``[N, L]``; ``uncertain`` (one policy, or
    one per column) maps -1 to 1 (``ones``), 0 (``zeros``), or drops the row
    (``ignore``: a row with an uncertain label among the label columns is left
    out); a blank label is 0 (CheXpert: not mentioned). Optional columns:
    ``split`` (train/test; otherwise a fixed split, by patient when known),
    ``source`` (site, for ``partition='source'``), ``patient`` (for the
    patient-disjoint ``partition='patient'``); ``patient_pattern`` extracts the
    patient id from the path with a regex group when there is no patient column.
    Keyword arguments are those of :func:`read_manifest_table`.
    """
    t = read_manifest_table(csv_path, name=name, **kwargs)
    if t.split is None:
        return split_labeled(name, t.x, t.y, t.num_classes, t.groups, test_fraction, t.label_names)
    tr, te = t.split == "train", t.split == "test"
    if not tr.any() or not te.any():
        raise DataFileError(f"{csv_path}: the split column needs both train and test rows")
    return LabeledData(
        name, t.x[tr], t.y[tr], t.x[te], t.y[te], t.num_classes,
        groups_train={k: v[tr] for k, v in t.groups.items()}, label_names=t.label_names,
    )  # fmt: skip


def read_manifest_dir(data_dir: str | Path | None, **kwargs) -> LabeledData:
    """``<data_dir>/manifest.csv`` with the reserved column names (see :func:`read_manifest`)."""
    root = require_dir(data_dir, kwargs.get("name", "manifest"), MANIFEST_LAYOUT)
    return read_manifest(root / "manifest.csv", **kwargs)


CHEXPERT_LABELS = ("Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion")
# U-Ones where CheXpert's authors found it best (Atelectasis, Edema), U-Zeros elsewhere
CHEXPERT_UNCERTAIN = {
    "Cardiomegaly": "zeros", "Edema": "ones", "Consolidation": "zeros",
    "Atelectasis": "ones", "Pleural Effusion": "zeros",
}  # fmt: skip
CHEXPERT_LAYOUT = (
    "  <data_dir>/train.csv and <data_dir>/valid.csv (CheXpert-v1.0 or -small), columns Path, …,\n"
    "  Cardiomegaly, Edema, Consolidation, Atelectasis, Pleural Effusion; Path relative to <data_dir>\n"
    "  or to its parent (CheXpert-v1.0-small/train/patient00001/study1/view1_frontal.jpg)"
)


def read_chexpert(
    data_dir: str | Path | None,
    image_size: int | None = 224,
    uncertain: str | Mapping[str, str] = CHEXPERT_UNCERTAIN,
    mode: str = "RGB",
) -> LabeledData:
    """CheXpert: five competition findings, multi-label; test = the official validation set."""
    root = require_dir(data_dir, "chexpert", CHEXPERT_LAYOUT)
    for csv_name in ("train.csv", "valid.csv"):
        if not (root / csv_name).is_file():
            raise MissingDataError(f"chexpert: {root / csv_name} not found; expected:\n{CHEXPERT_LAYOUT}")
    with open(root / "train.csv", newline="") as f:
        first = next(csv.DictReader(f), {}).get("Path", "")
    image_root = root if (root / first).is_file() else root.parent
    tables = [
        read_manifest_table(
            root / csv_name, image_root=image_root, path_column="Path", label_columns=CHEXPERT_LABELS,
            uncertain=uncertain, image_size=image_size, mode=mode, split_column=None, source_column=None,
            patient_column=None, patient_pattern=r"(patient\d+)", name="chexpert",
        )
        for csv_name in ("train.csv", "valid.csv")
    ]  # fmt: skip
    train, valid = tables
    return LabeledData(
        "chexpert", train.x, train.y, valid.x, valid.y, len(CHEXPERT_LABELS),
        groups_train=train.groups, label_names=CHEXPERT_LABELS,
    )  # fmt: skip


CHESTXRAY_IH_LAYOUT = (
    "  <data_dir>/manifest.csv with columns path, source, patient, Cardiomegaly, Edema,\n"
    "  Consolidation, Atelectasis, Pleural Effusion [, split]; one source per organization\n"
    "  (CheXpert, ChestX-ray14, PadChest, MIMIC-CXR, VinDr); without split, 5% of each\n"
    "  source's patients form the test set"
)


def read_chestxray_ih(
    data_dir: str | Path | None, image_size: int | None = 224, mode: str = "RGB"
) -> LabeledData:
    """The CODASCA paper's ChestXray-IH: five sources, five findings, patient-disjoint splits."""
    root = require_dir(data_dir, "chestxray_ih", CHESTXRAY_IH_LAYOUT)
    if not (root / "manifest.csv").is_file():
        raise MissingDataError(
            f"chestxray_ih: {root / 'manifest.csv'} not found; expected:\n{CHESTXRAY_IH_LAYOUT}"
        )
    data = read_manifest(root / "manifest.csv", label_columns=CHEXPERT_LABELS, uncertain=CHEXPERT_UNCERTAIN,
                         image_size=image_size, mode=mode, test_fraction=0.05, name="chestxray_ih")  # fmt: skip
    for key in ("source", "patient"):
        if key not in data.groups_train:
            raise DataFileError(
                f"chestxray_ih: manifest.csv needs a {key!r} column; expected:\n{CHESTXRAY_IH_LAYOUT}"
            )
    return data

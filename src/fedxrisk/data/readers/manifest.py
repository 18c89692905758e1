"""CSV manifests of image files (CheXpert-style), CheXpert itself and the CODASCA paper's ChestXray-IH.

Label values: 1 positive, 0 or blank negative, -1 uncertain (mapped by a policy).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedxrisk.data.checks import outside, read_text
from fedxrisk.data.readers.base import (
    RESERVED_COLUMNS,
    DataFileError,
    MissingDataError,
    codes,
    require_dir,
    split_labeled,
)
from fedxrisk.data.readers.images import load_images
from fedxrisk.data.registry import register
from fedxrisk.data.types import TEST_FRACTION, LabeledData

UNCERTAIN_POLICIES = ("ones", "zeros", "ignore")
MANIFEST_LAYOUT = (
    "  <data_dir>/manifest.csv with a header: path,<label>[,<label>…][,split][,source][,patient]\n"
    "  path: image path relative to the CSV's folder; one label column = classes (ids or names),\n"
    "  several = multi-label (1 positive, 0 or blank negative, -1 uncertain); split: train|test"
)


def apply_uncertain(values: np.ndarray, policy: str) -> np.ndarray:
    """Map CheXpert's uncertain label -1 to 1 (``ones``), 0 (``zeros``) or NaN (``ignore``)."""
    if policy not in UNCERTAIN_POLICIES:
        raise ValueError(f"uncertain-label policy must be one of {UNCERTAIN_POLICIES}, got {policy!r}")
    out = values.astype(np.float64)
    out[values == -1] = {"ones": 1.0, "zeros": 0.0, "ignore": np.nan}[policy]
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _class_names(rows: list[dict[str, str]], column: str, path: Path) -> list[str] | None:
    """The sorted class names of a single label column holding words (``lesion``, ``normal``), else None."""
    values = [(r[column] or "").strip() for r in rows]
    words = [v for v in values if v and not _is_number(v)]  # "nan", "inf", "1e3" are numbers: checked as such
    if not words:
        return None
    if "" in values:
        raise DataFileError(f"{path}: column {column!r} holds class names and blanks; name every row's class")
    return sorted(set(values))


def _parse_label(raw: str, where: str, names: list[str] | None = None) -> float:
    text = raw.strip()
    if names is not None:
        return float(names.index(text))
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
    source_names: tuple[str, ...] = ()  # the source column's values, in source-id order


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
    names = _class_names(rows, labels[0], path) if len(labels) == 1 else None
    raw = np.array(
        [[_parse_label(r[c] or "", f"{path} row {i + 2}", names) for c in labels] for i, r in enumerate(rows)]
    )
    policies = uncertain if isinstance(uncertain, Mapping) else {c: uncertain for c in labels}
    y = np.stack([apply_uncertain(raw[:, j], policies.get(c, "ones")) for j, c in enumerate(labels)], axis=1)
    keep = ~np.isnan(y).any(axis=1)
    rows, y = [r for r, k in zip(rows, keep) if k], y[keep]
    if not rows:
        raise DataFileError(f"{path}: no rows left after the uncertain-label policy {uncertain!r}")
    groups: dict[str, np.ndarray] = {}
    sites: tuple[str, ...] = ()
    if source_column and source_column in header:
        groups["source"], names_of_sources = codes([r[source_column] for r in rows])
        sites = tuple(names_of_sources)
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
    strays = outside(base, [base / r[path_column] for r in rows])
    if strays:
        raise DataFileError(
            f"{path}: {len(strays)} image path(s) outside the folder {str(base)!r} (first: "
            f"{str(strays[0])!r}); a manifest names images inside its data folder"
        )
    if split is not None:
        _refuse_shared_images(path, [base / r[path_column] for r in rows], split)
    x = load_images([base / r[path_column] for r in rows], image_size, mode)
    if len(labels) == 1:
        target, num_classes = y[:, 0].astype(np.int64), int(y.max()) + 1
        if target.min() < 0:
            raise DataFileError(f"{path}: class labels must be ≥ 0")
        classes = tuple(names) if names else tuple(str(c) for c in range(num_classes))
        return ManifestTable(x, target, max(num_classes, len(classes)), groups, classes, split, sites)
    return ManifestTable(x, y.astype(np.float32), len(labels), groups, tuple(labels), split, sites)


def _refuse_shared_images(path: Path, files: Sequence[Path], split: np.ndarray) -> None:
    """Refuse a manifest whose train and test rows name the same image file (a test-set leak)."""
    import os

    names = [os.path.normpath(f) for f in files]
    train = {n for n, s in zip(names, split) if s == "train"}
    shared = sorted({n for n, s in zip(names, split) if s == "test" and n in train})
    if shared:
        shown = ", ".join(os.path.relpath(n, path.parent) for n in shared[:3])
        raise DataFileError(
            f"{path}: {len(shared)} image(s) in both the train and the test split ({shown}"
            f"{', …' if len(shared) > 3 else ''}); a test image seen in training inflates every metric"
        )


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
        data = split_labeled(name, t.x, t.y, t.num_classes, t.groups, test_fraction, t.label_names)
        data.source_names = t.source_names
        return data
    tr, te = t.split == "train", t.split == "test"
    if not tr.any() or not te.any():
        raise DataFileError(f"{csv_path}: the split column needs both train and test rows")
    return LabeledData(
        name, t.x[tr], t.y[tr], t.x[te], t.y[te], t.num_classes,
        groups_train={k: v[tr] for k, v in t.groups.items()}, label_names=t.label_names,
        groups_test={k: v[te] for k, v in t.groups.items()}, source_names=t.source_names,
    )  # fmt: skip


@register("manifest", files=True)  # <data_dir>/manifest.csv, 224×224 RGB
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


@register("chexpert", files=True)
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


@register("chestxray_ih", files=True)
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

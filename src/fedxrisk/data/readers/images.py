"""Image files on disk: class-per-subfolder trees and per-site trees (CSV manifests: :mod:`.manifest`).

Images are decoded with Pillow (``pip install fedxrisk[images]``), converted to
RGB (or L) and resized to ``image_size`` × ``image_size``; the whole set is held
in memory as float32 in [0, 1] (N × C × S × S × 4 bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedxrisk.data.decode import load_image
from fedxrisk.data.lazy import ImageFiles, LazySamples, reading_lazily, uint8_images
from fedxrisk.data.readers.base import (  # noqa: F401  (RESERVED_COLUMNS re-exported)
    RESERVED_COLUMNS,
    DataFileError,
    MissingDataError,
    require_dir,
    split_labeled,
)
from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".ppm", ".pgm"}
FOLDER_LAYOUT = (
    "  <data_dir>/train/<class>/<image>  and  <data_dir>/test/<class>/<image>\n"
    "  or <data_dir>/<class>/<image> (then split 70/30, stratified, fixed seed);\n"
    "  class ids follow the sorted subfolder names"
)
SITES_LAYOUT = (
    "  <data_dir>/<site>/<class>/<image>  or  <data_dir>/<site>/{train,test}/<class>/<image>\n"
    "  one client per site with partition='source'"
)
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
    return uint8_images(np.stack(arrays))


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


@register("folder", files=True)  # CATvsDOG, Melanoma-style class folders (32×32 RGB)
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


@register("sites", files=True)  # one folder per hospital/site
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
        groups_test={"source": np.concatenate([np.full(len(p[2]), p[0]) for p in parts]).astype(np.int64)},
        source_names=tuple(s.name for s in sites),
    )

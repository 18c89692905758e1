"""MedMNIST 2D archives as the ``medmnist`` package stores them, with the official validation split.

One ``.npz`` per dataset (``breastmnist.npz``, ``chestmnist.npz``, …) holding
``{train,val,test}_images`` (uint8 ``[N, H, W]`` grey or ``[N, H, W, 3]`` RGB) and
``{train,val,test}_labels`` (``[N, 1]`` class ids, or ``[N, L]`` 0/1 for the multi-label
sets such as ChestMNIST's 14 findings). The validation split becomes
``LabeledData.x_val``/``y_val``: never merged into training or test.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from fedxrisk.data.checks import check_class_ids, check_integer_labels
from fedxrisk.data.lazy import uint8_images
from fedxrisk.data.readers.base import DataFileError, MissingDataError, require_dir
from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData

SPLITS = ("train", "val", "test")
MEDMNIST_KEYS = tuple(f"{s}_{k}" for s in SPLITS for k in ("images", "labels"))
MEDMNIST_LAYOUT = (
    "  data_dir = a MedMNIST .npz file (e.g. breastmnist.npz) or a folder holding exactly one,\n"
    "  with arrays train_images, train_labels, val_images, val_labels, test_images, test_labels;\n"
    "  images uint8 [N, H, W] (grey) or [N, H, W, 3] (RGB); labels [N, 1] class ids or [N, L] 0/1 (multi-label)"
)


def medmnist_file(data_dir: str | Path | None) -> Path:
    """The archive: ``data_dir`` itself, or the one ``.npz`` in the folder ``data_dir``."""
    root = require_dir(data_dir, "medmnist", MEDMNIST_LAYOUT)
    if root.is_file():
        return root
    found = sorted(root.glob("*.npz"))
    if len(found) != 1:
        names = f" ({', '.join(p.name for p in found)})" if found else ""
        raise MissingDataError(
            f"medmnist: {root} holds {len(found)} .npz files{names}; set data_dir to the file; "
            f"expected:\n{MEDMNIST_LAYOUT}"
        )
    return found[0]


def _arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        reason = "empty file" if path.stat().st_size == 0 else e
        raise DataFileError(
            f"{path}: not a readable .npz archive ({reason}); expected:\n{MEDMNIST_LAYOUT}"
        ) from None
    missing = [k for k in MEDMNIST_KEYS if k not in arrays]
    if missing:
        raise DataFileError(
            f"{path}: missing array(s) {missing} (has {sorted(arrays)}); expected:\n{MEDMNIST_LAYOUT}"
        )
    return arrays


def _images(x: np.ndarray, where: str) -> np.ndarray:
    """uint8 ``[N, C, H, W]`` from ``[N, H, W]`` or ``[N, H, W, C]`` (C = 1 or 3)."""
    if x.dtype != np.uint8:
        raise DataFileError(f"{where}: images must be uint8 (0-255), found {x.dtype}")
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4 and x.shape[-1] in (1, 3):
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    raise DataFileError(
        f"{where}: images must be [N, H, W] (grey) or [N, H, W, 3] (RGB), got shape {x.shape}"
    )


def _labels(y: np.ndarray, count: int, where: str) -> np.ndarray:
    """``[N, L]`` integer labels for ``count`` images (``[N]`` is read as ``[N, 1]``)."""
    y = y[:, None] if y.ndim == 1 else y
    if y.ndim != 2 or len(y) != count or y.shape[1] == 0:
        raise DataFileError(
            f"{where}: labels must be [N, 1] class ids or [N, L] 0/1 multi-label for the {count} images, "
            f"got shape {y.shape}"
        )
    check_integer_labels(y.ravel(), where)
    return y


@register("medmnist", files=True)
def read_medmnist(data_dir: str | Path | None) -> LabeledData:
    """A MedMNIST 2D ``.npz`` (see :data:`MEDMNIST_LAYOUT`): train, official validation and test splits.

    ``[N, 1]`` labels are class ids (binary tasks: ``data.positive_classes``); ``[N, L]`` with
    L > 1 are L binary findings (multi-label, kept as they are)."""
    path = medmnist_file(data_dir)
    arrays = _arrays(path)
    x, y = {}, {}
    for s in SPLITS:
        x[s] = _images(arrays[f"{s}_images"], f"{path}: {s}_images")
        if len(x[s]) == 0:
            raise DataFileError(f"{path}: {s}_images holds no images")
        y[s] = _labels(arrays[f"{s}_labels"], len(x[s]), f"{path}: {s}_labels")
    shapes = {s: x[s].shape[1:] for s in SPLITS}
    if len(set(shapes.values())) > 1:
        raise DataFileError(f"{path}: images differ in shape between splits {shapes}; they must match")
    widths = {s: y[s].shape[1] for s in SPLITS}
    if len(set(widths.values())) > 1:
        raise DataFileError(f"{path}: label columns differ between splits {widths}; they must match")
    if widths["train"] == 1:
        y = {s: v[:, 0].astype(np.int64) for s, v in y.items()}
        check_class_ids({f"{path}: {s}_labels": v for s, v in y.items()})
        num_classes = int(max(v.max() for v in y.values())) + 1
    else:
        for s, v in y.items():
            if not np.isin(v, (0, 1)).all():
                raise DataFileError(f"{path}: {s}_labels has {v.shape[1]} columns (multi-label) but values "
                                    f"other than 0/1 ({sorted(set(np.unique(v).tolist()) - {0, 1})[:5]})")  # fmt: skip
        y = {s: v.astype(np.float32) for s, v in y.items()}
        num_classes = widths["train"]
    images = {s: uint8_images(x[s], f"{path.name}:{s}_images") for s in SPLITS}
    return LabeledData(
        path.stem, images["train"], y["train"], images["test"], y["test"], num_classes,
        x_val=images["val"], y_val=y["val"],
    )  # fmt: skip

"""CIFAR-10 / CIFAR-100 "python version" archives (pickled batches), read without torchvision.

Accepted ``data_dir`` layouts (the archive as downloaded, or extracted)::

    cifar-10-python.tar.gz                  or  cifar-10-batches-py/data_batch_1 … test_batch
    cifar-100-python.tar.gz                 or  cifar-100-python/train, test

``data_dir`` may be the archive itself, the extracted folder, or a folder holding
either. Batches are unpickled with a restricted unpickler that only builds
NumPy arrays (a pickle can otherwise run code).
"""

from __future__ import annotations

import io
import pickle
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.data.lazy import uint8_images
from fedxrisk.data.readers.base import DataFileError, MissingDataError, require_dir
from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData

CIFAR10_LAYOUT = (
    "  <data_dir>/cifar-10-python.tar.gz  (the archive from https://www.cs.toronto.edu/~kriz/cifar.html)\n"
    "  or <data_dir>/cifar-10-batches-py/{data_batch_1, …, data_batch_5, test_batch}"
)
CIFAR100_LAYOUT = "  <data_dir>/cifar-100-python.tar.gz\n  or <data_dir>/cifar-100-python/{train, test}"
_ALLOWED = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("_codecs", "encode"),  # bytes pickled by Python 3 with protocol 2
}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def _unpickle(raw: bytes, where: str) -> dict[str, Any]:
    try:
        obj = _ArrayUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as e:  # pickle raises many types on garbage input
        raise DataFileError(f"{where}: not a CIFAR python batch ({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict):
        raise DataFileError(f"{where}: expected a pickled dict, got {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _members(root: Path, folder: str, archive: str, layout: str, dataset: str) -> dict[str, bytes]:
    """Batch name → raw bytes, from an extracted folder or from the .tar.gz archive."""
    candidates = [root / folder, root] if root.is_dir() else []
    for d in candidates:
        files = {p.name: p for p in d.iterdir() if p.is_file()} if d.is_dir() else {}
        if "test_batch" in files or "test" in files:
            return {name: p.read_bytes() for name, p in files.items()}
    tar_path = root if root.is_file() else root / archive
    if not tar_path.is_file():
        raise MissingDataError(f"{dataset}: no batches or archive under {root}; expected:\n{layout}")
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            out = {}
            for m in tar.getmembers():
                if m.isfile() and Path(m.name).parent.name == folder:
                    f = tar.extractfile(m)
                    if f is not None:
                        out[Path(m.name).name] = f.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataFileError(f"{tar_path}: not a readable tar archive ({e}); expected:\n{layout}") from e
    if not out:
        raise DataFileError(f"{tar_path}: holds no {folder}/ batches; expected:\n{layout}")
    return out


def _batch_arrays(batch: dict[str, Any], label_key: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    if "data" not in batch or label_key not in batch:
        raise DataFileError(f"{where}: batch lacks 'data' or {label_key!r} (keys: {sorted(batch)})")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
        raise DataFileError(
            f"{where}: 'data' must be uint8 [N, 3072] with N labels; got {data.shape} and {len(labels)} labels"
        )
    return data.reshape(-1, 3, 32, 32), labels


def _read(
    data_dir: str | Path | None, dataset: str, folder: str, archive: str, layout: str,
    train_names: list[str], label_key: str, num_classes: int,
) -> LabeledData:  # fmt: skip
    root = require_dir(data_dir, dataset, layout)
    files = _members(root, folder, archive, layout, dataset)
    train_names = [n for n in train_names if n in files] if dataset == "cifar10" else train_names
    missing = [n for n in (*train_names, "test" if dataset == "cifar100" else "test_batch") if n not in files]
    if not train_names or missing:
        raise MissingDataError(
            f"{dataset}: missing batch(es) {missing or train_names} in {root}; expected:\n{layout}"
        )
    test_name = "test" if dataset == "cifar100" else "test_batch"
    parts = [_batch_arrays(_unpickle(files[n], f"{root}:{n}"), label_key, n) for n in train_names]
    x_test, y_test = _batch_arrays(_unpickle(files[test_name], f"{root}:{test_name}"), label_key, test_name)
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    for y, split in ((y_train, "train"), (y_test, "test")):
        if y.min() < 0 or y.max() >= num_classes:
            raise DataFileError(f"{dataset}: {split} labels must lie in 0..{num_classes - 1}")
    return LabeledData(dataset, uint8_images(x_train), y_train, uint8_images(x_test), y_test, num_classes)


def _batch_number(name: str) -> int:
    return int(re.sub(r"\D", "", name) or 0)


@register("cifar10", files=True)
def read_cifar10(data_dir: str | Path | None) -> LabeledData:
    """CIFAR-10: 3×32×32 images in [0, 1], classes 0–9; every ``data_batch_N`` present is read."""
    names = sorted((f"data_batch_{i}" for i in range(1, 6)), key=_batch_number)
    return _read(data_dir, "cifar10", "cifar-10-batches-py", "cifar-10-python.tar.gz", CIFAR10_LAYOUT,
                 names, "labels", 10)  # fmt: skip


@register("cifar100", files=True)
def read_cifar100(data_dir: str | Path | None) -> LabeledData:
    """CIFAR-100 with its 100 fine labels, 3×32×32 images in [0, 1]."""
    return _read(data_dir, "cifar100", "cifar-100-python", "cifar-100-python.tar.gz", CIFAR100_LAYOUT,
                 ["train"], "fine_labels", 100)  # fmt: skip

"""Raw binary image formats: STL-10 ``.bin`` files and MNIST/FashionMNIST IDX files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedxrisk.data.checks import check_features
from fedxrisk.data.decode import read_bytes
from fedxrisk.data.lazy import uint8_images
from fedxrisk.data.readers.base import DataFileError, find_file, require_dir
from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData

STL10_LAYOUT = (
    "  <data_dir>/stl10_binary/{train_X.bin, train_y.bin, test_X.bin, test_y.bin}\n"
    "  (or the four files directly in <data_dir>); X: uint8 3×96×96 column-major, y: uint8 1..10"
)
STL_SIDE = 96


def _stl_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    roots = [root / "stl10_binary", root]
    x_path = find_file(roots, [f"{split}_X.bin"], "stl10", STL10_LAYOUT)
    y_path = find_file(roots, [f"{split}_y.bin"], "stl10", STL10_LAYOUT)
    raw = np.frombuffer(read_bytes(x_path), dtype=np.uint8)
    per_image = 3 * STL_SIDE * STL_SIDE
    if raw.size == 0 or raw.size % per_image:
        raise DataFileError(
            f"{x_path}: size {raw.size} is not a multiple of 3×96×96 = {per_image}; expected:\n{STL10_LAYOUT}"
        )
    # each image is stored channel by channel, each channel column-major: transpose H and W
    x = raw.reshape(-1, 3, STL_SIDE, STL_SIDE).transpose(0, 1, 3, 2)
    y = np.frombuffer(read_bytes(y_path), dtype=np.uint8).astype(np.int64)
    if len(y) != len(x):
        raise DataFileError(f"{y_path}: {len(y)} labels for {len(x)} images in {x_path.name}")
    if len(y) and (y.min() < 1 or y.max() > 10):
        raise DataFileError(f"{y_path}: STL-10 labels must lie in 1..10, found {y.min()}..{y.max()}")
    return uint8_images(np.ascontiguousarray(x)), y - 1


@register("stl10", files=True)
def read_stl10(data_dir: str | Path | None) -> LabeledData:
    """STL-10 labelled splits (5000 train / 8000 test): 3×96×96 images in [0, 1], classes 0–9."""
    root = require_dir(data_dir, "stl10", STL10_LAYOUT)
    x_train, y_train = _stl_split(root, "train")
    x_test, y_test = _stl_split(root, "test")
    return LabeledData("stl10", x_train, y_train, x_test, y_test, 10)


IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (gzipped or not): magic 0 0 <dtype> <ndim>, big-endian int32 dims, data."""
    raw = read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise DataFileError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataFileError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw[4:header], dtype=">i4"))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataFileError(
            f"{path}: IDX header announces shape {dims} ({expected} bytes) but {len(raw) - header} bytes follow"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def _idx_layout(name: str) -> str:
    return (
        f"  <data_dir>/{{train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,"
        f" t10k-labels-idx1-ubyte}}[.gz]\n  (also found under <data_dir>/raw or <data_dir>/{name}/raw, torchvision's layout)"
    )


def _read_idx_dataset(data_dir: str | Path | None, name: str, folder: str) -> LabeledData:
    layout = _idx_layout(folder)
    root = require_dir(data_dir, name, layout)
    roots = [root, root / "raw", root / folder / "raw", root / folder]
    arrays = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        for kind, suffix in (("x", "images-idx3-ubyte"), ("y", "labels-idx1-ubyte")):
            stem = f"{prefix}-{suffix}"
            path = find_file(roots, [stem, stem + ".gz"], name, layout)
            arrays[kind + split] = read_idx(path)
            if kind == "x" and arrays[kind + split].ndim == 3:
                check_features(arrays[kind + split], str(path))
    for split in ("train", "test"):
        x, y = arrays["x" + split], arrays["y" + split]
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise DataFileError(
                f"{name}: {split} images must be [N, H, W] with N labels; got {x.shape}, {y.shape}"
            )
        if len(y) and (y.min() < 0 or y.max() > 9):
            raise DataFileError(f"{name}: {split} labels must lie in 0..9")
    return LabeledData(
        name,
        uint8_images(arrays["xtrain"][:, None]),
        arrays["ytrain"].astype(np.int64),
        uint8_images(arrays["xtest"][:, None]),
        arrays["ytest"].astype(np.int64),
        10,
    )


@register("mnist", files=True)
def read_mnist(data_dir: str | Path | None) -> LabeledData:
    """MNIST IDX files: 1×28×28 images in [0, 1], digits 0–9."""
    return _read_idx_dataset(data_dir, "mnist", "MNIST")


@register("fashionmnist", files=True)
def read_fashion_mnist(data_dir: str | Path | None) -> LabeledData:
    """FashionMNIST IDX files (same layout as MNIST): 1×28×28 images in [0, 1], classes 0–9."""
    return _read_idx_dataset(data_dir, "fashionmnist", "FashionMNIST")

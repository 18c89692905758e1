"""Decoders: bytes on disk to NumPy arrays (one image, a gzipped file, a ``.npy`` member of an ``.npz``).

Below the lazy layer: :mod:`fedxrisk.data.lazy` decodes samples with these, and the
readers use them to read whole files. Every error names the file.
"""

from __future__ import annotations

import gzip
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from fedxrisk.errors import DataFileError, MissingDataError


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


def images_to_float(x: np.ndarray) -> np.ndarray:
    """uint8 images → float32 in [0, 1]."""
    return (x.astype(np.float32) / 255.0).astype(np.float32)


def read_bytes(path: Path) -> bytes:
    """File contents, transparently gunzipped when the name ends in ``.gz``."""
    try:
        return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise DataFileError(f"{path}: cannot read ({e})") from None


def npy_header(f: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of the ``.npy`` stream ``f``, left at the first data byte."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


def npz_member(path: Path, key: str) -> np.ndarray:
    """Array ``key`` of an ``.npz``: memory-mapped when stored uncompressed (``np.savez``),
    else read into memory (``np.savez_compressed`` members cannot be mapped)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(f"{key}.npy")
        if info.compress_type == zipfile.ZIP_STORED:
            with open(path, "rb") as f:
                f.seek(info.header_offset)
                local = f.read(30)
                name_len = int.from_bytes(local[26:28], "little")
                extra_len = int.from_bytes(local[28:30], "little")
                start = info.header_offset + 30 + name_len + extra_len
                f.seek(start)
                shape, fortran, dtype = npy_header(f)
                offset = f.tell()
            if not dtype.hasobject:
                order = "F" if fortran else "C"
                return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)
    with np.load(path, allow_pickle=False) as z:
        return z[key]

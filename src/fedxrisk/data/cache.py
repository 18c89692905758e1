"""A cache of decoded, resized images on local disk (``data.cache``): one memory-mapped file per image set.

Streaming decodes every sampled image file again, epoch after epoch; for a small
model the PNG decode costs as much as the training step. With ``data.cache`` set,
each image set (an :class:`~fedxrisk.data.lazy.ImageFiles` source: a folder's
files, a manifest's rows) is decoded **once**, up front, into one file of uint8
pixels ``[N, C, S, S]`` at the run's image size, and the stream then reads that
file through :class:`numpy.memmap` (opened read-only in each process, DataLoader
workers included): a page read instead of a decode. The pages are file-backed, so
the operating system may drop them under memory pressure; the cache adds no
anonymous memory. Scaling to [0, 1] happens on read exactly as
:meth:`ImageFiles.decode` does it, and normalization (the model's input hook) and
augmentation come after, so a cached run's numbers are the uncached run's.

File (``images-<key>.u8`` in the cache folder; ``key`` hashes the absolute file
paths in order, the image size, mode and shape)::

    magic (8 bytes) | zero padding to DATA_OFFSET | pixels N×C×S×S uint8
    | trailer: JSON {"fingerprint", "shape", "bad"} | trailer length (8 bytes LE) | end magic (8 bytes)

``fingerprint`` also covers every file's size and modification time: a cache whose
fingerprint, shape or length differs (files changed, a truncated copy, an
interrupted write) is rebuilt, never trusted. The file is written through
``NAME.tmp``, fsync and a rename (:func:`fedxrisk.outfiles.replace_atomic`) under an
exclusive lock on the folder, so concurrent runs (``torchrun`` ranks) build it once.
Files that cannot be decoded are recorded in ``bad`` and raise the reader's error
when sampled, so ``data.on_bad_file`` acts as without the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.data.lazy import ImageFiles, LazySamples
from fedxrisk.errors import ConfigError, DataFileError
from fedxrisk.outfiles import make_folder, replace_atomic

FORMAT = 1
MAGIC, END = b"FXRIMGC1", b"FXRIMGE1"
DATA_OFFSET = 64  # pixels start here (8 bytes of magic, then zeros)
CHUNK_BYTES = 32 * 2**20  # decoded pixels per chunk of the building pass
TRAILER_SLACK = 2**20  # room counted for the trailer when checking free space
CACHE_ENV = "FEDXRISK_CACHE_DIR"


def cache_folder(setting: bool | str) -> Path | None:
    """Where ``data.cache`` keeps its files: None (``false``), the folder given, or (``true``)
    ``$FEDXRISK_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedxrisk/images``, else ``~/.cache/fedxrisk/images``."""
    if setting is False:
        return None
    if setting is True:
        if os.environ.get(CACHE_ENV):
            return Path(os.environ[CACHE_ENV]).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base).expanduser() / "fedxrisk" / "images"
    return Path(setting).expanduser()


def cache_key(files: ImageFiles) -> str:
    """The cache file's name: the absolute file list in order and the preprocessing."""
    h = hashlib.sha256(json.dumps([FORMAT, files.image_size, files.mode, list(files.sample_shape)]).encode())
    for p in files.paths:
        h.update(os.path.abspath(p).encode() + b"\0")
    return f"images-{h.hexdigest()[:32]}.u8"


def fingerprint(files: ImageFiles, key: str) -> str:
    """The key plus every file's size and modification time (a changed file changes it)."""
    h = hashlib.sha256(key.encode())
    for p in files.paths:
        st = os.stat(p)
        h.update(f"{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class CachedImages:
    """The images of an :class:`ImageFiles` source read from a cache file (same ``decode`` values)."""

    def __init__(self, path: Path, files: ImageFiles, bad: dict[int, str]):
        self.path, self.paths, self.bad = path, files.paths, bad
        self.image_size, self.mode = files.image_size, files.mode
        self.sample_shape: tuple[int, ...] = tuple(files.sample_shape)
        self._map: np.memmap | None = None
        self._pid = 0

    def __len__(self) -> int:
        return len(self.paths)

    def pixels(self) -> np.memmap:
        """The uint8 ``[N, C, S, S]`` array, mapped read-only once per process."""
        if self._map is None or self._pid != os.getpid():
            self._map = np.memmap(
                self.path, np.uint8, "r", DATA_OFFSET, (len(self.paths), *self.sample_shape)
            )
            self._pid = os.getpid()
        return self._map

    def decode(self, i: int) -> np.ndarray:
        if i in self.bad:
            raise DataFileError(self.bad[i])
        return self.pixels()[i].astype(np.float32) / np.float32(255.0)

    def decode_many(self, rows: np.ndarray) -> np.ndarray | None:
        """Samples at ``rows`` (any shape) in one read, as :meth:`decode` gives them; None when one
        of them is a file that could not be decoded (the caller then applies ``on_bad_file``)."""
        if self.bad and np.isin(rows, list(self.bad)).any():
            return None
        flat = self.pixels()[np.asarray(rows, dtype=np.int64).ravel()]
        return (flat.astype(np.float32) / np.float32(255.0)).reshape(*np.shape(rows), *self.sample_shape)

    def identifier(self, i: int) -> str:
        return self.paths[i]

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker maps the file itself
        return {**self.__dict__, "_map": None, "_pid": 0}


# -- reading and checking a cache file -------------------------------------------------------------
def read_trailer(path: Path, fingerprint: str, shape: tuple[int, ...]) -> dict[int, str] | None:
    """The bad rows of a complete, current cache file; None when it is missing, truncated or stale."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(8) != MAGIC or size < DATA_OFFSET + 16:
                return None
            f.seek(size - 16)
            length, end = struct.unpack("<Q", f.read(8))[0], f.read(8)
            pixels = int(np.prod(shape, dtype=np.int64))
            if end != END or size != DATA_OFFSET + pixels + length + 16:
                return None
            f.seek(DATA_OFFSET + pixels)
            trailer = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return None
    if trailer.get("fingerprint") != fingerprint or trailer.get("shape") != list(shape):
        return None
    return {int(k): str(v) for k, v in trailer.get("bad", {}).items()}


# -- building ------------------------------------------------------------------------------------
class _Chunks:
    """Map-style dataset: item j = (first row, uint8 pixels of a chunk, {row: error} of bad files)."""

    def __init__(self, files: ImageFiles, rows: int):
        self.files, self.rows = files, rows

    def __len__(self) -> int:
        return -(-len(self.files) // self.rows)

    def __getitem__(self, j: int) -> tuple[int, np.ndarray, dict[int, str]]:
        start = j * self.rows
        stop = min(start + self.rows, len(self.files))
        out = np.zeros((stop - start, *self.files.sample_shape), dtype=np.uint8)
        bad: dict[int, str] = {}
        for i in range(start, stop):
            try:
                out[i - start] = self.files.pixels(i)
            except (DataFileError, OSError, ValueError) as e:  # as lazy._decode_one catches them
                bad[i] = str(e)
        return start, out, bad


def _identity(item: Any) -> Any:
    return item


def _decoded_chunks(files: ImageFiles, workers: int) -> Iterator[tuple[int, np.ndarray, dict[int, str]]]:
    import torch

    per_image = max(1, int(np.prod(files.sample_shape, dtype=np.int64)))
    chunks = _Chunks(files, max(1, min(1024, CHUNK_BYTES // per_image)))
    workers = min(workers, len(chunks) - 1) if len(chunks) > 1 else 0
    loader = torch.utils.data.DataLoader(
        chunks, batch_size=None, num_workers=workers, collate_fn=_identity,
        prefetch_factor=2 if workers else None,
    )  # fmt: skip
    yield from loader


def _fmt(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def check_space(folder: Path, nbytes: int, images: int) -> None:
    """One line when ``nbytes`` do not fit in ``folder``'s free space."""
    free = shutil.disk_usage(folder).free
    if nbytes > free:
        raise ConfigError(
            f"data.cache: {images:,} decoded images need {_fmt(nbytes)} in {folder}, which has "
            f"{_fmt(free)} free; free some space, point data.cache at another folder, or set data.cache = false"
        )


def _build(path: Path, files: ImageFiles, fp: str, workers: int, why: str) -> None:
    shape = (len(files), *files.sample_shape)
    pixels = int(np.prod(shape, dtype=np.int64))
    check_space(path.parent, DATA_OFFSET + pixels + TRAILER_SLACK, len(files))
    print(f"data.cache: {why}decoding {len(files):,} images once into {path} ({_fmt(pixels)}) …",
          file=sys.stderr, flush=True)  # fmt: skip
    start = time.perf_counter()
    bad: dict[int, str] = {}

    def write(f: Any) -> None:
        f.write(MAGIC.ljust(DATA_OFFSET, b"\0"))
        for _, chunk, failed in _decoded_chunks(files, workers):  # in row order
            f.write(chunk.tobytes())
            bad.update(failed)
        trailer = json.dumps({"fingerprint": fp, "shape": list(shape), "bad": bad}).encode()
        f.write(trailer + struct.pack("<Q", len(trailer)) + END)

    replace_atomic(path, write, "wb", intact="the cache was not written")
    note = f", {len(bad)} file(s) could not be decoded" if bad else ""
    print(f"data.cache: {len(files):,} images cached in {time.perf_counter() - start:.0f} s{note}",
          file=sys.stderr, flush=True)  # fmt: skip


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (POSIX): one process builds a cache, the others then read it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def open_cache(files: ImageFiles, folder: Path, workers: int = 0) -> tuple[CachedImages, dict[str, Any]]:
    """``files`` read from their cache file in ``folder`` (built first when missing, truncated or
    stale), and what was done (for the run's summary)."""
    if isinstance(folder, Path) and folder.exists() and not folder.is_dir():
        raise ConfigError(f"data.cache: {folder} is a file, not a folder")
    make_folder(folder)
    key = cache_key(files)
    path = folder / key
    fp = fingerprint(files, key)
    shape = (len(files), *files.sample_shape)
    built = False
    with _locked(folder):
        bad = read_trailer(path, fp, shape)
        if bad is None:
            why = "" if not path.exists() else f"{path.name} is incomplete or stale: "
            _build(path, files, fp, workers, why)
            built = True
            bad = read_trailer(path, fp, shape)
            if bad is None:  # pragma: no cover - written and renamed just now
                raise DataFileError(f"data.cache: {path} could not be read back after writing it")
    nbytes = path.stat().st_size
    return CachedImages(path, files, bad), {"path": str(path), "images": len(files), "bytes": nbytes,
                                            "built": built}  # fmt: skip


def use_cache(lazy: Any, setting: bool | str, workers: int) -> list[dict[str, Any]]:
    """Give every lazy image split of ``lazy`` (a ``LabeledData``) its cached source, per
    ``data.cache``; splits sharing a source (a manifest's rows) share its cache file."""
    folder = cache_folder(setting)
    if folder is None:
        return []
    done: dict[int, tuple[ImageFiles, CachedImages]] = {}  # the source is kept: its id stays unique
    report = []
    for split in ("train", "test", "val"):
        x = getattr(lazy, f"x_{split}", None)
        if not isinstance(x, LazySamples) or not isinstance(x.source, (ImageFiles, CachedImages)):
            continue
        if isinstance(x.source, ImageFiles):
            if id(x.source) not in done:
                cached, info = open_cache(x.source, folder, workers)
                done[id(x.source)] = (x.source, cached)
                report.append(info)
            x.source = done[id(x.source)][1]
    return report

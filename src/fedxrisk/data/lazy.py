"""Lazy samples: a dataset's inputs kept on disk (or as compact raw arrays) and decoded on demand.

A :class:`LazySamples` stands where a decoded ``[N, …]`` float tensor would: it has
a ``shape``, a length, and indexing with a slice, an index array/tensor or a mask
returns another lazy view (no decoding), so readers, splits, imbalance and
partitions work on it unchanged. Decoding is explicit: :meth:`LazySamples.sample`
(one sample as float32 NumPy, what a ``DataLoader`` worker calls),
:meth:`LazySamples.decode` (a stacked tensor) and ``.to(device)`` (decode, then
move, as a tensor would). :meth:`LazySamples.identifier` names each sample (its
file path, or ``<archive>[i]``) for predictions and error messages.

A *source* does the decoding: :class:`ImageFiles` (Pillow, one file per sample),
:class:`ArraySource` (a uint8 or float array, e.g. CIFAR/STL/IDX images kept as
bytes, or a memory-mapped ``.npy`` member of an uncompressed ``.npz``). Readers
return lazy inputs inside :func:`lazy_reading` (see :mod:`fedxrisk.data.readers`).

Decoding many samples (:func:`decode_rows`) applies the ``on_bad_file`` policy: a file
that cannot be decoded raises :class:`~fedxrisk.errors.BadFileError` naming it, or is
replaced by the next readable sample with the same label. This module imports the
decoders (:mod:`fedxrisk.data.decode`), never a reader.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fedxrisk.data.decode import images_to_float, load_image, npy_header, npz_member  # noqa: F401
from fedxrisk.errors import BadFileError, DataFileError

_LAZY = contextvars.ContextVar("fedxrisk_lazy_reading", default=False)


@contextlib.contextmanager
def lazy_reading() -> Iterator[None]:
    """Within this block, file readers return :class:`LazySamples` inputs instead of decoding."""
    token = _LAZY.set(True)
    try:
        yield
    finally:
        _LAZY.reset(token)


def reading_lazily() -> bool:
    """Whether readers should return lazy inputs (inside :func:`lazy_reading`)."""
    return _LAZY.get()


class Source(Protocol):
    """Decodes sample ``i`` of a dataset (0 ≤ i < len) to float32 ``sample_shape``."""

    sample_shape: tuple[int, ...]

    def __len__(self) -> int: ...

    def decode(self, i: int) -> np.ndarray: ...

    def identifier(self, i: int) -> str: ...


class ImageFiles:
    """One image file per sample, decoded with Pillow to float32 ``[C, S, S]`` in [0, 1]."""

    def __init__(self, paths: Sequence[Path | str], image_size: int | None, mode: str = "RGB"):
        self.paths = [str(p) for p in paths]
        self.image_size, self.mode = image_size, mode
        channels = 1 if mode in ("L", "1", "I", "F") else 3
        if image_size is not None:
            self.sample_shape: tuple[int, ...] = (channels, image_size, image_size)
        elif self.paths:  # native size: the first image fixes it, every other must match
            self.sample_shape = tuple(self._read(0).shape)
        else:
            self.sample_shape = (channels, 0, 0)

    def __len__(self) -> int:
        return len(self.paths)

    def _read(self, i: int) -> np.ndarray:
        return load_image(Path(self.paths[i]), self.image_size, self.mode)

    def pixels(self, i: int) -> np.ndarray:
        """Image ``i`` as uint8 ``sample_shape`` (what :mod:`fedxrisk.data.cache` stores)."""
        raw = self._read(i)
        if raw.shape != self.sample_shape:
            raise DataFileError(
                f"{self.paths[i]}: image of shape {raw.shape}, the others {self.sample_shape}; "
                "pass image_size to resize them"
            )
        return raw

    def decode(self, i: int) -> np.ndarray:
        return self.pixels(i).astype(np.float32) / np.float32(255.0)

    def identifier(self, i: int) -> str:
        return self.paths[i]


class ArraySource:
    """Samples stored as an array (in memory or memory-mapped): ``float32(array[i]) / divisor``.

    uint8 images stay 1 byte per value until decoded (``divisor = 255``); a
    memory-mapped array is read from disk only where sampled. ``mean``/``std``
    (per feature) standardize on the fly.
    """

    def __init__(
        self,
        array: np.ndarray,
        name: str,
        divisor: float | None = None,
        mean: np.ndarray | None = None,
        std: np.ndarray | None = None,
    ):
        self.array, self.name, self.divisor = array, name, divisor
        self.mean, self.std = mean, std
        self.sample_shape = tuple(array.shape[1:])

    def __len__(self) -> int:
        return len(self.array)

    def decode(self, i: int) -> np.ndarray:
        x = np.asarray(self.array[i], dtype=np.float32)
        if self.divisor is not None:
            x = x / np.float32(self.divisor)
        if self.mean is not None:
            x = ((x - self.mean) / self.std).astype(np.float32)
        return x

    def identifier(self, i: int) -> str:
        return f"{self.name}[{i}]"


class LazySamples:
    """A lazy ``[N, *sample_shape]`` float32 array: rows ``rows`` of ``source``."""

    dtype = torch.float32

    def __init__(self, source: Source, rows: np.ndarray | None = None):
        self.source = source
        self.rows = (
            np.arange(len(source), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        )
        self.labels: np.ndarray | None = None  # per row, once attached: substitutes keep the label
        self.options: dict[str, Any] = {}  # streaming settings (workers, on_bad_file), see data.stream

    def attach(self, labels: np.ndarray | None = None, **options: Any) -> LazySamples:
        """Attach per-row labels and streaming options (kept by every view taken from this one)."""
        if labels is not None:
            self.labels = np.asarray(labels)
        self.options.update(options)
        return self

    # -- array-like ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.rows), *self.source.sample_shape)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.source.sample_shape)

    @property
    def nbytes(self) -> int:
        """Bytes the decoded float32 samples would take in memory."""
        return 4 * int(np.prod(self.shape, dtype=np.int64))

    def __getitem__(self, key: Any) -> Any:
        """An int decodes one sample (a tensor); a slice, index array/tensor or mask gives a lazy view."""
        if isinstance(key, (int, np.integer)):
            return torch.from_numpy(self.sample(int(key)))
        if isinstance(key, torch.Tensor):
            key = key.cpu().numpy()
        view = LazySamples(self.source, self.rows[key])
        view.labels = self.labels[key] if self.labels is not None else None
        view.options = dict(self.options)
        return view

    # -- decoding -----------------------------------------------------------------------------
    def sample(self, i: int) -> np.ndarray:
        """Sample ``i`` of this view, decoded (float32 NumPy)."""
        return self.source.decode(int(self.rows[i]))

    def identifier(self, i: int) -> str:
        """The file (or ``archive[row]``) sample ``i`` of this view comes from."""
        return self.source.identifier(int(self.rows[i]))

    def decode(self) -> torch.Tensor:
        """Every sample of the view, decoded in this process, as one tensor (a bad file is
        handled by the attached ``on_bad_file`` policy, see :func:`decode_rows`)."""
        x, _ = decode_rows(self, np.arange(len(self))[None], None)
        return torch.from_numpy(x[0])

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Decode, then ``Tensor.to`` (so code written for tensors keeps working)."""
        return self.decode().to(*args, **kwargs)

    def numpy(self) -> np.ndarray:
        return self.decode().numpy()

    def __repr__(self) -> str:
        return f"LazySamples({type(self.source).__name__}, shape={self.shape})"


def is_lazy(x: Any) -> bool:
    return isinstance(x, LazySamples)


def as_tensor(x: Any) -> torch.Tensor:
    """A decoded tensor: ``x`` itself, or a lazy view decoded in this process."""
    return x.decode() if isinstance(x, LazySamples) else x


def uint8_images(x: np.ndarray, name: str = "images") -> np.ndarray:
    """uint8 images → float32 in [0, 1] (inside :func:`lazy_reading`: kept as bytes, a
    :class:`LazySamples` decoding each image when sampled)."""
    if reading_lazily():
        return LazySamples(ArraySource(x, name, divisor=255.0))  # type: ignore[return-value]
    return images_to_float(x)


RESUME_ADVICE = (
    "training stopped. Replace the file and continue with `fedxrisk run --resume RUN_DIR` (the last "
    'checkpoint is kept), or run with data.on_bad_file = "skip" to replace unreadable samples'
)


def _decode_one(
    samples: LazySamples, p: int, pool: np.ndarray | None, on_bad: str, bad: list[str]
) -> np.ndarray:
    try:
        return samples.sample(p)
    except (DataFileError, OSError, ValueError) as e:
        name = samples.identifier(p)
        if on_bad != "skip":
            raise BadFileError(
                f"corrupt or unreadable data file {name} ({e})", RESUME_ADVICE, str(e)
            ) from None
        bad.append(name)
    pool = np.arange(len(samples)) if pool is None else pool
    start = int(np.flatnonzero(pool == p)[0]) if (pool == p).any() else 0
    labels = samples.labels
    for q in np.roll(pool, -start)[1:]:
        if labels is not None and not np.array_equal(labels[q], labels[p]):
            continue
        try:
            return samples.sample(int(q))
        except (DataFileError, OSError, ValueError):
            continue
    raise BadFileError(
        f"{samples.identifier(p)} cannot be decoded and no readable sample with its label replaces it"
    )


def decode_rows(
    samples: LazySamples,
    positions: np.ndarray,
    pools: Sequence[np.ndarray] | None,
    on_bad: str | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Decode ``samples`` at ``positions`` ``[K, n]`` into float32 ``[K, n, …]``.

    ``pools[k]``: where row k's replacements come from under ``on_bad = "skip"``
    (a client's shard; None: all of ``samples``). Returns the batch and the
    identifiers of the files replaced.
    """
    on_bad = on_bad or samples.options.get("on_bad_file", "error")
    many = getattr(samples.source, "decode_many", None)  # a cached source reads a batch at once
    out = many(samples.rows[positions]) if many is not None else None
    if out is not None:
        return out, []
    out = np.empty((*positions.shape, *samples.sample_shape), dtype=np.float32)
    bad: list[str] = []
    for k, row in enumerate(positions):
        pool = pools[k] if pools is not None else None
        for j, p in enumerate(row):
            out[k, j] = _decode_one(samples, int(p), pool, on_bad, bad)
    return out, bad

"""Inputs to score, read in batches without decoding them all first.

:func:`open_input` recognises the input by its form and checks it up front
(missing files, feature width, unknown format) before anything is decoded:

| input | identifier columns | rows |
|---|---|---|
| a folder of images (recursively, sorted) | ``path`` (relative to the folder) | one per image |
| a folder holding ``manifest.csv``, or a ``.csv`` with a ``path`` (or ``Path``) column | ``row``, ``path`` (+ ``id`` if present) | one per CSV row |
| an ``.npz`` (array ``x``, else ``x_test``, else its only array) | ``index`` | one per sample |
| another ``.csv``: numeric feature columns (``label``, ``source`` ignored, as in training) | ``id`` if present, else ``row`` | one per CSV row |

``row`` counts data rows from 0. Each batch holds raw inputs: images decoded as
in training (model's channels and size, [0, 1]); features as written.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.data.lazy import npy_header
from fedxrisk.data.readers.base import DataFileError
from fedxrisk.data.readers.images import IMAGE_SUFFIXES
from fedxrisk.inference import InputError

PATH_COLUMNS = ("path", "Path")
NON_FEATURES = ("label", "source", "id")  # the tabular reader uses every other column
FORMATS = "an image folder, a .csv (a manifest with a 'path' column, or numeric features), or an .npz"


@dataclass
class Batch:
    ids: list[tuple[Any, ...]]  # one identifier tuple per row, in the order of ``Input.id_columns``
    x: np.ndarray  # float32 [b, *input_shape]


@dataclass
class Input:
    """A recognised input: ``count`` rows, identified by ``id_columns``, read by ``batches``."""

    path: Path
    kind: str  # images | manifest | npz | tabular
    count: int
    id_columns: tuple[str, ...]
    rows: list[dict[str, str]] = field(default_factory=list)  # manifest: the CSV rows (labels, sites)
    _reader: Any = None

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """Consecutive batches of at most ``batch_size`` rows, in input order."""
        return self._reader(batch_size)


def open_input(path: str | Path, input_shape: tuple[int, ...], workers: int = 0) -> Input:
    """Recognise and check ``path`` for a model taking ``[*input_shape]`` inputs (see the module table).

    ``workers``: processes decoding images ahead (0: in this process)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: input not found")
    if p.is_dir():
        return (
            _manifest(p / "manifest.csv", input_shape, workers)
            if (p / "manifest.csv").is_file()
            else _folder(p, input_shape, workers)
        )
    suffix = p.suffix.lower()
    if suffix == ".npz":
        return _npz(p, input_shape)
    if suffix == ".csv":
        with open(p, newline="") as f:
            header = next(csv.reader(f), [])
        if any(c in header for c in PATH_COLUMNS):
            return _manifest(p, input_shape, workers)
        return _tabular(p, header, input_shape)
    if suffix in IMAGE_SUFFIXES:
        return _images(p.parent, [p], input_shape, "images", workers)
    raise InputError(f"{p}: unknown input format {suffix or p.name!r}; expected {FORMATS}")


def _image_geometry(input_shape: tuple[int, ...], where: Path) -> tuple[int, str]:
    """(size, PIL mode) that reproduces the training images of a model taking ``input_shape``."""
    if len(input_shape) != 3 or input_shape[0] not in (1, 3) or input_shape[1] != input_shape[2]:
        raise InputError(f"{where}: the model takes inputs of shape {list(input_shape)}, not images")
    return input_shape[1], "L" if input_shape[0] == 1 else "RGB"


def _images(
    root: Path, files: list[Path], input_shape: tuple[int, ...], kind: str, workers: int, ids=None, rows=None
) -> Input:
    """Image files decoded through :class:`~fedxrisk.data.lazy.ImageFiles` (the training readers'
    decoding), chunk by chunk in ``workers`` DataLoader processes (:func:`~fedxrisk.data.stream.input_chunks`)."""
    from fedxrisk.data.lazy import ImageFiles, LazySamples

    size, mode = _image_geometry(input_shape, root)
    samples = LazySamples(ImageFiles(files, size, mode)).attach(workers=workers)
    ids = ids if ids is not None else [(str(f.relative_to(root)),) for f in files]

    def read(batch_size: int) -> Iterator[Batch]:
        from fedxrisk.data.stream import BadFileError, input_chunks

        chunks = input_chunks(samples, batch_size)
        for i in range(0, len(files), batch_size):
            try:
                x = next(chunks)
            except BadFileError as e:  # its message speaks of training: the reader's own names the file
                raise DataFileError(e.reason) from None
            yield Batch(ids[i : i + batch_size], x.numpy())

    columns = (
        ("row", "path", *(("id",) if rows and "id" in rows[0] else ())) if kind == "manifest" else ("path",)
    )
    return Input(root, kind, len(files), columns, rows or [], read)


def _folder(root: Path, input_shape: tuple[int, ...], workers: int) -> Input:
    files = sorted(f for f in root.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise InputError(f"{root}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) and no manifest.csv")
    return _images(root, files, input_shape, "images", workers)


def _manifest(path: Path, input_shape: tuple[int, ...], workers: int) -> Input:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    column = next((c for c in PATH_COLUMNS if rows and c in rows[0]), None)
    if column is None:
        raise InputError(f"{path}: no 'path' column or no rows")
    base = path.parent
    if not (base / rows[0][column]).is_file() and (base.parent / rows[0][column]).is_file():
        base = base.parent  # CheXpert: paths start with the data folder's own name
    files = [base / r[column] for r in rows]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise InputError(f"{path}: {len(missing)} image(s) not found: {', '.join(missing[:20])}")
    ids = [(i, r[column], *((r["id"],) if "id" in r else ())) for i, r in enumerate(rows)]
    source = _images(path.parent, files, input_shape, "manifest", workers, ids, rows)
    source.path = path
    return source


def _npz(path: Path, input_shape: tuple[int, ...]) -> Input:
    """An array of an .npz read member-wise: rows are read from the (decompressing) stream batch by batch."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy")]
            key = next((k for k in ("x", "x_test") if k in names), names[0] if len(names) == 1 else None)
            if key is None:
                raise InputError(f"{path}: no array 'x' or 'x_test' (arrays: {sorted(names)})")
            with zf.open(key + ".npy") as f:
                shape, fortran, dtype = npy_header(f)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"{path}: not a readable .npz archive ({e})") from e
    if tuple(shape[1:]) != tuple(input_shape):
        raise InputError(
            f"{path}: array {key!r} holds samples of shape {list(shape[1:])}; the model expects {list(input_shape)}"
        )
    if dtype.hasobject:
        raise InputError(f"{path}: array {key!r} holds Python objects, not numbers")

    def read(batch_size: int) -> Iterator[Batch]:
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if fortran:  # column-major rows are not contiguous on disk: read the whole array
            with np.load(path) as z:
                whole = z[key]
            chunks = (whole[i : i + batch_size] for i in range(0, len(whole), batch_size))
        else:
            chunks = _npy_rows(path, key, shape, dtype, row_bytes, batch_size)
        start = 0
        for x in chunks:
            yield Batch([(start + j,) for j in range(len(x))], np.array(x, dtype=np.float32))
            start += len(x)

    return Input(path, "npz", int(shape[0]), ("index",), [], read)


def _npy_rows(path: Path, key: str, shape, dtype, row_bytes: int, batch_size: int) -> Iterator[np.ndarray]:
    with zipfile.ZipFile(path) as zf, zf.open(key + ".npy") as f:
        npy_header(f)
        for start in range(0, shape[0], batch_size):
            n = min(batch_size, shape[0] - start)
            buf = f.read(n * row_bytes)
            if len(buf) != n * row_bytes:
                raise DataFileError(f"{path}: array {key!r} is truncated at row {start}")
            yield np.frombuffer(buf, dtype=dtype).reshape(n, *shape[1:])


def _tabular(path: Path, header: list[str], input_shape: tuple[int, ...]) -> Input:
    features = [i for i, c in enumerate(header) if c not in NON_FEATURES]
    if len(input_shape) != 1:
        raise InputError(f"{path}: the model takes inputs of shape {list(input_shape)}, not rows of features")
    if len(features) != input_shape[0]:
        names = [header[i] for i in features]
        raise InputError(
            f"{path}: {len(features)} feature column(s) {names[:8]}{'…' if len(names) > 8 else ''}; "
            f"the model expects {input_shape[0]}"
        )
    id_col = header.index("id") if "id" in header else None
    with open(path, newline="") as f:
        count = sum(1 for _ in csv.reader(f)) - 1

    def read(batch_size: int) -> Iterator[Batch]:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            next(reader)
            ids: list[tuple[Any, ...]] = []
            values: list[list[float]] = []
            for r, row in enumerate(reader):
                if len(row) != len(header):
                    raise DataFileError(f"{path} row {r + 2}: {len(row)} fields, header has {len(header)}")
                try:
                    values.append([float(row[i]) for i in features])
                except ValueError as e:
                    raise DataFileError(f"{path} row {r + 2}: {e}") from None
                ids.append((row[id_col] if id_col is not None else r,))
                if len(values) == batch_size:
                    yield Batch(ids, np.array(values, dtype=np.float32))
                    ids, values = [], []
            if values:
                yield Batch(ids, np.array(values, dtype=np.float32))

    return Input(path, "tabular", count, ("id",) if id_col is not None else ("row",), [], read)

"""Inputs to score, read in batches without decoding them all first.

:func:`open_input` recognises the input by its form and checks it up front
(missing files, feature width, unknown format) before anything is decoded:

| input | identifier columns | rows |
|---|---|---|
| a folder of images (recursively, sorted) | ``path`` (relative to the folder) | one per image |
| a folder holding ``manifest.csv``, or a ``.csv`` with a ``path`` (or ``Path``) column | ``row``, ``path`` (+ ``id`` if present) | one per CSV row |
| an ``.npz`` (array ``x``, else ``x_test``, else its only array) | ``index`` | one per sample |
| another ``.csv``: numeric feature columns (``label``, ``source`` ignored, as in training) | the id column if present, else ``row`` | one per CSV row |

``row`` counts data rows from 0. Each batch holds raw inputs: images decoded as
in training (model's channels and size, [0, 1]); features as written.

A model that stored its feature names (``model.pt``'s ``preprocessing``) takes CSV
columns **by name**, in any order: a missing feature column or an extra column
(neither a feature, ``label``, ``source`` nor an identifier by
:func:`fedxrisk.data.preprocessing.is_id_column`) is refused, naming the columns it
takes. Rows with NaN/inf values are refused with one line naming the rows, and
``.npz`` or CSV rows far outside the raw training range or pre-standardized are
refused by one check (:class:`ScaleCheck`) naming the furthest columns (nothing is
written): a score of NaN or of rows on another scale would be a silent wrong answer.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.data import preprocessing as prep_record
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


def open_input(
    path: str | Path, input_shape: tuple[int, ...], workers: int = 0, preprocessing: dict | None = None
) -> Input:
    """Recognise and check ``path`` for a model taking ``[*input_shape]`` inputs (see the module table).

    ``workers``: processes decoding images ahead (0: in this process); ``preprocessing``: the
    model's stored record (feature names, training range)."""
    preprocessing = preprocessing or {}
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
        return _npz(p, input_shape, preprocessing)
    if suffix == ".csv":
        header = next(_csv_rows(p), [])
        if any(c in header for c in PATH_COLUMNS):
            return _manifest(p, input_shape, workers)
        return _tabular(p, header, input_shape, preprocessing)
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


def _text_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file; one line naming the first bad byte otherwise."""
    from fedxrisk.data.checks import read_text

    try:
        return read_text(path).removeprefix("\ufeff").splitlines(keepends=True)  # a BOM is not a column
    except DataFileError as e:
        raise InputError(str(e)) from None


def _manifest(path: Path, input_shape: tuple[int, ...], workers: int) -> Input:
    from fedxrisk.data.checks import outside

    reader = csv.DictReader(_text_lines(path))
    rows = list(reader)
    for i, r in enumerate(rows, 2):
        if None in r or None in r.values():  # more fields than the header names / fewer
            raise InputError(f"{path} row {i}: the fields do not match the header's {len(reader.fieldnames)}")
    column = next((c for c in PATH_COLUMNS if rows and c in rows[0]), None)
    if column is None:
        raise InputError(f"{path}: no 'path' column or no rows")
    base = path.parent
    if not (base / rows[0][column]).is_file() and (base.parent / rows[0][column]).is_file():
        base = base.parent  # CheXpert: paths start with the data folder's own name
    files = [base / r[column] for r in rows]
    strays = outside(base, files)
    if strays:
        raise InputError(
            f"{path}: {len(strays)} image path(s) outside the folder {str(base)!r} (first: "
            f"{str(strays[0])!r}); a manifest names images inside its data folder"
        )
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise InputError(f"{path}: {len(missing)} image(s) not found: {', '.join(missing[:20])}")
    ids = [(i, r[column], *((r["id"],) if "id" in r else ())) for i, r in enumerate(rows)]
    source = _images(path.parent, files, input_shape, "manifest", workers, ids, rows)
    source.path = path
    return source


def _npz(path: Path, input_shape: tuple[int, ...], prep: dict) -> Input:
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
            f"{path}: array {key!r} holds samples of shape {list(shape[1:])} (array {list(shape)}); "
            f"the model expects {list(input_shape)}"
        )
    if dtype.hasobject:
        raise InputError(f"{path}: array {key!r} holds Python objects, not numbers")
    if dtype.kind not in "biuf":
        raise InputError(f"{path}: array {key!r} holds {dtype} values, not numbers")

    def read(batch_size: int) -> Iterator[Batch]:
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if fortran:  # column-major rows are not contiguous on disk: read the whole array
            with np.load(path) as z:
                whole = z[key]
            chunks = (whole[i : i + batch_size] for i in range(0, len(whole), batch_size))
        else:
            chunks = _npy_rows(path, key, shape, dtype, row_bytes, batch_size)
        start, bad, scale = 0, [], ScaleCheck()
        for x in chunks:
            x = np.array(x, dtype=np.float32)
            finite = np.isfinite(x.reshape(len(x), -1)).all(1)
            bad += [start + j for j in np.flatnonzero(~finite)]
            yield scale.seen(Batch([(start + j,) for j in range(len(x))], x))
            start += len(x)
        if bad:
            raise InputError(_non_finite(path, "index", bad))
        if why := scale.problem(prep):
            raise InputError(f"{path}: array {key!r}: {why}; nothing was scored")

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


def _csv_rows(path: Path) -> Iterator[list[str]]:
    """The rows of a UTF-8 CSV file, streamed; one line naming the line of a byte that is not UTF-8."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        try:
            yield from reader
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text ({_first_bad_byte(path)}); save it as UTF-8") from None


def _first_bad_byte(path: Path) -> str:
    """``byte 0xe9 on line 3`` for the first byte of ``path`` that is not UTF-8."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"byte {line[e.start]:#04x} on line {number}"
    return "an invalid byte"


def _feature_columns(path: Path, header: list[str], input_shape: tuple[int, ...], prep: dict) -> list[int]:
    """Header positions of the model's features, in the model's order (by name when it stored them)."""
    if len(input_shape) != 1:
        raise InputError(f"{path}: the model takes inputs of shape {list(input_shape)}, not rows of features")
    names = prep.get("features")
    if names is None:  # an .npz model (or one from before names were stored): by position, ids never
        features = [
            i for i, c in enumerate(header) if c not in NON_FEATURES and not prep_record.is_id_column(c)
        ]
    else:
        skip = {*NON_FEATURES, *prep.get("id_columns", []), *prep.get("outcome_columns", [])}
        missing = [n for n in names if n not in header]
        extra = [c for c in header if c not in names and c not in skip and not prep_record.is_id_column(c)]
        if missing or extra:
            parts = ([f"missing feature column(s) {missing[:8]}"] if missing else []) + (
                [f"unknown column(s) {extra[:8]}"] if extra else []
            )
            raise InputError(
                f"{path}: {'; '.join(parts)}; the model takes the columns {names[:12]}"
                f"{'…' if len(names) > 12 else ''} (by name, any order; id, label and source are allowed)"
            )
        doubled = sorted({c for c in header if header.count(c) > 1 and c in names})
        if doubled:
            raise InputError(f"{path}: column(s) {doubled} appear more than once")
        features = [header.index(n) for n in names]
    if len(features) != input_shape[0]:
        shown = [header[i] for i in features]
        raise InputError(
            f"{path}: {len(features)} feature column(s) {shown[:8]}{'…' if len(shown) > 8 else ''}; "
            f"the model expects {input_shape[0]}, taken by position (its model.pt records no column names: "
            "the columns of its training array, in order)"
        )
    return features


def _tabular(path: Path, header: list[str], input_shape: tuple[int, ...], prep: dict) -> Input:
    if not header:
        raise InputError(f"{path}: empty file (no header row)")
    features = _feature_columns(path, header, input_shape, prep)
    id_names = [c for c in prep.get("id_columns", []) if c in header]
    id_names += [c for i, c in enumerate(header) if prep_record.is_id_column(c) and i not in features]
    id_col = header.index(id_names[0]) if id_names else None
    count = sum(1 for _ in _csv_rows(path)) - 1

    def read(batch_size: int) -> Iterator[Batch]:
        rows = _csv_rows(path)
        next(rows)
        ids: list[tuple[Any, ...]] = []
        values: list[list[float]] = []
        bad: list[int] = []
        scale = ScaleCheck()
        for r, row in enumerate(rows):
            if len(row) != len(header):
                raise DataFileError(f"{path} row {r + 2}: {len(row)} fields, header has {len(header)}")
            try:
                values.append([float(row[i]) for i in features])
            except ValueError as e:
                raise DataFileError(f"{path} row {r + 2}: {e}") from None
            if not np.isfinite(values[-1]).all():
                bad.append(r + 2)
            ids.append((row[id_col] if id_col is not None else r,))
            if len(values) == batch_size:
                yield scale.seen(Batch(ids, np.array(values, dtype=np.float32)))
                ids, values = [], []
        if values:
            yield scale.seen(Batch(ids, np.array(values, dtype=np.float32)))
        if bad:
            raise InputError(_non_finite(path, "line", bad))
        if (why := scale.problem(prep)) is not None:
            raise InputError(f"{path}: {why}; nothing was scored")

    columns = (header[id_col],) if id_col is not None else ("row",)
    return Input(path, "tabular", count, columns, [], read)


class ScaleCheck:
    """The range and running column means of the finite input rows, checked against the model's record
    (:func:`fedxrisk.data.preprocessing.off_training_scale`) the same way for every input format."""

    def __init__(self) -> None:
        self.total: np.ndarray | None = None
        self.count = 0
        self.lo, self.hi = np.inf, -np.inf

    def add(self, rows: np.ndarray) -> None:
        """Count ``rows`` (finite ones only)."""
        rows = rows[np.isfinite(rows.reshape(len(rows), -1)).all(1)] if len(rows) else rows
        if not len(rows):
            return
        self.lo, self.hi = min(self.lo, float(rows.min())), max(self.hi, float(rows.max()))
        if rows.ndim == 2:
            sums = rows.sum(0, dtype=np.float64)
            self.total = sums if self.total is None else self.total + sums
            self.count += len(rows)

    def seen(self, batch: Batch) -> Batch:
        """``batch``, its finite rows counted."""
        self.add(batch.x)
        return batch

    def problem(self, prep: dict) -> str | None:
        """Why the rows seen are not on the scale the model was trained on, or None."""
        if self.lo > self.hi:  # no finite row
            return None
        means = None if self.total is None else self.total / self.count
        return prep_record.off_training_scale(prep, self.lo, self.hi, means, self.count)


def _non_finite(path: Path, unit: str, where: list[int]) -> str:
    shown = ", ".join(map(str, where[:5])) + (f" (+{len(where) - 5} more)" if len(where) > 5 else "")
    return (
        f"{path}: {len(where)} row(s) with NaN/inf values, at {unit}(s) {shown}; "
        "nothing was scored: fix or drop those rows"
    )

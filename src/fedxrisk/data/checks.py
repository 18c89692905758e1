"""Data validation at load time: every problem is one :class:`DataFileError` naming the file.

Readers call the specific checks where they know the file and the row numbers
(``row_base`` turns array positions into file rows: 2 for a CSV with a header,
0 for 0-based array indices); :func:`check_labeled` and :func:`check_test_classes`
run on every dataset in :func:`fedxrisk.data.make_federated` as a backstop.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fedxrisk.data.types import BinaryData, LabeledData
from fedxrisk.errors import DataFileError  # noqa: F401  (re-exported)

CHUNK = 1 << 14  # rows checked at a time (bounded memory on large image sets)


def rows_text(rows: np.ndarray, base: int, limit: int = 5) -> str:
    """``row 7`` / ``rows 3, 7, 9, …``: file rows when ``base`` = 2 (a CSV after its header),
    array positions marked ``(0-based)`` when ``base`` = 0."""
    shown = ", ".join(str(int(r) + base) for r in rows[:limit]) + (", …" if len(rows) > limit else "")
    return f"row{'s' if len(rows) > 1 else ''} {shown}" + (" (0-based)" if base == 0 else "")


def read_text(path: Path) -> str:
    """A text file decoded as UTF-8, or an error naming the file and the first bad byte."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataFileError(
            f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); save it as UTF-8"
        ) from None


def outside(base: Path, files: list[Path]) -> list[Path]:
    """The ``files`` that resolve (links and ``..`` followed) to a place outside the folder ``base``:
    a manifest names images inside its data folder, never ``/etc/…`` or ``../other-study/…``."""
    root = base.resolve()
    return [f for f in files if not f.resolve().is_relative_to(root)]


def check_features(x: np.ndarray, where: str, base: int = 0, scan: bool = True) -> None:
    """Numbers, one row per sample with at least one feature, all finite (``scan``: read every
    value; a streamed dataset skips it rather than read the whole file at start-up)."""
    if x.dtype.kind in "USOV":
        raise DataFileError(
            f"{where}: features must be numbers, found {x.dtype} values such as {x.flat[0].item()!r}"
        )
    if x.ndim < 2:
        raise DataFileError(
            f"{where}: features must be [N, features…] (one row per sample), got shape {x.shape}"
        )
    if int(np.prod(x.shape[1:])) == 0:
        raise DataFileError(f"{where}: no feature columns (shape {x.shape})")
    if x.dtype.kind != "f" or not scan:
        return
    bad_rows, count = [], 0
    for start in range(0, len(x), CHUNK):
        bad = ~np.isfinite(x[start : start + CHUNK].reshape(min(CHUNK, len(x) - start), -1))
        count += int(bad.sum())
        bad_rows.append(np.flatnonzero(bad.any(1)) + start)
    if count:
        rows = np.concatenate(bad_rows)
        raise DataFileError(
            f"{where}: {count} non-finite value(s) (NaN/inf) in {rows_text(rows, base)}; fix or drop those rows"
        )


def check_integer_labels(y: np.ndarray, where: str, base: int = 0) -> None:
    """Class ids: integers ≥ 0 (floats must be whole numbers)."""
    if y.dtype.kind in "USOV":
        raise DataFileError(f"{where}: labels must be integer class ids, found {y.dtype} values")
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (np.mod(y, 1) != 0))
        if len(bad):
            raise DataFileError(
                f"{where}: labels must be integer class ids, found {y[bad[0]].item()!r} at {rows_text(bad, base)}"
            )
    negative = np.flatnonzero(y < 0)
    if len(negative):
        raise DataFileError(
            f"{where}: labels must be class ids ≥ 0, found {y[negative[0]].item()!r} at {rows_text(negative, base)}"
        )


def check_class_ids(labels: Mapping[str, np.ndarray], base: int = 0) -> None:
    """Class ids 0..C-1 without gaps over all files (``where`` → labels): a stray 7 in 0/1 data
    would make the default positives classes 4..7 and turn every 1 negative."""
    present = np.unique(np.concatenate([np.asarray(y).ravel() for y in labels.values()]).astype(np.int64))
    if len(present) == 0:
        return
    missing = sorted(set(range(int(present.max()) + 1)) - set(present.tolist()))
    if not missing:
        return
    stray = present[present > missing[0]]
    for where, y in labels.items():
        rows = np.flatnonzero(np.isin(y, stray))
        if len(rows):
            values = ", ".join(str(v) for v in stray[:5])
            raise DataFileError(
                f"{where}: class id(s) {values} at {rows_text(rows, base)} but no class "
                f"{missing[0]}; class ids must be 0..C-1 without gaps (binary data: 0/1 only)"
            )


def check_labeled(data: LabeledData, where: str) -> None:
    """Non-empty splits of matching width with finite features (arrays in memory only)."""
    for split in ("train", "test", "val"):
        x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
        if x is None or not isinstance(x, np.ndarray):
            continue  # no validation split, or a lazy (streamed) dataset that checks its own files
        if len(y) == 0:
            raise DataFileError(f"{where}: the {split} split is empty")
        check_features(x, f"{where}: x_{split}")
    xtr, xte = data.x_train, data.x_test
    if isinstance(xtr, np.ndarray) and isinstance(xte, np.ndarray) and xtr.shape[1:] != xte.shape[1:]:
        raise DataFileError(
            f"{where}: x_train rows have shape {xtr.shape[1:]} but x_test rows {xte.shape[1:]}; they must match"
        )


def check_test_classes(data: BinaryData, where: str) -> None:
    """A single-label test set needs both classes, else every AUROC is undefined."""
    y = data.y_test
    if y.dim() != 1 or len(y) == 0:
        return
    positives = int(y.sum())
    if positives in (0, len(y)):
        only = "negatives" if positives == 0 else "positives"
        raise DataFileError(
            f"{where}: the test set holds only {only} ({len(y)} rows, positive classes "
            f"{list(data.positive_classes)}); AUROC is undefined without both classes"
        )

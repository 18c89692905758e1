"""Arrays already in memory form: NumPy ``.npz`` archives and tabular CSV files."""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import numpy as np

from fedxrisk.data import preprocessing
from fedxrisk.data.checks import check_class_ids, check_features, check_integer_labels, read_text
from fedxrisk.data.decode import npz_member
from fedxrisk.data.lazy import ArraySource, LazySamples, reading_lazily
from fedxrisk.data.missing import apply_missing, is_missing
from fedxrisk.data.readers.base import (
    DataFileError,
    MissingDataError,
    codes,
    require_dir,
    split_labeled,
    standardize,
)
from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData

NPZ_LAYOUT = (
    "  <data_dir>/data.npz (or data_dir = the .npz file) with arrays x_train, y_train, x_test, y_test;\n"
    "  y: integer classes [N] or multi-label {0,1} [N, L]; optional source_train, patient_train [N];\n"
    "  or (ADBench's layout) X [N, features] and y [N] class ids, split 70/30 stratified and standardized"
)
SPLIT_KEYS = ("x_train", "y_train", "x_test", "y_test")
TABULAR_LAYOUT = (
    "  <data_dir>/train.csv and <data_dir>/test.csv (or one <data_dir>/data.csv, split 70/30),\n"
    "  header with numeric feature columns, an integer 'label' column, optionally a 'source' column;\n"
    "  identifier columns (id, ID, *_id, PatientID …) are never features"
)


@register("npz", files=True)
def read_npz(data_dir: str | Path | None) -> LabeledData:
    """A ``.npz`` archive of train/test arrays, or of all rows ``X``, ``y`` (see :data:`NPZ_LAYOUT`)."""
    root = require_dir(data_dir, "npz", NPZ_LAYOUT)
    path = root if root.is_file() else root / "data.npz"
    if not path.is_file():
        raise MissingDataError(f"npz: {path} not found; expected:\n{NPZ_LAYOUT}")
    lazy = reading_lazily()
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = z.files
            arrays = {k: z[k] for k in keys if not (lazy and k.startswith("x_"))}
        if lazy:  # inputs memory-mapped (uncompressed archives) and decoded per sample
            arrays |= {k: npz_member(path, k) for k in keys if k.startswith("x_")}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        reason = "empty file" if path.stat().st_size == 0 else e
        raise DataFileError(
            f"{path}: not a readable .npz archive ({reason}); expected:\n{NPZ_LAYOUT}"
        ) from None
    xy = "X" in arrays and not any(k in arrays for k in SPLIT_KEYS)  # ADBench's layout
    missing = [k for k in (("X", "y") if xy else SPLIT_KEYS) if k not in arrays]
    if missing:
        raise DataFileError(
            f"{path}: missing array(s) {missing} (has {sorted(arrays)}); expected:\n{NPZ_LAYOUT}"
        )
    if xy:
        return _read_xy(path, arrays)
    y_train, y_test = arrays["y_train"], arrays["y_test"]
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        check_features(x, f"{path}: x_{split}", scan=not lazy)  # streamed: not read at start-up
        if len(x) != len(y) or y.ndim not in (1, 2):
            raise DataFileError(f"{path}: x_{split} {x.shape} and y_{split} {y.shape} do not match")
        if len(y) == 0:
            raise DataFileError(f"{path}: x_{split} and y_{split} hold no rows")
    if arrays["x_train"].shape[1:] != arrays["x_test"].shape[1:]:
        raise DataFileError(
            f"{path}: x_train rows have shape {arrays['x_train'].shape[1:]} but x_test rows "
            f"{arrays['x_test'].shape[1:]}; they must match"
        )
    if y_train.ndim == 2:
        if y_test.ndim != 2 or y_test.shape[1] != y_train.shape[1] or not np.isin(y_train, (0, 1)).all():
            raise DataFileError(f"{path}: multi-label y must be {{0, 1}} [N, L] in both splits")
        y_train, y_test, num_classes = y_train.astype(np.float32), y_test.astype(np.float32), y_train.shape[1]
    else:
        check_integer_labels(y_train, f"{path}: y_train")
        check_integer_labels(y_test, f"{path}: y_test")
        y_train, y_test = y_train.astype(np.int64), y_test.astype(np.int64)
        check_class_ids({f"{path}: y_train": y_train, f"{path}: y_test": y_test})
        num_classes = int(max(y_train.max(), y_test.max())) + 1
    groups = {
        k: arrays[f"{k}_train"].astype(np.int64) for k in ("source", "patient") if f"{k}_train" in arrays
    }
    bad = [k for k, v in groups.items() if len(v) != len(y_train)]
    if bad:
        raise DataFileError(f"{path}: {bad[0]}_train must have one entry per training sample")
    x_train, x_test = (
        LazySamples(ArraySource(arrays[k], f"{path.name}:{k}")) if lazy else arrays[k].astype(np.float32)
        for k in ("x_train", "x_test")
    )
    prep = preprocessing.value_range(arrays["x_train"])
    return LabeledData(
        path.stem, x_train, y_train, x_test, y_test, num_classes, groups_train=groups, preprocessing=prep
    )


def _read_xy(path: Path, arrays: dict[str, np.ndarray]) -> LabeledData:
    """ADBench's layout: all rows in ``X``, labels in ``y``; a fixed stratified split, then
    features standardized with the training rows' mean and std (per sample when read lazily)."""
    x, y = arrays["X"], arrays["y"]
    check_features(x, f"{path}: X")
    if y.ndim != 1 or len(y) != len(x):
        raise DataFileError(f"{path}: y must hold one class id per row of X {x.shape}, got shape {y.shape}")
    check_integer_labels(y, f"{path}: y")
    y = y.astype(np.int64)
    check_class_ids({f"{path}: y": y})
    if np.bincount(y).min() < 2:
        raise DataFileError(f"{path}: every class needs at least 2 rows to split into train and test")
    data = split_labeled(path.stem, x.astype(np.float32), y, int(y.max()) + 1)
    return standardize(data)  # unnamed columns: by position; the record in raw space


def _read_table(path: Path) -> tuple[np.ndarray, np.ndarray, list[str] | None, list[str]]:
    """(features, labels, sources or None, feature names) of one tabular CSV."""
    rows = list(csv.reader(io.StringIO(read_text(path), newline="")))
    if len(rows) < 2:
        raise DataFileError(f"{path}: needs a header and at least one row; expected:\n{TABULAR_LAYOUT}")
    header, body = rows[0], rows[1:]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:  # the model records its inputs by name: two columns of one name cannot be told apart
        raise DataFileError(
            f"{path}: column {repeated[0]!r} appears {header.count(repeated[0])} times in the header; rename one"
        )
    if "label" not in header:
        raise DataFileError(f"{path}: no 'label' column in header {header}; expected:\n{TABULAR_LAYOUT}")
    li = header.index("label")
    si = header.index("source") if "source" in header else None
    feats = [i for i in range(len(header)) if i not in (li, si) and not preprocessing.is_id_column(header[i])]
    if not feats:
        raise DataFileError(
            f"{path}: no feature columns besides 'label' (header {header}); expected:\n{TABULAR_LAYOUT}"
        )
    x = np.empty((len(body), len(feats)), dtype=np.float32)
    y = np.empty(len(body), dtype=np.int64)
    for r, row in enumerate(body):
        if len(row) != len(header):
            raise DataFileError(f"{path} row {r + 2}: {len(row)} fields, header has {len(header)}")
        for j, i in enumerate(feats):
            try:
                x[r, j] = np.nan if is_missing(row[i]) else float(row[i])
            except ValueError:
                raise DataFileError(
                    f"{path} row {r + 2}, column {header[i]!r}: {row[i]!r} is not a number"
                ) from None
        try:
            y[r] = int(row[li])
        except ValueError:
            raise DataFileError(f"{path} row {r + 2}: label {row[li]!r} is not an integer class id") from None
    check_features(np.where(np.isnan(x), 0, x), str(path), base=2)  # NaN: a missing cell (data.on_missing)
    check_integer_labels(y, str(path), base=2)
    sources = [row[si] for row in body] if si is not None else None
    return x, y, sources, [header[i] for i in feats]


@register("tabular", files=True)
def read_tabular_csv(data_dir: str | Path | None, on_missing: str = "error") -> LabeledData:
    """Numeric feature columns + integer ``label``; standardized with the training mean and std;
    missing cells handled by ``on_missing`` (:mod:`fedxrisk.data.missing`)."""
    root = require_dir(data_dir, "tabular", TABULAR_LAYOUT)
    if (root / "train.csv").is_file() and (root / "test.csv").is_file():
        x_tr, y_tr, s_tr, names = _read_table(root / "train.csv")
        header = _header(root / "train.csv")
        x_te, y_te, s_te, names_te = _read_table(root / "test.csv")
        check_class_ids({str(root / "train.csv"): y_tr, str(root / "test.csv"): y_te}, base=2)
        if names != names_te:
            raise DataFileError(f"{root}: train.csv and test.csv have different feature columns")
        groups = {"source": codes(s_tr)[0]} if s_tr is not None else {}
        tested = {}
        if s_tr is not None and s_te is not None:  # the test rows' sites, coded as training's (-1: new)
            lookup = {name: i for i, name in enumerate(codes(s_tr)[1])}
            tested = {"source": np.array([lookup.get(v, -1) for v in s_te], dtype=np.int64)}
        num_classes = int(max(y_tr.max(), y_te.max())) + 1
        data = LabeledData("tabular", x_tr, y_tr, x_te, y_te, num_classes, groups_train=groups,
                           groups_test=tested)  # fmt: skip
        data.source_names = tuple(codes(s_tr)[1]) if s_tr is not None else ()
    elif (root / "data.csv").is_file():
        x, y, s, names = _read_table(root / "data.csv")
        header = _header(root / "data.csv")
        check_class_ids({str(root / "data.csv"): y}, base=2)
        groups = {"source": codes(s)[0]} if s is not None else {}
        data = split_labeled("tabular", x, y, int(y.max()) + 1, groups)
        data.source_names = tuple(codes(s)[1]) if s is not None else ()
    else:
        raise MissingDataError(
            f"tabular: no train.csv + test.csv or data.csv in {root}; expected:\n{TABULAR_LAYOUT}"
        )
    if data.y_train.min() < 0:
        raise DataFileError(f"tabular: labels must be ≥ 0 in {root}")
    names = apply_missing(data, names, on_missing, str(root))
    ids = [c for c in header if preprocessing.is_id_column(c) and c not in ("label", "source")]
    return standardize(data, names, ids)


def _header(path: Path) -> list[str]:
    return next(csv.reader(io.StringIO(read_text(path), newline="")), [])

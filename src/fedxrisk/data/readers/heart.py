"""UCI Heart Disease as four hospitals, preprocessed as FLamby's Fed-Heart-Disease (Ogier du Terrail et al. 2022).

Steps, per hospital file ``processed.<hospital>.data`` (14 comma-separated columns,
``?`` = missing): drop columns 10-12 (slope, ca, thal: mostly missing outside
Cleveland), then every row with a missing value; label = ``num > 0`` (disease);
a stratified 66/34 train/test split with seed 43 (unstratified when a class has
fewer than 3 patients). Then, pooled: the 8 numeric columns, ``cp`` one-hot (2, 3, 4;
1 dropped) and ``restecg`` one-hot as FLamby's code produces it (see :func:`encode`),
standardized with the training rows' mean and standard deviation (FLamby does not
standardize); ``model.pt`` records the encoded columns' names (:func:`feature_names`) and their
raw mean/std, so ``predict`` takes a CSV of encoded, unstandardized rows by name. On the UCI files:
740 patients (Cleveland 303, Hungarian 261, Switzerland 46, VA 130), 486 train / 254 test, 16 features.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedxrisk.data.checks import read_text
from fedxrisk.data.readers.base import DataFileError, MissingDataError, require_dir, standardize
from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData

HOSPITALS = ("cleveland", "hungarian", "switzerland", "va")  # source ids 0..3, as FLamby's centers
COLUMNS = ("age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak",
           "slope", "ca", "thal", "num")  # fmt: skip
DROPPED = (10, 11, 12)  # slope, ca, thal
NUMERIC = (0, 1, 3, 4, 5, 7, 8, 9)
CP, RESTECG = (1, 2, 3, 4), (0, 1, 2)  # the UCI codes
TRAIN_FRACTION, HEART_SPLIT_SEED = 0.66, 43  # FLamby's split
MISSING = ("?", "")
ENCODINGS = ("flamby", "onehot")
HEART_LAYOUT = (
    "  <data_dir>/processed.cleveland.data, processed.hungarian.data, processed.switzerland.data,\n"
    "  processed.va.data (UCI Heart Disease): 14 comma-separated columns per line, '?' = missing"
)


def read_hospital(path: Path) -> tuple[np.ndarray, bool]:
    """The complete rows of one file (columns 10-12 dropped) as float ``[n, 11]``, and whether its
    ``restecg`` column has a missing value (then FLamby's code reads that column as text)."""
    lines = read_text(path).splitlines()
    if not any(line.strip() for line in lines):
        raise DataFileError(f"{path}: no rows; expected:\n{HEART_LAYOUT}")
    kept, rows, restecg_text = [c for c in range(len(COLUMNS)) if c not in DROPPED], [], False
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(COLUMNS):
            raise DataFileError(
                f"{path} line {i}: {len(cells)} fields, expected {len(COLUMNS)} ({', '.join(COLUMNS)})"
            )
        restecg_text |= cells[6] == "?"  # pandas reads such a column as text
        values = [cells[c] for c in kept]
        if any(v in MISSING for v in values):
            continue
        try:
            row = [float(v) for v in values]
        except ValueError:
            bad = next(v for v in values if not _number(v))
            raise DataFileError(f"{path} line {i}: {bad!r} is not a number or '?'") from None
        if not np.isfinite(row).all():
            raise DataFileError(f"{path} line {i}: non-finite value (NaN/inf); use '?' for a missing value")
        rows.append((i, row))
    table = np.array([r for _, r in rows], dtype=np.float64).reshape(-1, len(kept))
    for col, codes in ((2, CP), (6, RESTECG)):
        bad = np.flatnonzero(~np.isin(table[:, col], codes))
        if len(bad):
            raise DataFileError(f"{path} line {rows[bad[0]][0]}: {COLUMNS[col]} = {table[bad[0], col]:g}, "
                                f"expected one of {list(codes)}")  # fmt: skip
    if not np.isin(table[:, -1], (0, 1, 2, 3, 4)).all():
        raise DataFileError(f"{path}: num (the last column) must be an integer 0-4")
    return table, restecg_text


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def encode(table: np.ndarray, restecg_text: bool, encoding: str) -> np.ndarray:
    """Features of complete rows ``[n, 11]``: 8 numeric, cp == 2, 3, 4, then restecg.

    ``onehot``: restecg == 1, 2 (13 features). ``flamby``: as FLamby's ``pd.get_dummies`` on
    the pooled table, where restecg is text in the files with a missing restecg (Hungarian,
    Switzerland) and a number in the others: restecg == 1, 2 for numbers (0 dropped), then
    restecg == "0", "1", "2" for text (16 features, the input size of FLamby's model).
    """
    cp, restecg = table[:, 2], table[:, 6]
    parts = [table[:, NUMERIC], *(cp[:, None] == c for c in CP[1:])]
    if encoding == "onehot":
        parts += [restecg[:, None] == c for c in RESTECG[1:]]
    else:
        parts += [(restecg[:, None] == c) & (not restecg_text) for c in RESTECG[1:]]
        parts += [(restecg[:, None] == c) & restecg_text for c in RESTECG]
    return np.concatenate([p.astype(np.float64) for p in parts], axis=1)


def split_hospital(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FLamby's per-hospital split: 66 % train, seed 43, stratified when both classes have > 2 rows."""
    from sklearn.model_selection import train_test_split

    counts = np.bincount(y, minlength=2)
    stratify = y if (counts > 2).all() else None
    train, test = train_test_split(np.arange(len(y)), test_size=1.0 - TRAIN_FRACTION, train_size=TRAIN_FRACTION,
                                   random_state=HEART_SPLIT_SEED, shuffle=True, stratify=stratify)  # fmt: skip
    return np.sort(train), np.sort(test)


@register("heart_disease", files=True)
def read_heart_disease(data_dir: str | Path | None, encoding: str = "flamby") -> LabeledData:
    """The four hospitals (``groups_train['source']``: 0 Cleveland, 1 Hungarian, 2 Switzerland, 3 VA);
    test = the pooled per-hospital test splits (``groups_test['source']``); see the module doc."""
    if encoding not in ENCODINGS:
        raise ValueError(f"heart_disease encoding must be one of {list(ENCODINGS)}, got {encoding!r}")
    root = require_dir(data_dir, "heart_disease", HEART_LAYOUT)
    paths = [root / f"processed.{h}.data" for h in HOSPITALS]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise MissingDataError(
            f"heart_disease: {', '.join(missing)} not found in {root}; expected:\n{HEART_LAYOUT}"
        )
    parts = {"train": [], "test": []}
    for source, path in enumerate(paths):
        table, restecg_text = read_hospital(path)
        if len(table) < 2:
            raise DataFileError(f"{path}: {len(table)} complete row(s); need at least 2 to split")
        x, y = encode(table, restecg_text, encoding), (table[:, -1] > 0).astype(np.int64)
        for name, rows in zip(("train", "test"), split_hospital(y)):
            parts[name].append((x[rows], y[rows], np.full(len(rows), source, dtype=np.int64)))
    x_tr, y_tr, s_tr = (np.concatenate(a) for a in zip(*parts["train"]))
    x_te, y_te, s_te = (np.concatenate(a) for a in zip(*parts["test"]))
    data = LabeledData(
        "heart_disease", x_tr, y_tr, x_te, y_te, 2,
        groups_train={"source": s_tr}, label_names=("no disease", "disease"), groups_test={"source": s_te},
        default_positive=(1,), source_names=HOSPITALS,
    )  # fmt: skip
    return standardize(data, feature_names(encoding), lazy=False)  # names, raw-space mean/std/range


def feature_names(encoding: str) -> list[str]:
    """The encoded columns' names, in :func:`encode`'s order (``predict`` takes a CSV by these names)."""
    names = (
        [COLUMNS[c] for c in NUMERIC] + [f"cp_{c}" for c in CP[1:]] + [f"restecg_{c}" for c in RESTECG[1:]]
    )
    return names if encoding == "onehot" else names + [f"restecg_text_{c}" for c in RESTECG]

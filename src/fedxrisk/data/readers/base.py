"""Shared pieces of the file readers: errors that name the expected layout, file lookup, splits."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedxrisk.data.decode import read_bytes  # noqa: F401  (re-exported)
from fedxrisk.data.preprocessing import standardized
from fedxrisk.data.types import SPLIT_SEED, TEST_FRACTION, LabeledData
from fedxrisk.errors import DataFileError, MissingDataError, missing_data_dir  # noqa: F401  (re-exported)

RESERVED_COLUMNS = ("path", "split", "source", "patient")  # manifest columns that are not labels


def require_dir(data_dir: str | Path | None, dataset: str, layout: str) -> Path:
    """``data_dir`` as a folder that exists, or an error describing ``layout``."""
    missing = missing_data_dir(dataset, None if data_dir is None else str(data_dir), layout)
    if missing is not None:
        raise missing
    return Path(data_dir).expanduser()  # type: ignore[arg-type]


def find_file(roots: Sequence[Path], names: Sequence[str], dataset: str, layout: str) -> Path:
    """The first ``root/name`` that exists, trying every root then every name."""
    for root in roots:
        for name in names:
            if (root / name).is_file():
                return root / name
    tried = ", ".join(str(r / names[0]) for r in roots)
    raise MissingDataError(f"{dataset}: file {names[0]!r} not found (looked in {tried}); expected:\n{layout}")


def split_labeled(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    num_classes: int,
    groups: dict[str, np.ndarray] | None = None,
    test_fraction: float = TEST_FRACTION,
    label_names: tuple[str, ...] = (),
) -> LabeledData:
    """A fixed train/test split (seed :data:`SPLIT_SEED`), stratified for single-label data.

    When ``groups`` has a ``patient`` entry the split is by patient within each
    source: no patient appears in both train and test (the ChestXray-IH protocol
    holds out a fraction of every organization's data).
    """
    groups = groups or {}
    rng = np.random.default_rng(SPLIT_SEED)
    if "patient" in groups:
        test = np.zeros(len(y), dtype=bool)
        sources = groups.get("source", np.zeros(len(y), dtype=np.int64))
        for s in np.unique(sources):
            patients = np.unique(groups["patient"][sources == s])
            count = max(1, round(test_fraction * len(patients))) if len(patients) > 1 else 0
            held = rng.choice(patients, count, replace=False)
            test |= (sources == s) & np.isin(groups["patient"], held)
        train_idx, test_idx = np.flatnonzero(~test), np.flatnonzero(test)
    else:
        from sklearn.model_selection import train_test_split

        stratify = y if y.ndim == 1 and np.bincount(y).min() >= 2 else None
        train_idx, test_idx = train_test_split(
            np.arange(len(y)), test_size=test_fraction, random_state=SPLIT_SEED, stratify=stratify
        )
        train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
    if len(train_idx) == 0 or len(test_idx) == 0:
        raise DataFileError(f"{name}: too few samples ({len(y)}) to split into train and test")
    return LabeledData(
        name,
        x[train_idx],
        y[train_idx],
        x[test_idx],
        y[test_idx],
        num_classes,
        groups_train={k: v[train_idx] for k, v in groups.items()},
        label_names=label_names,
        groups_test={k: v[test_idx] for k, v in groups.items()},  # each site's own test rows
    )


def standardize(
    data: LabeledData, names: Sequence[str] | None = None, id_columns: Sequence[str] = (), lazy: bool = True
) -> LabeledData:
    """The one recording path of a reader that standardizes its features: ``data`` (holding RAW rows
    ``[N, F]``) gets its rows standardized with the training rows' mean and std — per sample when
    reading lazily, unless ``lazy`` is False (a small table kept in memory) — and the record of that
    in raw space (:func:`fedxrisk.data.preprocessing.standardized`: names, mean, std, range), which
    ``model.pt`` carries so ``predict`` takes and checks raw rows."""
    from fedxrisk.data.lazy import ArraySource, LazySamples, reading_lazily

    raw_train, raw_test = np.asarray(data.x_train), np.asarray(data.x_test)
    record, mean, std = standardized(raw_train, names, id_columns)
    data.preprocessing = {**(data.preprocessing or {}), **record}
    if lazy and reading_lazily():  # parsed rows stay raw; standardized per sample when decoded
        data.x_train = LazySamples(ArraySource(raw_train, f"{data.name}:train", mean=mean, std=std))  # type: ignore[assignment]
        data.x_test = LazySamples(ArraySource(raw_test, f"{data.name}:test", mean=mean, std=std))  # type: ignore[assignment]
    else:
        data.x_train = ((raw_train - mean) / std).astype(np.float32)
        data.x_test = ((raw_test - mean) / std).astype(np.float32)
    return data


def codes(values: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Integer codes of string values (sorted unique order) and the unique values."""
    names = sorted(set(values))
    lookup = {v: i for i, v in enumerate(names)}
    return np.array([lookup[v] for v in values], dtype=np.int64), names

"""Survival data: Fed-TCGA-BRCA as FLamby prepares it, and a generic time/event table.

A survival reader returns a :class:`~fedxrisk.data.types.LabeledData` whose label
is the event indicator (1 = event observed, 0 = censored; class 1 is the positive
class) and whose ``groups_train`` / ``groups_test`` carry each patient's ``time``
(float64, ≥ 0) and, where the data have sites, ``source``. Everything that
partitions or samples binary data then works unchanged; survival objectives and
the C-index read ``time`` beside ``y``.

**Fed-TCGA-BRCA** (Ogier du Terrail et al., NeurIPS 2022 Datasets and Benchmarks;
FLamby's ``fed_tcga_brca``): ``brca.csv`` holds ``pid``, 39 clinical features
(columns 1–39: age and one-hot codes), ``E`` and ``T`` (days);
``train_test_split.csv`` assigns every patient ``fold2 = train_K`` / ``test_K``,
K = region 0–5 (FLamby's static split, 1,088 patients). The region can also be
read off the barcode: its tissue-source-site code (``TCGA-XX-…``) maps to a
region in ``centers.csv``; the reader checks that the split's regions and the
barcodes' regions are the same partition of the patients (one barcode region per
split region). Features are standardized with the training rows' mean and
standard deviation (FLamby feeds them raw; a linear model's optimum is the same up
to the rescaling, its step sizes are not).

**Generic** (``.csv`` with a header, or ``.npz``): a time column and an event
column (names given, default ``time`` and ``event``), the other numeric columns
are features; an optional ``source`` column names sites; an optional ``split``
column (``train``/``test``) fixes the split, else the fixed stratified split of
every reader. Refused with one line: negative or non-finite times, events not 0/1,
no event at all.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from fedxrisk.data.preprocessing import features
from fedxrisk.data.readers.base import DataFileError, MissingDataError, codes, require_dir, split_labeled
from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData

TCGA_FILES = ("brca.csv", "train_test_split.csv", "centers.csv")
TCGA_LAYOUT = (
    "  <data_dir>/brca.csv (pid, 39 features, E, T), train_test_split.csv (pid, fold, fold2 = train_K/test_K),\n"
    "  centers.csv (TSS Code, ..., Region): FLamby's fed_tcga_brca files"
)
REGIONS = 6
SURVIVAL_LABELS = ("censored", "event")


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(newline="") as f:
            table = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise DataFileError(f"{path}: cannot read ({e})") from e
    if len(table) < 2:
        raise DataFileError(f"{path}: no data rows")
    return [h.strip() for h in table[0]], [r for r in table[1:] if any(c.strip() for c in r)]


def _npz_columns(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz``; an unreadable archive or one holding Python objects is one line."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: np.asarray(f[k]) for k in f.files}
    except (OSError, ValueError, EOFError) as e:  # BadZipFile is an OSError; pickled objects a ValueError
        raise DataFileError(
            f"{path}: not a readable .npz archive of numbers ({type(e).__name__}: {e})"
        ) from None


def _numbers(values: np.ndarray, path: Path, name: str) -> np.ndarray:
    """``values`` as float64, or one line naming the array that holds text."""
    try:
        return values.astype(np.float64)
    except (TypeError, ValueError):
        raise DataFileError(f"{path}: array {name!r} holds {values.dtype} values, not numbers") from None


def check_survival(times: np.ndarray, events: np.ndarray, where: str) -> None:
    """One line for survival labels that cannot be used."""
    if not np.isfinite(times).all():
        raise DataFileError(f"{where}: survival times must be finite numbers")
    if (times < 0).any():
        raise DataFileError(f"{where}: {int((times < 0).sum())} negative survival time(s)")
    if not np.isin(events, (0, 1)).all():
        bad = sorted({float(v) for v in np.unique(events) if v not in (0, 1)})[:5]
        raise DataFileError(f"{where}: events must be 0 (censored) or 1 (event), found {bad}")
    if events.sum() == 0:
        raise DataFileError(f"{where}: no event observed (every patient censored); nothing to learn from")


def _standardized(
    data: LabeledData, names: list[str], ids: tuple[str, ...], outcome: tuple[str, ...]
) -> LabeledData:
    """``data`` with its features standardized by the training rows' mean and std, recorded (raw
    space, with the column names) in ``preprocessing``: ``predict`` takes raw rows by name, the
    reader's own file included (its ``ids`` identify a row, its ``outcome`` columns are skipped)."""
    mean, std = data.x_train.mean(0), data.x_train.std(0) + 1e-8
    data.x_train = ((data.x_train - mean) / std).astype(np.float32)
    data.x_test = ((data.x_test - mean) / std).astype(np.float32)
    data.preprocessing = {**features(names, mean, std, ids), "outcome_columns": list(outcome)}
    return data


@register("tcga_brca", files=True, task="survival")
def read_tcga_brca(data_dir: str | Path | None) -> LabeledData:
    """Fed-TCGA-BRCA with FLamby's static split and regions (see the module doc)."""
    root = require_dir(data_dir, "tcga_brca", TCGA_LAYOUT)
    missing = [n for n in TCGA_FILES if not (root / n).is_file()]
    if missing:
        raise MissingDataError(
            f"tcga_brca: {', '.join(missing)} not found in {root}; expected:\n{TCGA_LAYOUT}"
        )
    header, rows = _rows(root / "brca.csv")
    if len(header) != 42 or header[0] != "pid" or header[-2:] != ["E", "T"]:
        raise DataFileError(f"{root / 'brca.csv'}: expected 42 columns pid, 39 features, E, T")
    _, split_rows = _rows(root / "train_test_split.csv")
    fold = {r[0]: r[2] for r in split_rows}
    tss_region = tss_regions(root)
    data = {"train": [], "test": []}
    for i, r in enumerate(rows, 2):
        if r[0] not in fold:
            continue  # FLamby's split leaves 8 patients out
        part, _, region = fold[r[0]].partition("_")
        if part not in data or not region.isdigit() or int(region) >= REGIONS:
            raise DataFileError(f"train_test_split.csv: {r[0]} has fold2 {fold[r[0]]!r}, not train_K/test_K")
        try:
            values = [float(v) for v in r[1:]]
        except ValueError as e:
            raise DataFileError(f"{root / 'brca.csv'} line {i}: {e}") from e
        data[part].append((values[:-2], values[-2], values[-1], int(region), r[0].split("-")[1]))
    out = {}
    for part, items in data.items():
        x = np.array([v[0] for v in items], dtype=np.float64)
        events, times = np.array([v[1] for v in items]), np.array([v[2] for v in items])
        check_survival(times, events, f"tcga_brca {part}")
        out[part] = (x, events.astype(np.int64), times, np.array([v[3] for v in items], dtype=np.int64))
    seen: dict[int, set[int]] = {}
    for part in data.values():
        for *_, region, tss in part:
            if tss in tss_region:
                seen.setdefault(region, set()).add(tss_region[tss])
    mixed = {k: sorted(v) for k, v in seen.items() if len(v) > 1}
    if mixed or len({min(v) for v in seen.values()}) != len(seen):
        raise DataFileError(f"tcga_brca: the split's regions disagree with centers.csv's ({mixed or seen})")
    data = LabeledData(
        "tcga_brca", out["train"][0], out["train"][1], out["test"][0], out["test"][1], 2,
        groups_train={"source": out["train"][3], "time": out["train"][2]},
        label_names=SURVIVAL_LABELS,
        groups_test={"source": out["test"][3], "time": out["test"][2]},
        default_positive=(1,), source_names=tuple(f"region {k}" for k in range(REGIONS)),
    )  # fmt: skip
    return _standardized(data, header[1:-2], ("pid",), ("E", "T"))


def tss_regions(data_dir: str | Path) -> dict[str, int]:
    """{tissue-source-site code: region id} from ``centers.csv`` (regions in sorted name order)."""
    _, center_rows = _rows(Path(data_dir) / "centers.csv")
    names = sorted({r[-1] for r in center_rows})
    return {r[0]: names.index(r[-1]) for r in center_rows}


def read_survival_table(
    path: str | Path, time: str = "time", event: str = "event", name: str = "survival"
) -> LabeledData:
    """A generic survival ``.csv``/``.npz`` (see the module doc)."""
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"{path}: no such file")
    if path.suffix == ".npz":
        columns = _npz_columns(path)
        feature_names = [k for k in columns if k not in (time, event, "source", "split")]
        if "x" in columns and len(feature_names) > 1:
            others = ", ".join(repr(k) for k in feature_names if k != "x")
            raise DataFileError(
                f"{path}: holds 'x' and other feature arrays ({others}); put every feature in 'x' "
                "or give each its own named array without 'x'"
            )
        numeric = {k: _numbers(columns[k], path, k) for k in (["x"] if "x" in columns else feature_names)}
        if "x" in numeric:
            x = numeric["x"].reshape(len(numeric["x"]), -1)
            feature_names = [f"x{i}" for i in range(x.shape[1])]
        else:
            x = np.stack(list(numeric.values()), 1) if numeric else None
        lengths = {k: len(v) for k, v in columns.items() if k in (time, event, "source", "split", *numeric)}
        if len(set(lengths.values())) > 1:
            raise DataFileError(
                f"{path}: arrays of different lengths ({lengths}); one row per patient in each"
            )
    else:
        header, rows = _rows(path)
        if len(set(header)) != len(header):
            raise DataFileError(f"{path}: duplicated column name(s) in the header")
        for i, r in enumerate(rows, 2):
            if len(r) != len(header):
                raise DataFileError(
                    f"{path} line {i}: {len(r)} fields under a header of {len(header)} columns"
                )
        table = {h: [r[i] for r in rows] for i, h in enumerate(header)}
        columns = {}
        for h, cells in table.items():
            if h in ("source", "split"):
                columns[h] = np.array(cells)
                continue
            try:
                columns[h] = np.array([float(c) for c in cells])
            except ValueError as e:
                raise DataFileError(f"{path}: column {h!r} is not numeric ({e})") from e
        feature_names = [h for h in header if h not in (time, event, "source", "split")]
        x = np.stack([columns[h] for h in feature_names], 1) if feature_names else None
    for needed in (time, event):
        if needed not in columns:
            raise DataFileError(f"{path}: no {needed!r} column (the survival {needed} column)")
    if x is None or x.shape[1] == 0:
        raise DataFileError(f"{path}: no feature column besides {time!r} and {event!r}")
    for column in (time, event):
        if np.ndim(columns[column]) != 1:
            raise DataFileError(
                f"{path}: {column!r} has shape {tuple(np.shape(columns[column]))}; one value per patient"
            )
    times, events = _numbers(columns[time], path, time), _numbers(columns[event], path, event)
    check_survival(times, events, str(path))
    bad = np.flatnonzero(~np.isfinite(x).all(1))
    if bad.size:
        rows = ", ".join(str(int(i)) for i in bad[:5]) + (", …" if bad.size > 5 else "")
        raise DataFileError(
            f"{path}: {bad.size} row(s) with NaN/inf features (data rows {rows}, 0-based); fix or drop them"
        )
    names = list(feature_names)
    groups, sites = {"time": times}, ()
    if "source" in columns:
        groups["source"], names_of_sources = codes([str(v) for v in columns["source"]])
        sites = tuple(names_of_sources)
    y = events.astype(np.int64)
    if "split" in columns:
        split = np.array([str(v).strip().lower() for v in columns["split"]])
        unknown = sorted({str(v) for v in split} - {"train", "test"})
        if unknown:
            raise DataFileError(
                f"{path}: split column holds {unknown[:5]}; each row's split must be 'train' or 'test' "
                "(validation is carved from train by data.validation_fraction)"
            )
        test = split == "test"
        if test.all() or not test.any():
            raise DataFileError(f"{path}: the split column must mark both train and test rows")
        data = LabeledData(
            name, x[~test], y[~test], x[test], y[test], 2,
            groups_train={k: v[~test] for k, v in groups.items()}, label_names=SURVIVAL_LABELS,
            groups_test={k: v[test] for k, v in groups.items()}, default_positive=(1,), source_names=sites,
        )  # fmt: skip
        return _standardized(data, names, (), (time, event, "split"))
    data = split_labeled(name, x, y, 2, groups=groups, label_names=SURVIVAL_LABELS)
    data.default_positive = (1,)
    data.source_names = sites
    return _standardized(data, names, (), (time, event, "split"))


SURVIVAL_LAYOUT = (
    "  <data_dir>/survival.csv (a header; columns time, event (1 = event, 0 = censored), numeric features;\n"
    "  optional source (site names) and split (train/test)), or survival.npz with the same arrays"
)


@register("survival", files=True, task="survival")
def read_survival_dir(data_dir: str | Path | None) -> LabeledData:
    """The generic time/event table ``survival.csv`` (or ``.npz``) of ``data_dir`` (module doc)."""
    root = require_dir(data_dir, "survival", SURVIVAL_LAYOUT)
    for candidate in (root / "survival.csv", root / "survival.npz"):
        if candidate.is_file():
            return read_survival_table(candidate)
    raise MissingDataError(
        f"survival: no survival.csv or survival.npz in {root}; expected:\n{SURVIVAL_LAYOUT}"
    )

"""The data ``fedxrisk evaluate`` scores: :class:`Scored`, labelled manifests read in streamed batches.

Also the other two sources of scored rows: a run's own test set and client shards rebuilt from its
config (:func:`run_data`), and a registered reader's split (:func:`dataset_data`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.data.types import site_name
from fedxrisk.inference import InputError, TrainedModel

Progress = Callable[[int, int], None]


def _columns(a: np.ndarray) -> np.ndarray:
    return a.reshape(len(a), -1).astype(np.float64)


@dataclass
class Scored:
    """Labels ``[N, L]`` (NaN: unknown) and logits ``[N, L]``, with optional named groups of rows."""

    y: np.ndarray
    scores: np.ndarray
    description: str
    group_kind: str | None = None  # "client" | "site"
    groups: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)  # (name, y, scores)
    groups_split: str = (
        "test"  # "train": the groups are training shards (in-sample), apart from the test table
    )
    shards: list[tuple[np.ndarray, np.ndarray]] | None = None  # (y, scores) per client's training
    # shard: summary.json's client_auroc_mean is defined on them
    validation: tuple[np.ndarray, np.ndarray] | None = None  # the run's validation (y, scores), if any


def _manifest_data(
    trained: TrainedModel, manifest: str | Path, batch_size: int, workers: int, progress
) -> Scored:
    from fedxrisk.inputs import open_input

    source = open_input(manifest, trained.input_shape, workers, trained.preprocessing)
    if source.kind != "manifest":
        raise InputError(
            f"{manifest}: --manifest expects a CSV (or a folder with manifest.csv) with a 'path' column"
        )
    y = _manifest_labels(source.path, source.rows, trained)
    scores = []
    for batch in source.batches(batch_size):
        scores.append(_columns(trained.logits(batch.x)))
        if progress:
            progress(sum(len(s) for s in scores), source.count)
    s = np.concatenate(scores)
    groups = []
    if "source" in source.rows[0]:
        sites = np.array([r["source"] for r in source.rows])
        groups = [(str(v), y[sites == v], s[sites == v]) for v in sorted(set(sites))]  # the column's names
    return Scored(y, s, f"manifest {manifest}", "site" if groups else None, groups)


def _manifest_labels(path: Path, rows: Sequence[dict[str, str]], trained: TrainedModel) -> np.ndarray:
    """``[N, L]`` labels of a manifest for this model: its label columns (multi-label) or one class column."""
    header = list(rows[0])
    if trained.num_labels > 1:
        missing = [c for c in trained.label_names if c not in header]
        if missing:
            raise InputError(f"{path}: label column(s) {missing} missing (header: {header})")
        columns = trained.label_names
    else:
        from fedxrisk.data.readers.images import RESERVED_COLUMNS

        candidates = (
            ["label"]
            if "label" in header
            else [c for c in header if c not in (*RESERVED_COLUMNS, "Path", "id")]
        )
        if len(candidates) != 1:
            raise InputError(f"{path}: needs one label column ('label'), found candidates {candidates}")
        columns = candidates
    if trained.num_labels == 1:
        return _class_labels(path, [(r[columns[0]] or "").strip() for r in rows], columns[0], trained)
    y = np.empty((len(rows), len(columns)))
    for i, r in enumerate(rows):
        for j, c in enumerate(columns):
            text = (r[c] or "").strip()
            try:
                y[i, j] = float(text) if text else 0.0
            except ValueError:
                raise InputError(f"{path} row {i + 2}: label {c}={text!r} is not a number") from None
            if not math.isfinite(y[i, j]):
                raise InputError(
                    f"{path} row {i + 2}: label column {c!r} holds {text!r}, not a finite number; "
                    "give 1, 0, blank or -1 (uncertain)"
                )
    y[y == -1] = np.nan  # uncertain: left out of that label
    if not np.isin(y[~np.isnan(y)], (0, 1)).all():
        raise InputError(f"{path}: multi-label values must be 1, 0, blank or -1 (uncertain)")
    return y


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _class_labels(path: Path, texts: list[str], column: str, trained: TrainedModel) -> np.ndarray:
    """``[N, 1]`` 0/1 labels of one class column: class names or ids of the run's data, mapped
    through the run's positive class(es); without a record of them, the values must be 0/1."""
    rec = trained.positive or {}
    names, ids = rec.get("names") or [], rec.get("ids") or _int_ids(trained.config.positive_classes)
    for i, t in enumerate(texts):
        if t and _number(t) is not None and not math.isfinite(_number(t)):
            raise InputError(
                f"{path} row {i + 2}: label column {column!r} holds {t!r}, not a finite number; "
                "give 1, 0, blank or -1 (uncertain)"
            )
    if any(t and _number(t) is None for t in texts):
        if not names:
            raise InputError(
                f"{path}: {column!r} holds class names, but the run records none; use 0/1 labels"
            )
        return np.isin(texts, names).astype(np.float64)[:, None]
    y = np.array([float(t) if t else 0.0 for t in texts])
    y[y == -1] = np.nan  # uncertain: left out
    if ids:  # class ids of the run's data; the run records its positive ids, not how many classes there were
        top = max(1, *ids)
        known = y[~np.isnan(y)]
        if not (np.isin(known, np.arange(top + 1))).all():
            raise InputError(
                f"{path}: labels in {column!r} must be class ids 0..{top} of the run's data (positive: "
                f"{', '.join(map(str, ids))}), or 0/1"
            )
        return np.where(np.isnan(y), np.nan, np.isin(y, ids))[:, None].astype(np.float64)
    if not np.isin(y[~np.isnan(y)], (0, 1)).all():
        raise InputError(
            f"{path}: labels in {column!r} must be 0/1 (or the run must set data.positive_classes)"
        )
    return y[:, None]


def _int_ids(classes: Sequence[int | str] | None) -> list[int]:
    return [int(c) for c in classes or () if isinstance(c, int) or str(c).isdigit()]


def run_data(trained: TrainedModel, model: TrainedModel | None = None) -> Scored:
    """The run's own test set and client shards, rebuilt from its config (as training built them),
    scored by ``model`` (default: the run's own; ``--against``: the other run's), with the
    validation data's labels and scores when the data has a validation split."""
    from fedxrisk.run.build import build_data

    model = model or trained
    try:
        fed, _ = build_data(trained.config)
    except ValueError as e:
        raise InputError(f"{trained.run_dir}: cannot rebuild the run's data ({e})") from e
    y_train, s_train = _columns(fed.data.y_train.numpy()), _columns(model.model_logits(fed.data.x_train))
    shards = [(y_train[s], s_train[s]) for s in fed.shards]
    y_test, s_test = _columns(fed.data.y_test.numpy()), _columns(model.model_logits(fed.data.x_test))
    x_val, y_val = fed.data.x_val, fed.data.y_val
    validation = (
        None
        if x_val is None or y_val is None
        else (_columns(y_val.numpy()), _columns(model.model_logits(x_val)))
    )
    portions = client_test_portions(trained.config.partition, fed.data, fed.shards)
    if portions is None:  # no test rows of its own: the training shard, labelled as such
        clients, split = [(f"client {k}", y, s) for k, (y, s) in enumerate(shards)], "train"
    else:  # a client is a site: named as the reader names it (a hospital, a source value)
        names = fed.data.source_names
        clients = [
            (site_name(names, site) if names else f"client {k}", y_test[m], s_test[m])
            for k, (site, m) in enumerate(portions)
        ]
        split = "test"
    where = f"the run's test set ({trained.config.dataset})"
    return Scored(y_test, s_test, where, "client", clients, split, shards, validation)


def client_test_portions(
    partition: str, data: Any, shards: Sequence[Any]
) -> list[tuple[int, np.ndarray]] | None:
    """Each client's site id and own test rows (a boolean mask over the test set): with
    ``partition = 'source'`` a client is one site, and its test rows are that site's, when the reader
    kept the test rows' sites (``groups_test['source']``); None otherwise (a client is not a site,
    or the test rows' sites are unknown)."""
    train, test = data.groups_train.get("source"), data.groups_test.get("source")
    if partition != "source" or train is None or test is None:
        return None
    masks = []
    for shard in shards:
        site = np.unique(np.asarray(train)[np.asarray(shard)])
        if len(site) != 1:
            return None
        masks.append((int(site[0]), np.asarray(test) == site[0]))
    return masks


def dataset_data(
    trained: TrainedModel, dataset: str, data_dir: str | None, split: str, workers: int,
    model: TrainedModel | None = None,
) -> Scored:  # fmt: skip
    """A registered reader's split, read lazily (file datasets) and decoded chunk by chunk."""
    from fedxrisk.data.lazy import is_lazy

    data = read_for_model(trained, dataset, data_dir, lazy=True)
    if data.input_shape != trained.input_shape or data.num_labels != trained.num_labels:
        raise InputError(
            f"{dataset}: inputs {list(data.input_shape)} with {data.num_labels} label(s); the model takes "
            f"{list(trained.input_shape)} with {trained.num_labels}"
        )
    x, y = (data.x_test, data.y_test) if split == "test" else (data.x_train, data.y_train)
    if is_lazy(x):
        x.attach(workers=workers)
    y, s = _columns(y.numpy()), _columns((model or trained).model_logits(x))
    sites = (data.groups_train if split == "train" else data.groups_test).get("source")
    names = data.source_names
    groups = (
        []
        if sites is None
        else [(site_name(names, v), y[sites == v], s[sites == v]) for v in np.unique(sites)]
    )
    where = f" in {data_dir}" if data_dir else ""
    return Scored(y, s, f"{dataset}{where}, {split} split", "site" if groups else None, groups, split)


def read_for_model(trained: TrainedModel, dataset: str, data_dir: str | None, lazy: bool = False) -> Any:
    """A registered reader's data as ``trained`` was trained on it (``evaluate`` and ``cross-site``
    ``--dataset``): images at the size its model.pt records, missing cells as its run handled them,
    labels binarized by its positive classes; :class:`InputError` naming a bad dataset or file."""
    from fedxrisk.data import DATASETS
    from fedxrisk.data.loading import load_dataset
    from fedxrisk.data.preprocessing import IMAGE_DATASETS
    from fedxrisk.data.types import binarize

    if dataset not in DATASETS:
        raise InputError(f"unknown dataset {dataset!r}; choose one of {sorted(DATASETS)}")
    size = trained.preprocessing.get("image_size") if dataset in IMAGE_DATASETS else None
    try:
        labeled = load_dataset(
            dataset, data_dir, lazy=lazy, image_size=size, on_missing=trained.config.on_missing
        )
        return binarize(labeled, trained.config.positive_classes)
    except ValueError as e:
        raise InputError(str(e)) from e

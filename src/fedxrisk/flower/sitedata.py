"""A site's own data, located by its SuperNode's node config; the server's held-out set.

A SuperNode is started with ``--node-config`` naming either

- ``data-dir="/path"``: a folder holding ``train.npz`` (arrays ``x``, ``y``) or
  ``train.csv`` (a header row, a ``label`` column, numeric feature columns),
  and optionally ``val.npz`` / ``val.csv``, its validation data, and ``test.npz`` /
  ``test.csv``, its own test data (read when the run is personalized: each site scores its
  own model on it, flower/site_personal.py); or
- ``dataset="digits" partition-id=K num-partitions=N``: a trial site holding
  part K of a bundled dataset split the way ``fedxrisk run`` splits it (the
  split settings come from the run config, so every site agrees); with the run
  config's ``validation = FRACTION`` the site's validation data is carved from its
  part per class exactly as ``data.validation`` carves client K's; its test rows are those
  ``fedxrisk run`` scores client K's model on (its site's own rows, else the whole test split).

Labels are binary (0/1). A site only ever loads its own folder or its own part.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.data import DATASETS, FederatedData, binarize, load_dataset
from fedxrisk.data.checks import DataFileError, check_features, read_text
from fedxrisk.engines.personal import site_test_rows
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.personal import personalized

LABEL_COLUMN = "label"


class SiteDataError(ValueError):
    """A site's data is missing or unusable; the message names the file and the problem."""


@dataclass
class SiteData:
    """One site's training data (and optional validation data), as tensors."""

    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor  # what ``batch["index"]`` carries: global index in trials, else local
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    order: int | None = None  # the node config's ``partition-id``: the site's place in the order
    source: str = ""
    x_test: torch.Tensor | None = None  # the site's own test rows (per-site evaluation), if any
    y_test: torch.Tensor | None = None
    test_rows: str = ""  # "own": the site's own test rows; "all": a trial site's whole test split
    model_out: str = ""  # node config site-model: where the site writes its own model at the end

    @property
    def num_samples(self) -> int:
        return len(self.y)

    @property
    def num_positives(self) -> int:
        return int(self.y.sum())

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def check_classes(self, allow_missing_class: bool) -> None:
        pos, n = self.num_positives, self.num_samples
        if allow_missing_class or 0 < pos < n:
            return
        missing = "positive (label 1)" if pos == 0 else "negative (label 0)"
        raise SiteDataError(
            f"{self.source}: the site's training data has no {missing} example among {n} samples; "
            "AUC objectives need both classes on every site (set allow-missing-class = true in the "
            "run config to let such a site train on the loss terms of the class it holds)"
        )


def read_table(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` from ``.npz`` (arrays ``x``, ``y``) or ``.csv`` (header, ``label`` column)."""
    if path.suffix == ".npz":
        with np.load(path) as f:
            missing = [k for k in ("x", "y") if k not in f]
            if missing:
                raise SiteDataError(f"{path}: missing array(s) {missing}; expected arrays 'x' and 'y'")
            x, y = f["x"], f["y"]
    else:
        try:
            rows = list(csv.reader(io.StringIO(read_text(path), newline="")))
        except DataFileError as e:
            raise SiteDataError(str(e)) from None
        if not rows or LABEL_COLUMN not in rows[0]:
            raise SiteDataError(f"{path}: the header row must name a {LABEL_COLUMN!r} column")
        header, body = rows[0], rows[1:]
        label = header.index(LABEL_COLUMN)
        try:
            table = np.array([[float(v) for v in row] for row in body], dtype=np.float64).reshape(
                len(body), -1
            )
        except ValueError as e:
            raise SiteDataError(f"{path}: every value must be numeric ({e})") from e
        if table.shape[1] != len(header):
            raise SiteDataError(f"{path}: rows have {table.shape[1]} values but the header has {len(header)}")
        y = table[:, label]
        x = np.delete(table, label, axis=1)
    if len(x) != len(y):
        raise SiteDataError(f"{path}: {len(x)} inputs but {len(y)} labels")
    try:  # at set-up, so that only this site is blamed (not a NaN loss on every site later)
        check_features(x, str(path), base=0 if path.suffix == ".npz" else 2)
    except DataFileError as e:
        raise SiteDataError(str(e)) from None
    values = np.unique(y)
    if not set(values.tolist()) <= {0.0, 1.0}:
        raise SiteDataError(f"{path}: labels must be binary 0/1; found {values[:10].tolist()}")
    return np.ascontiguousarray(x, dtype=np.float32), y.astype(np.float32)


def _find(folder: Path, stem: str) -> Path | None:
    for suffix in (".npz", ".csv"):
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    return None


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(x), torch.from_numpy(y)


def _read_lazily(path: Path, workers: int) -> tuple[Any, torch.Tensor]:
    """A ``train.npz`` whose inputs stay on disk (memory-mapped, decoded per batch)."""
    from fedxrisk.data.lazy import ArraySource, LazySamples, npz_member

    with np.load(path) as f:
        if "x" not in f or "y" not in f:
            raise SiteDataError(f"{path}: missing array(s) x or y; expected arrays 'x' and 'y'")
        y = f["y"].astype(np.float32)
    x = LazySamples(ArraySource(npz_member(path, "x"), f"{path}:x"))
    if len(x) != len(y) or not set(np.unique(y).tolist()) <= {0.0, 1.0}:
        raise SiteDataError(f"{path}: {len(x)} inputs, {len(y)} labels; labels must be binary 0/1")
    return x.attach(y, workers=workers, on_bad_file="error"), torch.from_numpy(y)


def load_folder(
    folder: str | Path, order: int | None = None, stream: bool = False, workers: int = 0, test: bool = False
) -> SiteData:
    """``stream``: read ``train.npz``'s inputs lazily (``workers`` decoding processes); ``test``: read
    ``test.npz`` / ``test.csv`` too, if the folder holds one."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise SiteDataError(f"data-dir {str(path)!r} does not exist or is not a folder on this site")
    train = _find(path, "train")
    if train is None:
        raise SiteDataError(f"data-dir {str(path)!r} holds neither train.npz nor train.csv")
    if stream and train.suffix == ".npz":
        x, y = _read_lazily(train, workers)
    else:
        x, y = _tensors(*read_table(train))
    if len(y) == 0:
        raise SiteDataError(f"{train}: no training samples")
    val = _find(path, "val")
    x_val, y_val = _tensors(*read_table(val)) if val is not None else (None, None)
    if x_val is not None and x_val.shape[1:] != x.shape[1:]:
        raise SiteDataError(
            f"{val}: inputs of shape {tuple(x_val.shape[1:])}, training inputs {tuple(x.shape[1:])}"
        )
    site = SiteData(x, y, torch.arange(len(y)), x_val, y_val, order, source=str(train))
    held = _find(path, "test") if test else None
    if held is not None:
        site.x_test, site.y_test = _tensors(*read_table(held))
        site.test_rows = "own"
        if site.x_test.shape[1:] != x.shape[1:]:
            raise SiteDataError(
                f"{held}: inputs of shape {tuple(site.x_test.shape[1:])}, training inputs {tuple(x.shape[1:])}"
            )
    return site


def trial_data(cfg: FlowerConfig, dataset: str, num_partitions: int) -> FederatedData:
    """The federated split every trial site (and the ``export`` helper) computes identically:
    ``fedxrisk run``'s own (:func:`~fedxrisk.run.build.build_data`) of the node config's
    ``dataset`` into ``num-partitions`` clients, each part's validation data carved as
    ``data.validation`` carves client k's. A part missing a class is reported by its own site
    (:meth:`SiteData.check_classes`), not by every site."""
    from fedxrisk.run.build import build_data

    trial = dataclasses.replace(cfg.run, dataset=dataset, clients=num_partitions, allow_missing_class=True)
    with warnings.catch_warnings():  # a site reports only its own missing class (check_classes)
        warnings.simplefilter("ignore")
        return build_data(trial)[0]


def trial_part(fed: FederatedData, part: int) -> tuple[torch.Tensor, ...]:
    """Part ``part`` of a trial split: training inputs and labels, validation inputs and labels (or None)."""
    x, y = fed.client_view(part)
    if fed.val_shards is None:
        return x, y, None, None
    rows = torch.from_numpy(fed.val_shards[part].astype(np.int64))
    return x, y, fed.data.x_val[rows], fed.data.y_val[rows]  # type: ignore[index]


def trial_test(fed: FederatedData, part: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Part ``part``'s test rows as ``fedxrisk run`` scores client ``part``'s own model
    (engines/personal.py): its site's rows when the split keeps the sites, else the whole test split."""
    masks = site_test_rows(fed)
    if masks is None:
        return fed.data.x_test, fed.data.y_test, "all"
    rows = torch.from_numpy(np.flatnonzero(masks[part]))
    return fed.data.x_test[rows], fed.data.y_test[rows], "own"


def load_trial(cfg: FlowerConfig, dataset: str, part: int, num_partitions: int) -> SiteData:
    if dataset not in DATASETS:
        raise SiteDataError(f"unknown dataset {dataset!r} in node config; choose one of {sorted(DATASETS)}")
    if not 0 <= part < num_partitions:
        raise SiteDataError(f"partition-id must lie in [0, num-partitions={num_partitions}), got {part}")
    fed = trial_data(cfg, dataset, num_partitions)
    x, y, x_val, y_val = trial_part(fed, part)
    index = torch.from_numpy(fed.shards[part])
    x_test, y_test, rows = trial_test(fed, part)
    return SiteData(
        x, y, index, x_val, y_val, order=part, source=f"{dataset} partition {part}/{num_partitions}",
        x_test=x_test, y_test=y_test, test_rows=rows,
    )  # fmt: skip


def load_site(node_config: Mapping[str, Any], cfg: FlowerConfig) -> SiteData:
    """Load this site's data as its node config says, and check it can train."""
    order = node_config.get("partition-id")
    if order is not None and not isinstance(order, int):
        raise SiteDataError(f"partition-id must be an integer, got {order!r}")
    if "data-dir" in node_config:
        stream = node_config.get("stream", False)
        workers = node_config.get("workers", 0)
        if not isinstance(stream, bool) or not isinstance(workers, int) or workers < 0:
            raise SiteDataError(
                f"node config stream must be true/false and workers an integer ≥ 0, got {stream!r}, {workers!r}"
            )
        site = load_folder(str(node_config["data-dir"]), order, stream, workers, personalized(cfg))
    elif "dataset" in node_config:
        if order is None or "num-partitions" not in node_config:
            raise SiteDataError("a trial site needs node config dataset, partition-id and num-partitions")
        site = load_trial(cfg, str(node_config["dataset"]), order, int(node_config["num-partitions"]))
    else:
        raise SiteDataError(
            "node config names no data: start the SuperNode with --node-config 'data-dir=\"/path\"' "
            "(a folder with train.npz or train.csv) or, for a trial, "
            "'dataset=\"digits\" partition-id=0 num-partitions=2'"
        )
    site.check_classes(cfg.run.allow_missing_class or not ALGORITHMS[cfg.run.algorithm].needs_both_classes)
    return site


def load_holdout(spec: str, cfg: FlowerConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The server's held-out set: a file (npz/csv), a bundled dataset's test split, or none."""
    if not spec:
        return None
    if spec in DATASETS:
        data = binarize(load_dataset(spec), cfg.run.positive_classes)
        return data.x_test, data.y_test
    path = Path(spec).expanduser()
    if not path.is_file():
        raise SiteDataError(f"test-data {spec!r} is neither a file on the server nor a bundled dataset")
    return _tensors(*read_table(path))


def export_trial(cfg: FlowerConfig, dataset: str, sites: int, out: str | Path) -> list[Path]:
    """Write a trial split as site folders ``site-K/train.npz`` (and ``val.npz`` with the run
    config's ``validation``; ``test.npz``, the site's test rows, when the run is personalized)
    and the test split as ``test.npz``.

    The folders hold exactly what trial site K would load, so a folder-based
    deployment reproduces the trial (and the ``loop`` engine) sample for sample.
    """
    from fedxrisk.outfiles import check_folder, make_folder, replace_atomic

    root = Path(out)
    check_folder(root, _an_export, "exported trial")  # a user's folder is never written into
    fed = trial_data(cfg, dataset, sites)
    save = lambda path, **arrays: replace_atomic(path, lambda f: np.savez(f, **arrays), "wb")  # noqa: E731
    paths = []
    for k in range(sites):
        folder = root / f"site-{k}"
        make_folder(folder)
        x, y, x_val, y_val = trial_part(fed, k)
        save(folder / "train.npz", x=x.numpy(), y=y.numpy())
        if x_val is not None and y_val is not None:
            save(folder / "val.npz", x=x_val.numpy(), y=y_val.numpy())
        if personalized(cfg):
            x_test, y_test, _ = trial_test(fed, k)
            save(folder / "test.npz", x=x_test.numpy(), y=y_test.numpy())
        paths.append(folder)
    save(root / "test.npz", x=fed.data.x_test.numpy(), y=fed.data.y_test.numpy())
    return paths


def _an_export(root: Path) -> bool:
    """``root`` holds an earlier export only (``site-K`` folders and ``test.npz``): it may be rewritten."""
    entries = list(root.iterdir())
    return bool(entries) and all(
        p.name == "test.npz" or (p.name.startswith("site-") and p.is_dir() and not p.is_symlink())
        for p in entries
    )

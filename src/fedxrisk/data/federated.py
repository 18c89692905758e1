"""A binary training set split over clients, and batches drawn from it."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedxrisk.data.checks import check_labeled, check_test_classes
from fedxrisk.data.imbalance import make_imbalanced
from fedxrisk.data.loading import load_dataset
from fedxrisk.data.partition import partition
from fedxrisk.data.shift import feature_shift as shift_features
from fedxrisk.data.types import BinaryData, binarize, site_name
from fedxrisk.errors import ConfigError


def training_batch(
    x: Any, y: torch.Tensor, index: torch.Tensor, local: torch.Tensor, device: torch.device | str = "cpu",
    times: np.ndarray | None = None, uniforms: np.ndarray | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """A training batch as every engine and every Flower site hands it to ``local_step``: ``x``,
    ``y``, ``index`` (global), ``local_index`` (positions in the client's shard), ``time`` for
    survival data (float32: days and the like are exact), ``uniform`` when the algorithm asks."""
    batch = {"x": x.to(device), "y": y.to(device), "index": index.to(device), "local_index": local.to(device)}
    if times is not None:
        batch["time"] = torch.from_numpy(np.asarray(times).astype(np.float32)).to(device)
    if uniforms is not None:
        batch["uniform"] = torch.from_numpy(uniforms).to(device)
    return batch


@dataclass
class FederatedData:
    """Training data (after imbalance) with one index shard per client, and the global test set."""

    data: BinaryData
    shards: list[np.ndarray]
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None  # e.g. data.augment.RandomCropFlip
    stream: Any = None  # a data.stream.Stream decoding lazy inputs (data.x_train is LazySamples)
    val_shards: list[np.ndarray] | None = None  # per client, positions in data.x_val (data/validation.py)

    def __post_init__(self) -> None:
        width = max(len(s) for s in self.shards)
        table = np.zeros((len(self.shards), width), dtype=np.int64)
        for k, s in enumerate(self.shards):
            table[k, : len(s)] = s
        self._table = torch.from_numpy(table)
        self._rows = torch.arange(len(self.shards))[:, None]

    @property
    def num_clients(self) -> int:
        return len(self.shards)

    @property
    def shard_sizes(self) -> list[int]:
        return [len(s) for s in self.shards]

    def client_pos_ratio(self, k: int) -> float | list[float]:
        y = self.data.y_train[torch.from_numpy(self.shards[k])]
        return y.mean(0).tolist() if y.dim() == 2 else float(y.mean())

    def client_counts(self) -> list[tuple[int, int]] | list[tuple[list[int], list[int]]]:
        """(positives, negatives) held by each client (per label for multi-label data)."""
        y = self.data.y_train
        out = []
        for s in self.shards:
            ys = y[torch.from_numpy(s)]
            if ys.dim() == 2:
                pos_l = ys.sum(0).long().tolist()
                out.append((pos_l, [len(s) - p for p in pos_l]))
                continue
            pos = int(ys.sum())
            out.append((pos, len(s) - pos))
        return out

    def client_sites(self) -> list[str] | None:
        """The site each client is (its reader's name for it), when every client holds one site's
        rows (``partition = 'source'``, a ``data.sources`` subset); None otherwise."""
        source = self.data.groups_train.get("source")
        if source is None:
            return None
        sites = [np.unique(source[s]) for s in self.shards]
        if any(len(site) != 1 for site in sites):
            return None
        return [site_name(self.data.source_names, site[0]) for site in sites]

    def batch(
        self, positions: np.ndarray, device: torch.device | str = "cpu", rows: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Stacked batch for local positions ``[K, B]``: x, y, index (global), local_index, and
        ``time`` for survival data (float32: days and the like are exact). ``rows``: the clients
        the positions belong to (a round's participants), default all."""
        local = torch.from_numpy(positions)
        index = self._table[self._rows if rows is None else rows.cpu().reshape(-1, 1), local]
        if self.stream is not None:  # decoded (and augmented) by DataLoader workers
            x = self.stream.fetch(index.numpy(), self.augment)
        else:
            x = self.data.x_train[index]
            x = self.augment(x) if self.augment is not None else x
        times = self.data.groups_train.get("time")  # survival data: y is the event, time beside it
        times = times[index.numpy()] if times is not None else None
        return training_batch(x, self.data.y_train[index], index, local, device, times)

    def subset(self, clients: Sequence[int]) -> FederatedData:
        """The shards of ``clients`` only (a rank's or a site's), with the same augmentation and
        stream settings."""
        stream = self.stream.subset(clients) if self.stream is not None else None
        val = [self.val_shards[k] for k in clients] if self.val_shards is not None else None
        return FederatedData(self.data, [self.shards[k] for k in clients], self.augment, stream, val)

    def client_view(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.shards[k])
        return self.data.x_train[idx], self.data.y_train[idx]


def check_client_classes(
    fed: FederatedData, allow_missing_class: bool, one_class_ok: bool = False
) -> list[int]:
    """Clients lacking positives or negatives: an error unless explicitly allowed.

    When allowed, such clients still train: the AUC losses use the configured
    p and contribute only the terms of the class they hold; their per-client
    AUROC is undefined and left out of the per-client mean. ``one_class_ok``:
    the objective is defined on one class (cross-entropy), so such clients are
    ordinary: no error, no warning.
    """
    lacking = [
        k
        for k, (pos, neg) in enumerate(fed.client_counts())
        if min(np.atleast_1d(pos)) == 0 or min(np.atleast_1d(neg)) == 0
    ]
    if one_class_ok:
        return lacking
    if lacking and not allow_missing_class:
        counts = fed.client_counts()
        detail = ", ".join(f"client {k}: {counts[k][0]} pos / {counts[k][1]} neg" for k in lacking[:5])
        raise ValueError(
            f"{len(lacking)} client(s) hold only one class ({detail}). Use fewer clients, "
            "a higher imratio, another partition, or allow_missing_class=True "
            "(--allow-missing-class) to train anyway: such clients then contribute only "
            "the loss terms of the class they hold. (Cross-entropy baselines such as localsgdm "
            "accept such clients as they are.)"
        )
    if lacking:
        warnings.warn(f"clients {lacking[:10]} hold only one class", stacklevel=2)
    return lacking


def keep_sources(data: BinaryData, sources: Sequence[str]) -> BinaryData:
    """``data`` with the training rows of the named sources only (``data.sources``: a local-only
    baseline, or a subset of the sites). The test set stays whole, so that runs trained on
    different sites are scored on the same patients; each site's share is still told apart."""
    train = data.groups_train.get("source")
    if train is None:
        raise ValueError(f"data.sources: {data.name} has no sites (no 'source' column or site folders)")
    names = list(data.source_names) or [f"site {k}" for k in range(int(np.max(train)) + 1)]
    unknown = [s for s in sources if s not in names]
    if unknown or not sources:
        raise ValueError(f"data.sources: {unknown or 'none'} not among {data.name}'s sites {names}")
    if len(set(sources)) < len(sources):
        raise ValueError(f"data.sources names a site twice: {list(sources)}")
    keep = np.flatnonzero(np.isin(train, [names.index(s) for s in sources]))
    rows = torch.from_numpy(keep)
    return dataclasses.replace(
        data, x_train=data.x_train[rows], y_train=data.y_train[rows], classes_train=data.classes_train[keep],
        groups_train={k: v[keep] for k, v in data.groups_train.items()},
    )  # fmt: skip


def make_federated(
    dataset: str | BinaryData,
    num_clients: int,
    partition_kind: str = "class",
    imratio: float | None = 0.1,
    seed: int = 0,
    positive_classes: Sequence[int | str] | None = None,
    dirichlet_alpha: float = 0.5,
    allow_missing_class: bool = False,
    data_dir: str | None = None,
    feature_shift: bool = False,
    one_class_ok: bool = False,
    num_samples: int | None = None,
    test_imratio: float | None = None,
    image_size: int | None = None,
    sources: Sequence[str] | None = None,
    on_missing: str = "error",
) -> FederatedData:
    """Load, binarize, imbalance (train only) and partition a dataset, reproducibly from ``seed``.

    ``data_dir`` is where file datasets are read from (see :mod:`fedxrisk.data.readers`);
    ``feature_shift`` adds FeDXL's per-client Gaussian feature shift (``data.shift``);
    ``one_class_ok``: see :func:`check_client_classes`.
    ``num_samples`` sizes a generated dataset (mnist1d, synthetic) before its split;
    ``image_size`` resizes an image dataset's images (:func:`~fedxrisk.data.loading.load_dataset`).
    ``test_imratio``: thin the test set to this positive ratio too (by a fixed draw, the same
    for every seed); None keeps the test set's own prevalence. ``sources``: train on the named
    sources' rows only (:func:`keep_sources`).
    """
    if isinstance(dataset, BinaryData):
        data = dataset
    else:
        labeled = load_dataset(
            dataset, data_dir, num_samples=num_samples, image_size=image_size, on_missing=on_missing
        )
        check_labeled(labeled, data_dir or dataset)
        data = binarize(labeled, positive_classes)
        check_test_classes(data, data_dir or dataset)
    if data.y_train.dim() == 2 and imratio is not None:
        raise ValueError(
            f"{data.name} is multi-label: imratio applies to one binary label; set imratio = None (--imratio none)"
        )
    if data.y_test.dim() == 2 and test_imratio is not None:
        raise ValueError(f"{data.name} is multi-label: test_imratio applies to one binary label")
    if sources is not None:
        data = keep_sources(data, sources)
    rng = np.random.default_rng([seed, 1])
    kept = make_imbalanced(data.y_train.numpy(), imratio, rng)
    tested = torch.from_numpy(
        make_imbalanced(data.y_test.numpy(), test_imratio, np.random.default_rng([0, 3]))
    )
    data = BinaryData(
        name=data.name,
        x_train=data.x_train[torch.from_numpy(kept)],
        y_train=data.y_train[torch.from_numpy(kept)],
        x_test=data.x_test if test_imratio is None else data.x_test[tested],
        y_test=data.y_test[tested],
        classes_train=data.classes_train[kept],
        positive_classes=data.positive_classes,
        groups_train={k: v[kept] for k, v in data.groups_train.items()},
        label_names=data.label_names,
        x_val=data.x_val,
        y_val=data.y_val,
        groups_test={k: v[tested.numpy()] for k, v in data.groups_test.items()},
        preprocessing=data.preprocessing,
        source_names=data.source_names,
    )
    shards = partition(
        partition_kind, data.y_train.numpy(), data.classes_train, num_clients, rng, dirichlet_alpha,
        data.groups_train,
    )  # fmt: skip
    if feature_shift:
        data = shift_features(data, shards, np.random.default_rng([seed, 2]))
    fed = FederatedData(data, shards)
    check_client_classes(fed, allow_missing_class, one_class_ok)
    return fed


def every_client(rows: torch.Tensor | None, what: str) -> None:
    """Refuse a round's participant subset for task data that draws for every client at once (the
    FCSG studies' AUPRC, invariant-regression and few-shot tasks): partial participation is for the
    run's own data (``data.clients_per_round``)."""
    if rows is not None:
        raise ConfigError(
            f"{what} draws a batch for every client at once; data.clients_per_round (partial "
            "participation) is for fedxrisk's own datasets: leave it unset with this task"
        )

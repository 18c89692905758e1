"""Validation splits carved from the clients' training shards (for tuning; never the test set)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from fedxrisk.data.federated import FederatedData


def hold_out(data: FederatedData, seed: int, fraction: float = 0.2) -> FederatedData:
    """``fraction`` of every client's shard held out; the result's *test* set is that
    held-out union, so any evaluation of the returned data measures validation metrics.

    The real test set is dropped from the returned data: code tuning on it cannot reach it.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction}")
    rng = np.random.default_rng([seed, 99])
    shards, held = [], []
    for shard in data.shards:
        perm = rng.permutation(shard)
        cut = int(len(shard) * fraction)
        held.append(perm[:cut])
        shards.append(np.sort(perm[cut:]))
    val = torch.from_numpy(np.concatenate(held))
    binary = replace(data.data, x_test=data.data.x_train[val], y_test=data.data.y_train[val])
    return FederatedData(binary, shards, data.augment)


def hold_out_instances(
    pool: list[np.ndarray], seed: int, fraction: float = 0.2
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split every class of a few-shot class pool into (training, validation) instances:
    validation tasks then use the training classes' held-out instances."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction}")
    rng = np.random.default_rng([seed, 98])
    train, val = [], []
    for cls in pool:
        perm = rng.permutation(len(cls))
        cut = int(len(cls) * fraction)
        val.append(cls[np.sort(perm[:cut])])
        train.append(cls[np.sort(perm[cut:])])
    return train, val

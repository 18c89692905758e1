"""FeDXL's heterogeneity protocol (ALGORITHMS.md §3): i.i.d. labels plus a per-client feature shift.

Client k's training inputs get fixed Gaussian noise N(μ_k, σ²) added elementwise,
μ_k = (k − K/2) · ``step`` (0.01 in the paper's code), σ = ``std`` (0.2). The
noise is drawn once from the run's seed (not per batch); the test set is untouched.
"""

from __future__ import annotations

import numpy as np
import torch

from fedxrisk.data.types import BinaryData


def feature_shift(
    data: BinaryData, shards: list[np.ndarray], rng: np.random.Generator, step: float = 0.01, std: float = 0.2
) -> BinaryData:
    """A copy of ``data`` whose training inputs are shifted client by client."""
    if std < 0:
        raise ValueError(f"feature shift std must be ≥ 0, got {std}")
    x = data.x_train.clone()
    num_clients = len(shards)
    for k, shard in enumerate(shards):
        idx = torch.from_numpy(shard)
        noise = rng.normal((k - num_clients / 2) * step, std, size=(len(shard), *x.shape[1:]))
        x[idx] = x[idx] + torch.from_numpy(noise.astype(np.float32))
    return BinaryData(
        data.name,
        x,
        data.y_train,
        data.x_test,
        data.y_test,
        data.classes_train,
        data.positive_classes,
        preprocessing=data.preprocessing,
    )

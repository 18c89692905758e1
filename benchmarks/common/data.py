"""Generated data the benchmarks share (no file is read): the timing benches' random federated
set and the survival algorithms' tiny time/event table."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedxrisk.data.federated import FederatedData


def synthetic_data(shape: tuple[int, ...], clients: int, per_client: int, seed: int = 0) -> FederatedData:
    """Random inputs, 30 % positives, ``per_client`` samples on each client."""
    import numpy as np
    import torch

    from fedxrisk.data.datasets import BinaryData
    from fedxrisk.data.federated import FederatedData

    g = torch.Generator().manual_seed(seed)
    n = clients * per_client
    x = torch.randn((n, *shape), generator=g)
    y = (torch.rand(n, generator=g) < 0.3).float()
    y[::per_client] = 1.0  # every client holds both classes
    y[1::per_client] = 0.0
    data = BinaryData("synthetic", x, y, x[:8], y[:8], y.long().numpy(), (1,))
    shards = [np.arange(k * per_client, (k + 1) * per_client) for k in range(clients)]
    return FederatedData(data, shards)


@functools.cache
def survival_dir() -> str:
    """A tiny generated time/event table (``survival.csv``: 80 patients, 4 features, a hazard
    rising with the first), the survival algorithms' base data: their task is survival, not binary."""
    import csv
    import tempfile

    import numpy as np

    root = Path(tempfile.mkdtemp(prefix="fedxrisk-matrix-"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 4))
    t, c = rng.exponential(np.exp(-x[:, 0])) * 100, rng.exponential(150, 80)
    with open(root / "survival.csv", "w", newline="") as f:
        rows = [[f"{v:.4f}" for v in xi] + [f"{min(a, b):.2f}", int(a <= b)] for xi, a, b in zip(x, t, c)]
        csv.writer(f).writerows([["f0", "f1", "f2", "f3", "time", "event"], *rows])
    return str(root)

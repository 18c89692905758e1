"""Per-client mini-batch samplers with a fixed batch size.

Every client draws from its own NumPy generator seeded by ``(seed, client)``,
walking through successive random permutations of its shard (sampling without
replacement within an epoch). Both simulation engines consume exactly the
same index stream, which is what makes their results comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class ClientSampler:
    """Yields ``[K, B]`` arrays of local sample positions, one row per client."""

    def __init__(
        self,
        shard_sizes: list[int],
        batch_size: int,
        seed: int,
        stream: int = 0,
        clients: Sequence[int] | None = None,
    ):
        """``clients``: the global indices of the shards (default ``0..K-1``); each
        client's stream depends only on ``(seed, stream, client)``, so a process
        holding a subset of the clients draws exactly what the full simulation does."""
        if batch_size < 1:
            raise ValueError(f"batch size must be ≥ 1, got {batch_size}")
        self.sizes = list(shard_sizes)
        self.batch_size = batch_size
        ids = range(len(shard_sizes)) if clients is None else list(clients)
        if len(ids) != len(shard_sizes):
            raise ValueError(f"{len(ids)} client indices for {len(shard_sizes)} shards")
        self.rngs = [np.random.default_rng([seed, stream, k]) for k in ids]
        self.queues = [np.empty(0, dtype=np.int64) for _ in shard_sizes]

    def _draw(self, k: int, count: int) -> np.ndarray:
        queue = self.queues[k]
        while len(queue) < count:
            queue = np.concatenate([queue, self.rngs[k].permutation(self.sizes[k])])
        self.queues[k] = queue[count:]
        return queue[:count]

    def next(self) -> np.ndarray:
        """The next mini-batch of every client: local positions, shape ``[K, B]``."""
        return np.stack([self._draw(k, self.batch_size) for k in range(len(self.sizes))])

    def sample(self, count: int) -> np.ndarray:
        """``count`` positions per client (cycling through epochs if the shard is small)."""
        return np.stack([self._draw(k, count) for k in range(len(self.sizes))])

    def uniforms(self, count: int) -> np.ndarray:
        """``count`` U(0, 1) numbers per client, for algorithms that sample (e.g. score pools)."""
        return np.stack([rng.random(count, dtype=np.float32) for rng in self.rngs])

    def state_dict(self) -> dict[str, Any]:
        return {
            "rngs": [rng.bit_generator.state for rng in self.rngs],
            "queues": [q.copy() for q in self.queues],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rng, s in zip(self.rngs, state["rngs"]):
            rng.bit_generator.state = s
        self.queues = [np.asarray(q, dtype=np.int64).copy() for q in state["queues"]]

"""Per-client mini-batch samplers with a fixed batch size.

Every client draws from its own NumPy generator seeded by ``(seed, client)``,
walking through successive random permutations of its shard (sampling without
replacement within an epoch). Both simulation engines consume exactly the
same index stream, which is what makes their results comparable.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ClientSampler:
    """Yields ``[K, B]`` arrays of local sample positions, one row per client.

    Each client's queue of upcoming positions lives in one row of a 2-D buffer,
    so a step is one vectorized gather; Python work per client happens only when
    that client's queue runs short (once per epoch of its shard). The stream is
    the same as drawing client after client: permutations are drawn lazily, in
    order, from the client's own generator.
    """

    def __init__(self, shard_sizes: list[int], batch_size: int, seed: int, stream: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch size must be ≥ 1, got {batch_size}")
        self.sizes = list(shard_sizes)
        self.batch_size = batch_size
        self.rngs = [np.random.default_rng([seed, stream, k]) for k in range(len(shard_sizes))]
        self._set_queues([np.empty(0, dtype=np.int64) for _ in shard_sizes])

    def _set_queues(self, queues: list[np.ndarray]) -> None:
        width = max([len(q) for q in queues] + [1])
        self._buf = np.zeros((len(queues), width), dtype=np.int64)
        self._start = np.zeros(len(queues), dtype=np.int64)
        self._end = np.array([len(q) for q in queues], dtype=np.int64)
        for k, q in enumerate(queues):
            self._buf[k, : len(q)] = q

    @property
    def queues(self) -> list[np.ndarray]:
        """Each client's upcoming positions (a copy)."""
        return [self._buf[k, a:b].copy() for k, (a, b) in enumerate(zip(self._start, self._end))]

    def _refill(self, count: int) -> None:
        """Top up every queue holding fewer than ``count`` positions with fresh permutations."""
        for k in np.flatnonzero(self._end - self._start < count):
            queue = self._buf[k, self._start[k] : self._end[k]]
            parts = [queue]
            have = len(queue)
            while have < count:
                parts.append(self.rngs[k].permutation(self.sizes[k]))
                have += self.sizes[k]
            queue = np.concatenate(parts)
            if len(queue) > self._buf.shape[1]:
                grown = np.zeros((len(self.sizes), len(queue)), dtype=np.int64)
                grown[:, : self._buf.shape[1]] = self._buf
                self._buf = grown
            self._buf[k, : len(queue)] = queue
            self._start[k], self._end[k] = 0, len(queue)

    def _draw(self, count: int) -> np.ndarray:
        self._refill(count)
        cols = self._start[:, None] + np.arange(count)
        out = np.take_along_axis(self._buf, cols, axis=1)
        self._start += count
        return out

    def next(self) -> np.ndarray:
        """The next mini-batch of every client: local positions, shape ``[K, B]``."""
        return self._draw(self.batch_size)

    def sample(self, count: int) -> np.ndarray:
        """``count`` positions per client (cycling through epochs if the shard is small)."""
        return self._draw(count)

    def uniforms(self, count: int) -> np.ndarray:
        """``count`` U(0, 1) numbers per client, for algorithms that sample (e.g. score pools)."""
        return np.stack([rng.random(count, dtype=np.float32) for rng in self.rngs])

    def state_dict(self) -> dict[str, Any]:
        return {
            "rngs": [rng.bit_generator.state for rng in self.rngs],
            "queues": self.queues,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rng, s in zip(self.rngs, state["rngs"]):
            rng.bit_generator.state = s
        self._set_queues([np.asarray(q, dtype=np.int64) for q in state["queues"]])

"""Per-client mini-batch samplers: fixed-size batches, and Poisson batches for DP-SGD.

Every client draws from its own NumPy generator seeded by ``(seed, client)``,
walking through successive random permutations of its shard (sampling without
replacement within an epoch). Both simulation engines consume exactly the
same index stream, which is what makes their results comparable.

:class:`PoissonSampler` is instance-level DP's sampler (Abadi et al. 2016): every
record joins a step's batch independently with probability q_k = B / n_k, drawn
from the run's secret noise source, not from the seeded streams.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

OVERFLOW = 1e-12  # P(a Poisson batch holds more records than its capacity), per client and step
PADDING = -1  # the position of an empty slot of a padded Poisson batch
SAMPLING_STREAM = 1 << 20  # the noise source's sub-stream key of Poisson sampling


class ClientSampler:
    """Yields ``[K, B]`` arrays of local sample positions, one row per client.

    Each client's queue of upcoming positions lives in one row of a 2-D buffer,
    so a step is one vectorized gather; Python work per client happens only when
    that client's queue runs short (once per epoch of its shard). The stream is
    the same as drawing client after client: permutations are drawn lazily, in
    order, from the client's own generator.
    """

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

    def _refill(self, count: int, rows: np.ndarray | None = None) -> None:
        """Top up every queue (of ``rows``, default all) holding fewer than ``count`` positions with
        fresh permutations."""
        if rows is None:
            short = np.flatnonzero(self._end - self._start < count)
        else:  # only these clients: the others' queues are not looked at (a round's participants)
            short = rows[self._end[rows] - self._start[rows] < count]
        for k in short:
            queue = self._buf[k, self._start[k] : self._end[k]]
            parts = [queue]
            have = len(queue)
            while have < count:
                parts.append(self.rngs[k].permutation(self.sizes[k]))
                have += self.sizes[k]
            queue = np.concatenate(parts)
            if len(queue) > self._buf.shape[1]:  # grow by half at least: O(K) copies stay rare
                width = max(len(queue), self._buf.shape[1] * 3 // 2)
                grown = np.zeros((len(self.sizes), width), dtype=np.int64)
                grown[:, : self._buf.shape[1]] = self._buf
                self._buf = grown
            self._buf[k, : len(queue)] = queue
            self._start[k], self._end[k] = 0, len(queue)

    def _draw(self, count: int, rows: np.ndarray | None = None) -> np.ndarray:
        self._refill(count, rows)
        if rows is None:
            cols = self._start[:, None] + np.arange(count)
            out = np.take_along_axis(self._buf, cols, axis=1)
            self._start += count
            return out
        cols = self._start[rows, None] + np.arange(count)  # only these clients' streams advance
        out = np.take_along_axis(self._buf[rows], cols, axis=1)
        self._start[rows] += count
        return out

    def next(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The next mini-batch of every client (of ``rows``: a round's participants): local
        positions, shape ``[K, B]``."""
        return self._draw(self.batch_size, rows)

    def sample(self, count: int) -> np.ndarray:
        """``count`` positions per client (cycling through epochs if the shard is small)."""
        return self._draw(count)

    def uniforms(self, count: int, rows: np.ndarray | None = None) -> np.ndarray:
        """``count`` U(0, 1) numbers per client (of ``rows``), for algorithms that sample (e.g. score pools)."""
        rngs = self.rngs if rows is None else [self.rngs[k] for k in rows]
        return np.stack([rng.random(count, dtype=np.float32) for rng in rngs])

    def state_dict(self) -> dict[str, Any]:
        return {
            "rngs": [rng.bit_generator.state for rng in self.rngs],
            "queues": self.queues,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rng, s in zip(self.rngs, state["rngs"]):
            rng.bit_generator.state = s
        self._set_queues([np.asarray(q, dtype=np.int64) for q in state["queues"]])


class ClassSampler(ClientSampler):
    """Batches of ``positives`` positives followed by ``batch_size − positives`` negatives.

    LibAUC's DualSampler layout, per client: each class is walked through in
    successive random permutations (a rare class is cycled, i.e. oversampled).
    A client holding no sample of a class fills that class's slots from the
    other class; algorithms see it from ``y`` (a "positive" slot with y = 0).
    """

    def __init__(
        self,
        shard_labels: list[np.ndarray],
        batch_size: int,
        positives: int,
        seed: int,
        stream: int = 0,
        clients: Sequence[int] | None = None,
    ):
        super().__init__([len(y) for y in shard_labels], batch_size, seed, stream, clients)
        if not 1 <= positives < batch_size:
            raise ValueError(
                f"positives_per_batch must lie in [1, batch_size - 1] = [1, {batch_size - 1}], got {positives}"
            )
        self.positives = positives
        self.members = []
        for y in shard_labels:
            pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
            self.members.append((pos if len(pos) else neg, neg if len(neg) else pos))
        self.class_queues = [[np.empty(0, dtype=np.int64)] * 2 for _ in shard_labels]

    def _draw_class(self, k: int, c: int, count: int) -> np.ndarray:
        queue, members = self.class_queues[k][c], self.members[k][c]
        while len(queue) < count:
            queue = np.concatenate([queue, members[self.rngs[k].permutation(len(members))]])
        self.class_queues[k][c] = queue[count:]
        return queue[:count]

    def next(self, rows: np.ndarray | None = None) -> np.ndarray:
        b1, b2 = self.positives, self.batch_size - self.positives
        return np.stack(
            [
                np.concatenate([self._draw_class(k, 0, b1), self._draw_class(k, 1, b2)])
                for k in (range(len(self.sizes)) if rows is None else rows)
            ]
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "class_queues": [[q.copy() for q in qs] for qs in self.class_queues]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.class_queues = [
            [np.asarray(q, dtype=np.int64).copy() for q in qs] for qs in state["class_queues"]
        ]


def poisson_capacity(shard_sizes: Sequence[int], batch_size: int, overflow: float = OVERFLOW) -> int:
    """Slots of a padded Poisson batch: the smallest c with P(Binomial(n_k, q_k) > c) ≤ ``overflow``
    for every shard (q_k = min(1, B/n_k)); one width for all clients, so vmap sees equal shapes."""
    from scipy.stats import binom  # on first use: scipy.stats costs a Flower site's every process ~0.7 s

    return max(int(binom.isf(overflow, n, min(1.0, batch_size / n))) for n in shard_sizes)


class PoissonSampler:
    """Batches in which every record of client k's shard is included independently with
    probability q_k = min(1, B/n_k), so the expected batch size is q_k·n_k = min(B, n_k) and no
    record appears twice (Abadi et al. 2016, "lots"; Opacus's ``UniformWithReplacementSampler``).

    ``next()`` returns ``[K, capacity]`` positions, empty slots :data:`PADDING` (:func:`unpad`).
    The draws come from ``source`` (a ``NoiseSource``: secret unless a test asks for reproducible
    ones), one sub-stream per (step, client), so the batches are as secret as the noise and every
    engine and rank draws the same. A batch larger than ``capacity`` (probability ≤
    :data:`OVERFLOW` per client and step) stops the run with an error: resampling or dropping
    records would change the distribution the accountant assumes.
    """

    def __init__(
        self,
        shard_sizes: list[int],
        batch_size: int,
        source: Any,
        clients: Sequence[int] | None = None,
        all_sizes: Sequence[int] | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch size must be ≥ 1, got {batch_size}")
        self.sizes, self.batch_size, self.source = list(shard_sizes), batch_size, source
        self.clients = list(range(len(shard_sizes))) if clients is None else list(clients)
        self.rates = [min(1.0, batch_size / n) for n in self.sizes]
        self.capacity = poisson_capacity(all_sizes or self.sizes, batch_size)
        self.draws = 0

    @property
    def expected(self) -> np.ndarray:
        """q_k·n_k per client: the fixed denominator of DP-SGD's noisy mean."""
        return np.array([q * n for q, n in zip(self.rates, self.sizes)], dtype=np.float64)

    def next(self, rows: Sequence[int] | None = None) -> np.ndarray:
        """The step's padded batches of every client (of ``rows``: a round's participants)."""
        picked = range(len(self.sizes)) if rows is None else rows
        out = np.full((len(picked), self.capacity), PADDING, dtype=np.int64)
        for row, i in enumerate(picked):
            k, n, q = self.clients[i], self.sizes[i], self.rates[i]
            chosen = np.flatnonzero(self.source.spawn(SAMPLING_STREAM, self.draws, k).uniform(n) <= q)
            if len(chosen) > self.capacity:
                raise RuntimeError(
                    f"a Poisson batch of client {k} drew {len(chosen)} records, more than its "
                    f"{self.capacity} slots (probability ≤ {OVERFLOW:g} per step); rerun"
                )
            out[row, : len(chosen)] = chosen
        self.draws += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"draws": self.draws}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.draws = int(state["draws"])

    def __deepcopy__(self, memo: dict) -> PoissonSampler:
        """A copy drawing the same batches (the stream's replay): the source is shared, never copied."""
        out = copy.copy(self)
        out.sizes, out.clients, out.rates = list(self.sizes), list(self.clients), list(self.rates)
        return out


def unpad(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions with empty slots pointing at record 0, the float 0/1 mask of real records).
    Record 0 is only a valid place to gather from: DP-SGD zeroes those slots before any step sees
    them (``engines.privacy.instance.masked_dummies``)."""
    mask = positions != PADDING
    return np.where(mask, positions, 0), mask.astype(np.float32)


def make_samplers(
    shard_sizes: list[int],
    batch_size: int,
    seed: int,
    clients: Sequence[int] | None = None,
    positives: int = 0,
    shard_labels: list[np.ndarray] | None = None,
    poisson: tuple[Any, Sequence[int]] | None = None,
) -> tuple[ClientSampler | PoissonSampler, ClientSampler]:
    """The training sampler (stream 0; class-aware when ``positives`` > 0, an algorithm's
    ``positives_per_batch``, which needs ``shard_labels``; Poisson when ``poisson`` = (noise
    source, every client's shard size)) and the single-draw auxiliary sampler (stream 1) for
    stage and round batches. Every engine builds its samplers here, so client k draws the same
    positions wherever it runs."""
    if poisson is not None:
        if positives:
            raise ValueError("Poisson batches (instance-level DP) cannot be class-aware")
        source, all_sizes = poisson
        aux = ClientSampler(shard_sizes, 1, seed, stream=1, clients=clients)
        return PoissonSampler(shard_sizes, batch_size, source, clients, all_sizes), aux
    if positives:
        if shard_labels is None:
            raise ValueError("class-aware batches (positives_per_batch > 0) need the shards' labels")
        train: ClientSampler | PoissonSampler = ClassSampler(
            shard_labels, batch_size, positives, seed, stream=0, clients=clients
        )
    else:
        train = ClientSampler(shard_sizes, batch_size, seed, stream=0, clients=clients)
    return train, ClientSampler(shard_sizes, 1, seed, stream=1, clients=clients)

"""Streaming training data from disk: one DataLoader decodes every local step of all K clients.

The per-client samplers are today's (:mod:`fedxrisk.data.sampler`), so a streamed run
draws exactly the positions of the in-memory run. :func:`simulation_requests`
replays, on copies of the samplers, the order in which ``Simulation`` asks for
batches (the ``begin`` batch, I local steps, the stage and round batches of every
round), and :class:`Stream` hands that sequence to one
:class:`torch.utils.data.DataLoader` whose worker processes decode each step's
``[K, B]`` union and stack it, several steps ahead of training (``prefetch``
steps per worker; pinned memory when the device is CUDA). When the engine asks
for a batch, the prefetched one is used only if its positions are the requested
ones (otherwise it and every later batch are decoded on the spot: ``misses``
counts this, 0 in a normal run).

Augmentation (``FederatedData.augment``) keeps the in-memory run's random draws:
an augmenter with ``draw``/``apply`` (``RandomCropFlip``) draws every batch's
offsets and flips in the engine's order; a copy of it draws ahead for the
prefetched requests and the workers apply the draws, which are checked against
the engine-side ones when the batch is used. Any other augmenter runs in the
training process on the stacked batch.

Bad files: a file that cannot be decoded stops the run with :class:`BadFileError`
naming it (``on_bad_file = "error"``), or (``"skip"``) is replaced by the next
sample, cyclically in the same client's shard (in the evaluated split when
scoring), that has the same label and decodes; the replacement is deterministic,
so a skipped run is reproducible, and every skip is counted (``skipped``,
``bad_files``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from copy import deepcopy
from typing import Any, Protocol

import numpy as np
import torch

from fedxrisk.data.lazy import LazySamples, decode_rows, is_lazy
from fedxrisk.data.sampler import unpad
from fedxrisk.data.stream_choice import ON_BAD_FILE
from fedxrisk.errors import BadFileError

PREFETCH = 4  # steps decoded ahead per worker
MALLOC_WARM = 30_000_000  # bytes: below glibc's 32 MiB ceiling of the dynamic mmap threshold
_warmed = False


def warm_allocator() -> None:
    """Allocate and free one untouched 30 MB block, once per process. glibc's malloc maps each
    block above its mmap threshold afresh and returns freed heap above twice that to the system,
    raising both thresholds only when a large mapped block is freed. An in-memory run frees such
    blocks while decoding its data; a streamed one never did, so its training steps page-faulted
    their activations again at every step (measured: the small CNN ran 1.5-2x slower in a fresh
    streamed process than in memory, and as fast once this block was freed). Elsewhere: harmless."""
    global _warmed
    if not _warmed:
        block = np.empty(MALLOC_WARM, dtype=np.uint8)
        del block
        _warmed = True


class Replayable(Protocol):
    """What :func:`simulation_requests` reads of an engine (``engines.simulation.Simulation``):
    its samplers, its algorithm's batch needs, its round plans and the round it is at."""

    sampler: Any
    aux_sampler: Any
    algorithm: Any
    plans: Sequence[Any]
    round: int


class _StepDataset(torch.utils.data.Dataset):
    """Map-style dataset whose "index" is a whole step request: ``(id, positions [K, n])``."""

    def __init__(self, samples: LazySamples, pools: Sequence[np.ndarray] | None, on_bad: str):
        self.samples, self.pools, self.on_bad = samples, pools, on_bad

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(
        self, request: tuple[int, np.ndarray, Any]
    ) -> tuple[int, Any, list[str], BadFileError | None]:
        rid, positions, augment = request
        try:
            x, bad = decode_rows(self.samples, positions, self.pools, self.on_bad)
        except BadFileError as e:  # returned, not raised: the error reaches the main process intact
            return rid, None, [], e
        out = torch.from_numpy(x)
        if augment is not None:  # (augmenter, its draws for this batch): crop and flip here
            out = augment[0].apply(out, augment[1])
        return rid, out, bad, None


def _drawable(augment: Any) -> bool:
    """Whether an augmenter separates its random draws from applying them (``draw``/``apply``,
    as :class:`~fedxrisk.data.augment.RandomCropFlip`): then it runs in the workers."""
    return augment is not None and hasattr(augment, "draw") and hasattr(augment, "apply")


def _same(a: tuple[np.ndarray, ...] | None, b: tuple[np.ndarray, ...] | None) -> bool:
    return a is not None and b is not None and all(np.array_equal(x, y) for x, y in zip(a, b))


def _identity(item: Any) -> Any:
    return item


class Stream:
    """The decoded inputs of this process's K clients, step after step, from one DataLoader.

    ``shards[k]``: client k's sample indices into ``samples`` (its pool of replacements).
    """

    def __init__(
        self,
        samples: LazySamples,
        shards: Sequence[np.ndarray],
        workers: int = 0,
        on_bad_file: str = "error",
        pin_memory: bool = False,
        prefetch: int = PREFETCH,
    ):
        if on_bad_file not in ON_BAD_FILE:
            raise ValueError(f"data.on_bad_file must be one of {list(ON_BAD_FILE)}, got {on_bad_file!r}")
        self.samples, self.shards = samples, [np.asarray(s) for s in shards]
        self.workers, self.on_bad, self.pin, self.prefetch = workers, on_bad_file, pin_memory, prefetch
        self.misses = 0  # prefetched batches that were not the ones asked for (0 in a normal run)
        self.augmented_by_workers = 0  # batches whose augmentation ran in a worker
        self.bad_log: list[str] = samples.options.setdefault("bad_log", [])  # files replaced (skip)
        self._table = _table(self.shards)
        self._it: Iterator[tuple[int, Any, list[str], BadFileError | None]] | None = None
        self._requests: dict[int, tuple[np.ndarray, Any]] = {}  # prefetched, not yet consumed
        self._shadow: Any = None  # a copy of the augmenter, drawing ahead for the workers
        warm_allocator()

    def subset(self, clients: Sequence[int]) -> Stream:
        """The same stream settings for a subset of the clients (a rank's or a site's own)."""
        return Stream(self.samples, [self.shards[k] for k in clients], self.workers, self.on_bad, self.pin,
                      self.prefetch)  # fmt: skip

    # -- prefetching --------------------------------------------------------------------------
    def start(self, positions: Iterator[np.ndarray]) -> None:
        """Prefetch the batches of ``positions`` (local positions ``[K, n]``, in the order the
        engine will ask for them), replacing any prefetch under way."""
        self.close()
        self._requests, self._shadow = {}, None

        def requests() -> Iterator[tuple[int, np.ndarray, Any]]:
            for rid, local in enumerate(positions):
                index = self.global_index(local)
                shadow = self._shadow
                augment = (shadow, shadow.draw(index.size)) if shadow is not None else None
                self._requests[rid] = (index, augment[1] if augment else None)
                yield rid, index, augment

        loader = torch.utils.data.DataLoader(
            _StepDataset(self.samples, self.shards, self.on_bad),
            batch_size=None,
            sampler=requests(),  # type: ignore[arg-type]
            num_workers=self.workers,
            collate_fn=_identity,
            pin_memory=self.pin,
            prefetch_factor=self.prefetch if self.workers else None,
            persistent_workers=False,
        )
        self._it = iter(loader)

    def close(self) -> None:
        """Stop the workers (if any). Batches still prefetched are dropped: the workers are
        terminated first (a worker blocked on a full result pipe would otherwise hold the
        DataLoader's shutdown for its 5 s timeout)."""
        it, self._it = self._it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            for worker in getattr(it, "_workers", []):
                if worker.is_alive():
                    worker.terminate()
            it._shutdown_workers()  # noqa: SLF001 - DataLoader offers no public shutdown

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer (e.g. at interpreter exit)
            pass

    def global_index(self, local: np.ndarray) -> np.ndarray:
        """Local positions ``[K, n]`` → sample indices into ``samples``."""
        return self._table[np.arange(len(self.shards))[:, None], local]

    # -- the engine's side --------------------------------------------------------------------
    def fetch(self, index: np.ndarray, augment: Any = None) -> torch.Tensor:
        """Decoded inputs ``[K, n, …]`` at sample indices ``index`` ``[K, n]``, augmented by
        ``augment`` when given (its random draws are made here, in the engine's order)."""
        params = augment.draw(index.size) if _drawable(augment) else None
        if self._it is not None:
            try:
                rid, x, bad, error = next(self._it)
            except StopIteration:
                self._it = None
            else:
                want, drawn = self._requests.pop(rid)
                if np.array_equal(want, index) and (drawn is None or _same(drawn, params)):
                    x = self._accept(x, bad, error)
                    if drawn is not None:  # decoded and augmented by a worker
                        self.augmented_by_workers += 1
                        return x
                    if params is not None and self._shadow is None:
                        self._draw_ahead(augment)
                    return self._augment(x, augment, params)
                self.misses += 1  # not the batch asked for: decode here from now on
                self.close()
        x, bad = decode_rows(self.samples, index, self._pools(index), self.on_bad)
        return self._augment(self._accept(torch.from_numpy(x), bad, ""), augment, params)

    def _draw_ahead(self, augment: Any) -> None:
        """From now on the workers augment: a copy of ``augment`` makes the draws of the batches
        already requested (they come back unaugmented), then draws for each new request."""
        shadow = deepcopy(augment)
        for index, _ in self._requests.values():  # in request order
            shadow.draw(index.size)
        self._shadow = shadow

    @staticmethod
    def _augment(x: torch.Tensor, augment: Any, params: Any) -> torch.Tensor:
        if augment is None:
            return x
        return augment.apply(x, params) if params is not None else augment(x)

    def _pools(self, index: np.ndarray) -> list[np.ndarray]:
        return self.shards if len(index) == len(self.shards) else [np.arange(len(self.samples))] * len(index)

    def _accept(self, x: torch.Tensor | None, bad: list[str], error: BadFileError | None) -> torch.Tensor:
        if error is not None:
            self.close()
            raise error
        self.bad_log.extend(bad)
        assert x is not None
        return x


def _table(shards: Sequence[np.ndarray]) -> np.ndarray:
    width = max([len(s) for s in shards] + [1])
    table = np.zeros((len(shards), width), dtype=np.int64)
    for k, s in enumerate(shards):
        table[k, : len(s)] = s
    return table


def sampler_requests(sampler: Any, uniforms: int, steps: int) -> Iterator[np.ndarray]:
    """The positions of the next ``steps`` training batches of ``sampler`` (a copy is drawn
    from, with ``uniforms`` U(0, 1) per step in between, as the engines draw them)."""
    sampler = deepcopy(sampler)

    def run() -> Iterator[np.ndarray]:
        for _ in range(steps):
            positions = sampler.next()
            if uniforms:
                sampler.uniforms(uniforms)
            yield positions

    return run()


def simulation_requests(sim: Replayable, begin: bool) -> Iterator[np.ndarray]:
    """The local positions of every batch ``sim`` will ask for from its current state, in order
    (``Simulation.__init__``'s begin batch when ``begin``, then ``run_round``'s batches),
    drawn from copies of its samplers. The copies are taken now, not when iteration starts."""
    sampler, aux = deepcopy(sim.sampler), deepcopy(sim.aux_sampler)
    alg, plans, first = sim.algorithm, sim.plans, sim.round
    extra = alg.uniforms_per_step

    def train() -> np.ndarray:
        positions = sampler.next()
        if extra:
            sampler.uniforms(extra)
        return unpad(positions)[0] if alg.poisson_batches else positions

    def run() -> Iterator[np.ndarray]:
        if begin and alg.begin_batch:
            yield train()
        for r in range(first, len(plans)):
            plan = plans[r]
            for _ in range(plan.window):
                yield train()
            if alg.stage_batch_size and plan.stage_end and r + 1 < len(plans):
                yield aux.sample(alg.stage_batch_size)
            if alg.round_batch_size:
                yield aux.sample(alg.round_batch_size)

    return run()


def input_chunks(x: Any, chunk: int) -> Iterator[torch.Tensor]:
    """``x`` in consecutive chunks of ``chunk`` samples, decoded (lazy inputs: by the
    ``workers`` attached to them; under ``skip`` a bad file is replaced by the next sample
    of ``x`` with its label)."""
    if not is_lazy(x):
        for i in range(0, len(x), chunk):
            yield x[i : i + chunk]
        return
    workers = int(x.options.get("workers", 0))
    on_bad = x.options.get("on_bad_file", "error")
    starts = range(0, len(x), chunk)
    requests = ((i, np.arange(s, min(s + chunk, len(x)))[None], None) for i, s in enumerate(starts))
    workers = workers if len(starts) > 1 else 0
    loader = torch.utils.data.DataLoader(
        _StepDataset(x, None, on_bad), batch_size=None, sampler=requests,  # type: ignore[arg-type]
        num_workers=workers, collate_fn=_identity, prefetch_factor=2 if workers else None,
    )  # fmt: skip
    log = x.options.get("bad_log")
    for _, decoded, bad, error in loader:
        if error is not None:
            raise error
        if log is not None:
            log.extend(bad)
        yield decoded[0]


def materialize(x: Any, chunk: int = 1024) -> torch.Tensor:
    """Decode every sample of ``x`` (with its attached workers) into one tensor."""
    if not is_lazy(x):
        return x
    return torch.cat(list(input_chunks(x, chunk))) if len(x) else torch.empty(x.shape)

"""Simulation engines: all clients in one process.

An engine differs only in how it maps a per-client function over the clients:
``loop`` calls it client after client (the reference), ``vmap`` batches all
clients on a leading axis with :func:`torch.func.vmap`, ``compile`` runs the
same vmapped local step through :func:`torch.compile` (one fused program for
forward, backward and the update arithmetic of all clients), and ``auto``
picks one of them for the run at hand (:class:`AutoEngine`). State is always
kept stacked (leading client axis), so ``communicate`` and the collectives are
shared code and the engines differ exactly where their speed does.
See docs/performance.md for measurements.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch.func import vmap

from fedxrisk.algorithms.base import Algorithm, ClientInfo, StepContext
from fedxrisk.algorithms.personal import site_collective
from fedxrisk.algorithms.schedule import RoundPlan, Schedule
from fedxrisk.data.federated import FederatedData
from fedxrisk.data.sampler import make_samplers
from fedxrisk.engines import privacy as dp
from fedxrisk.engines.clientround import client_round
from fedxrisk.engines.flops import forward_flops_per_sample
from fedxrisk.engines.lazyround import LazyStates, lazy_round, lazy_round_applies, own_entries
from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.participation import Participation, round_collective, round_mask
from fedxrisk.engines.pooling import merge_pool
from fedxrisk.engines.reporting import RunReporting
from fedxrisk.errors import NonFiniteLoss  # noqa: F401  (re-exported)
from fedxrisk.tree import Tree, broadcast, fitting, index, is_finite, leaves, stack, tmap


class Engine:
    """How a per-client function is mapped over stacked client trees."""

    name = ""

    def map_clients(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        raise NotImplementedError

    def local_steps(self, step: Callable[..., Tree], ctx: StepContext, states: Tree, batch: Tree) -> Tree:
        """One ``algorithm.local_step`` on every client (engines may specialise this hot path)."""
        return self.map_clients(partial(step, ctx=ctx), states, batch)

    def configure(self, sim: Simulation) -> None:
        """Called once by :class:`Simulation` after the states are built."""


class LoopEngine(Engine):
    """The reference: one client after another."""

    name = "loop"

    def map_clients(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        k = next(leaves(trees[0]))[1].shape[0]
        return stack([fn(*(index(t, i) for t in trees)) for i in range(k)])


class VmapEngine(Engine):
    """All clients batched on the leading axis with ``torch.func.vmap``.

    ``chunk_size`` bounds memory: clients are processed that many at a time.
    """

    name = "vmap"

    def __init__(self, chunk_size: int | None = None):
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be ≥ 1 or None, got {chunk_size}")
        self.chunk_size = chunk_size

    def map_clients(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return vmap(fn, randomness="different", chunk_size=self.chunk_size)(*trees)


def compiler_available() -> bool:
    """Whether :func:`torch.compile`'s CPU backend can build kernels (it needs a C++ compiler)."""
    if os.environ.get("FEDXRISK_NO_COMPILE"):
        return False
    return any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++"))


class CompiledEngine(VmapEngine):
    """The vmapped local step compiled with :func:`torch.compile` (inductor).

    The local step of all clients (forward, backward, and the algorithm's update
    arithmetic on the stacked state) becomes one program: matrix products go to
    batched BLAS / grouped convolution kernels and the per-leaf update arithmetic
    is fused into single passes over memory, which is where eager ``vmap`` loses
    most of its time. The step context is a compile-time constant for the fields
    the algorithm reads (dynamo guards on them): CODA-family steps read only the
    learning rate, so a run compiles once per distinct learning rate (once per
    stage); an algorithm reading the step counter would recompile every step until torch's
    recompile limit, then run eagerly (symbolic floats do not survive inductor's vmap lowering
    in torch 2.13). The first call compiles (tens of seconds on a small CPU; cached on disk by
    torch between processes); a new number of participants recompiles. If compilation fails
    the engine warns once and continues with eager ``vmap`` (same results to float
    tolerance). ``communicate`` and other per-client functions run eagerly.
    """

    name = "compile"

    def __init__(self, chunk_size: int | None = None, backend: str = "inductor"):
        super().__init__(chunk_size)
        self.backend = backend
        self._compiled: dict[Any, Callable[..., Tree]] = {}
        self.failure: Exception | None = None

    def _program(self, step: Callable[..., Tree]) -> Callable[..., Tree]:
        key = (id(getattr(step, "__self__", None)), getattr(step, "__func__", step))
        if key not in self._compiled:
            chunk = self.chunk_size

            def run(states: Tree, batch: Tree, ctx: StepContext) -> Tree:
                return vmap(partial(step, ctx=ctx), randomness="different", chunk_size=chunk)(states, batch)

            self._compiled[key] = torch.compile(run, backend=self.backend, dynamic=False)
        return self._compiled[key]

    def local_steps(self, step: Callable[..., Tree], ctx: StepContext, states: Tree, batch: Tree) -> Tree:
        if self.failure is None:
            try:
                with torch._dynamo.config.patch(specialize_float=True):
                    return self._program(step)(states, batch, ctx)
            except Exception as e:  # noqa: BLE001 - any compiler failure: fall back to eager vmap
                self.failure = e
                warnings.warn(
                    f"torch.compile failed ({type(e).__name__}: {str(e)[:200]}); using eager vmap",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return super().local_steps(step, ctx, states, batch)


# client-steps (K × total local steps) per compilation above which ``auto`` compiles: one costs
# ~30-90 s on a 2-core CPU and saves ~0.1 ms per client-step for the MLP (docs/performance.md)
AUTO_COMPILE_MIN_CLIENT_STEPS = 500_000


# forward FLOPs per sample above which a convolutional model runs faster client after
# client: each client's step is then large enough for the convolution kernels, while
# vmap turns convolutions into grouped ones, slower on CPU (ResNet20: loop 1.0×, vmap
# 1.3× the limit; SmallCNN on 8×8 inputs, 0.6 MFLOP: vmap/compile win; docs/performance.md)
AUTO_LOOP_MIN_CONV_FLOPS = 10_000_000


class AutoEngine(Engine):
    """Picks the fastest correct engine for the run: ``loop`` for one client or for a
    convolutional model of at least :data:`AUTO_LOOP_MIN_CONV_FLOPS` per sample
    (ResNet-class), else ``compile`` when a C++ compiler is
    available and the run is long enough to repay compilation (K × local steps ≥
    :data:`AUTO_COMPILE_MIN_CLIENT_STEPS` × the number of distinct learning rates,
    i.e. of compilations), else ``vmap``. The choice depends only on the configuration (never
    on timings), so the same seed gives the same numbers. ``chosen`` names the engine picked."""

    name = "auto"

    def __init__(self, chunk_size: int | None = None):
        self.chunk_size = chunk_size
        self.inner: Engine = VmapEngine(chunk_size)
        self.chosen = "vmap"

    def configure(self, sim: Simulation) -> None:
        flops, conv = forward_flops_per_sample(sim)
        steps, compilations = sum(p.window for p in sim.plans), len({p.lr for p in sim.plans})
        stepped = sim.participation.count if sim.participation else sim.num_clients  # clients per step
        self.chosen = choose_engine(stepped, steps, compilations, flops if conv else 0)
        self.inner = LoopEngine() if self.chosen == "loop" else ENGINES[self.chosen](self.chunk_size)

    def map_clients(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return self.inner.map_clients(fn, *trees)

    def local_steps(self, step: Callable[..., Tree], ctx: StepContext, states: Tree, batch: Tree) -> Tree:
        return self.inner.local_steps(step, ctx, states, batch)


def choose_engine(
    num_clients: int, total_local_steps: int, compilations: int = 1, conv_flops_per_sample: int = 0
) -> str:
    """``auto``'s rule (see :class:`AutoEngine`); ``conv_flops_per_sample`` is 0 for models
    without convolutions."""
    if num_clients == 1 or conv_flops_per_sample >= AUTO_LOOP_MIN_CONV_FLOPS:
        return "loop"
    work = num_clients * total_local_steps
    if compiler_available() and work >= AUTO_COMPILE_MIN_CLIENT_STEPS * compilations:
        return "compile"
    return "vmap"


ENGINES: dict[str, type[Engine]] = {
    "loop": LoopEngine,
    "vmap": VmapEngine,
    "compile": CompiledEngine,
    "auto": AutoEngine,
}


class SimCollective:
    """``mean`` and ``gather`` over the leading client axis, with byte accounting."""

    def __init__(self, num_clients: int, engine: Engine, ledger: ByteLedger, seed: int = 0):
        self.num_clients = num_clients
        self.engine = engine
        self.ledger = ledger
        self.seed = seed

    def mean(self, tree: Tree) -> Tree:
        self.ledger.record("mean", tree, self.num_clients)
        return tmap(lambda x: x.mean(0, keepdim=True).expand_as(x).clone(), tree)

    def gather(self, tree: Tree) -> Tree:
        self.ledger.record("gather", tree, self.num_clients)
        return tmap(lambda x: x.unsqueeze(0).expand(x.shape[0], *x.shape).clone(), tree)

    def pool(self, groups: dict[str, Tree], valid: dict[str, torch.Tensor], key: int) -> dict[str, Tree]:
        merged = merge_pool(groups, valid, self.seed, key)
        self.ledger.record_pool(groups, valid, merged)
        return broadcast(merged, self.num_clients)

    def per_client(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return self.engine.map_clients(fn, *trees)


class Simulation(LazyStates, RunReporting):
    """Runs an algorithm's rounds on simulated clients; one :meth:`run_round` per round (what the
    run loop reads besides: :class:`~fedxrisk.engines.reporting.RunReporting`)."""

    is_primary = True  # writes the run's outputs (distributed engine: rank 0 only)
    lazy_rounds = True  # rounds among the participants only, where they apply (engines/lazyround.py)

    def __init__(
        self,
        algorithm: Algorithm,
        data: FederatedData,
        schedule: Schedule,
        batch_size: int,
        seed: int = 0,
        engine: str = "loop",
        device: str | torch.device = "cpu",
        clients: Sequence[int] | None = None,
        engine_options: dict[str, Any] | None = None,
        privacy: dp.ClientDP | None = None,
        noise: Any = None,
        participation: Participation | None = None,
    ):
        """``clients``: the global indices of the clients this process holds (default
        all); the others live elsewhere and are reached through :meth:`_collective`.
        ``privacy``, ``noise``, ``participation``: client-level DP; instance-level DP's NoiseSource
        (engines/privacy); ``data.clients_per_round`` (engines/participation.py)."""
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; choose one of {sorted(ENGINES)}")
        algorithm.validate_schedule(schedule)
        self.algorithm, self.data, self.schedule = algorithm, data, schedule
        self.engine, self.device = ENGINES[engine](**(engine_options or {})), torch.device(device)
        self.batch_size, self.seed, self.ledger, self.participation = (
            batch_size,
            seed,
            ByteLedger(),
            participation,
        )
        self.clients = list(range(data.num_clients)) if clients is None else list(clients)
        self.local_data = data if clients is None else data.subset(clients)
        positives, local = algorithm.positives_per_batch, self.local_data  # tasks: no shards, no labels
        labels = [local.data.y_train.numpy()[s] for s in local.shards] if positives else None
        poisson = dp.poisson_batches(algorithm, noise, data.shard_sizes)  # instance-level DP, else None
        self.sampler, self.aux_sampler = make_samplers(
            self.local_data.shard_sizes, batch_size, seed, self.clients, positives, labels, poisson
        )
        self.plans: list[RoundPlan] = list(schedule.plan())
        width = max(data.shard_sizes)
        infos = [ClientInfo(k, data.shard_sizes[k], data.client_pos_ratio(k), width) for k in self.clients]
        self.states = tmap(lambda x: x.to(self.device), stack([algorithm.init(c) for c in infos]))
        self.round = 0  # rounds completed
        lazy = self.lazy_rounds and participation is not None and privacy is None
        self._own = (own_entries(algorithm, self.states) if lazy else None) or ()
        self.privacy = None if privacy is None else dp.PrivateAggregator(
            privacy, algorithm, index(self.states, 0), seed, data.num_clients
        )  # fmt: skip
        self._participants: torch.Tensor | None = None  # this round's sampled clients (of self.clients)
        self.engine.configure(self)
        self._start_stream(begin=True)
        if algorithm.begin_batch:  # before round 0; its bytes count in round 0
            self.states = algorithm.begin(self.states, self._collective(), self._batch(self.sampler.next()))

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def _start_stream(self, begin: bool) -> None:
        """Streamed data: prefetch the batches this run will ask for (data/stream.py)."""
        stream = getattr(self.local_data, "stream", None)  # duck-typed sources (fedxrisk.tasks) have none
        if stream is not None:
            from fedxrisk.data.stream import simulation_requests

            stream.start(simulation_requests(self, begin))

    @property
    def done(self) -> bool:
        return self.round >= len(self.plans)

    def _batch(self, positions, step: int = -1, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if self.algorithm.poisson_batches:  # instance-level DP: a padded Poisson batch and its noise
            return dp.private_batch(self, positions, step, rows)
        batch = self.local_data.batch(positions, self.device, rows)
        if extra := self.algorithm.uniforms_per_step:
            mine = None if rows is None else rows.cpu().numpy()
            batch["uniform"] = torch.from_numpy(self.sampler.uniforms(extra, mine)).to(self.device)
        return batch

    def _next_batch(self, step: int, rows: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if rows is None:  # (tests spy on ``_batch`` with two arguments)
            return self._batch(self.sampler.next(), step)
        return self._batch(self.sampler.next(rows.cpu().numpy()), step, rows)

    def run_round(self) -> RoundPlan:
        """I local steps on every client, then the algorithm's communication (:func:`client_round`);
        among the participants only where it applies (:func:`~fedxrisk.engines.lazyround.lazy_round`)."""
        plan = self.plans[self.round]
        mask = self._participants = round_mask(self.privacy, self.participation, plan.round, self.clients)
        if self._own and mask is not None and lazy_round_applies(self.algorithm, self.plans, self.round):
            inner = SimCollective(self.num_clients, self.engine, self.ledger, self.seed)
            lazy_finite = lazy_round(self, mask, self._next_batch, inner)
            finite = lambda: lazy_finite  # noqa: E731
        else:
            comms: list[Any] = []  # the round's collective (the distributed engine's finishes the round)

            def collective(states: Tree) -> Any:
                self.states = (
                    states  # after the local steps, as the distributed engine's collective reads them
                )
                comms.append(self._collective())
                return site_collective(comms[-1], getattr(self.algorithm, "problem", None))  # FedBN, heads

            self.states = client_round(
                self.algorithm, self.engine, self.states, self.plans, self.round,
                self._next_batch, self.aux_sampler.sample,
                lambda positions: self.local_data.batch(positions, self.device), collective, mask,
            )  # fmt: skip
            finite = lambda: self._finite(comms[-1])  # noqa: E731  (after the round count moves, as before)
        self.ledger.close_round()
        self.round += 1
        if not finite():
            raise NonFiniteLoss(plan.round + 1)  # 1-based, as in history.csv
        return plan

    def _collective(self) -> Any:
        """The round's collective (the distributed engine replaces it); private under DP."""
        comm = SimCollective(self.num_clients, self.engine, self.ledger, self.seed)
        return round_collective(comm, self.privacy, self.participation, self.round, self._participants)

    def _finite(self, comm: Any) -> bool:
        """Whether every client's last loss and model are finite after the round."""
        return bool(torch.isfinite(self.states["loss"]).all()) and is_finite(self.states["w"])

    def train_loss(self) -> float:
        """Mean over clients (the last round's participants) of the last local step's objective value."""
        loss, mask = self.states["loss"], self._participants if self.participation else None
        return float(loss.mean() if mask is None else loss[mask.to(loss.device)].mean())

    def global_model(self) -> tuple[Tree, Tree]:
        """The averaged model: client 0's parameters (equal on all clients after a round; the
        client mean of personal ones) and the client mean of float buffers (``local`` policy)."""
        params, buffers = self.algorithm.model(self.states)
        local = getattr(getattr(self.algorithm, "problem", None), "local_names", ())
        params = {k: v.mean(0) if k in local else v[0] for k, v in params.items()}
        buffers = {
            k: v.float().mean(0).to(v.dtype) if v.is_floating_point() else v[0] for k, v in buffers.items()
        }
        return params, buffers

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "states": self.states,
            "sampler": self.sampler.state_dict(),
            "aux_sampler": self.aux_sampler.state_dict(),
            "ledger": self.ledger.state_dict(),
            **({"privacy": self.privacy.state_dict()} if self.privacy is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = state["round"]
        self.states = tmap(lambda x: x.to(self.device), fitting(self.states, state["states"]))
        self.sampler.load_state_dict(state["sampler"])
        self.aux_sampler.load_state_dict(state["aux_sampler"])
        self.ledger.load_state_dict(state["ledger"])
        if self.privacy is not None:
            self.privacy.load_state_dict(state["privacy"])
        self._start_stream(begin=False)

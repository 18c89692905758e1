"""Simulation engines: all clients in one process.

An engine differs only in how it maps a per-client function over the clients:
``loop`` calls it client after client (the reference), ``vmap`` batches all
clients on a leading axis with :func:`torch.func.vmap`. State is always kept
stacked (leading client axis), so ``communicate`` and the collectives are
shared code and the two engines differ exactly where their speed does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch.func import vmap

from fedxrisk.algorithms.base import Algorithm, ClientInfo, RoundContext, StepContext
from fedxrisk.algorithms.schedule import RoundPlan, Schedule
from fedxrisk.data.federated import FederatedData
from fedxrisk.data.sampler import ClassSampler, ClientSampler
from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.tree import Tree, index, is_finite, leaves, stack, tmap


class NonFiniteLoss(RuntimeError):
    """Raised when a round produces a NaN/inf loss or model; carries the round."""

    def __init__(self, round_: int):
        super().__init__(f"non-finite loss or model (NaN/inf) at round {round_}; training stopped")
        self.round = round_


class LoopEngine:
    """The reference: one client after another."""

    name = "loop"

    def map_clients(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        k = next(leaves(trees[0]))[1].shape[0]
        return stack([fn(*(index(t, i) for t in trees)) for i in range(k)])


class VmapEngine:
    """All clients batched on the leading axis with ``torch.func.vmap``."""

    name = "vmap"

    def map_clients(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return vmap(fn, randomness="different")(*trees)


ENGINES = {"loop": LoopEngine, "vmap": VmapEngine}


class SimCollective:
    """``mean`` and ``gather`` over the leading client axis, with byte accounting."""

    def __init__(self, num_clients: int, engine: LoopEngine | VmapEngine, ledger: ByteLedger):
        self.num_clients = num_clients
        self.engine = engine
        self.ledger = ledger

    def mean(self, tree: Tree) -> Tree:
        self.ledger.record("mean", tree, self.num_clients)
        return tmap(lambda x: x.mean(0, keepdim=True).expand_as(x).clone(), tree)

    def gather(self, tree: Tree) -> Tree:
        self.ledger.record("gather", tree, self.num_clients)
        return tmap(lambda x: x.unsqueeze(0).expand(x.shape[0], *x.shape).clone(), tree)

    def per_client(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return self.engine.map_clients(fn, *trees)


class Simulation:
    """Runs an algorithm's rounds on simulated clients; one :meth:`run_round` per round."""

    is_primary = True  # writes the run's outputs (distributed engine: rank 0 only)

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
    ):
        """``clients``: the global indices of the clients this process holds (default
        all); the others live elsewhere and are reached through :meth:`_collective`."""
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; choose one of {sorted(ENGINES)}")
        algorithm.validate_schedule(schedule)
        self.algorithm, self.data, self.schedule = algorithm, data, schedule
        self.engine = ENGINES[engine]()
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.ledger = ByteLedger()
        self.clients = list(range(data.num_clients)) if clients is None else list(clients)
        self.local_data = (
            data if clients is None else FederatedData(data.data, [data.shards[k] for k in clients])
        )
        sizes = self.local_data.shard_sizes
        positives = getattr(algorithm, "positives_per_batch", 0)
        if positives:  # class-aware batches: positives first, then negatives
            labels = [self.local_data.data.y_train.numpy()[s] for s in self.local_data.shards]
            self.sampler = ClassSampler(labels, batch_size, positives, seed, stream=0, clients=self.clients)
        else:
            self.sampler = ClientSampler(sizes, batch_size, seed, stream=0, clients=self.clients)
        self.aux_sampler = ClientSampler(sizes, 1, seed, stream=1, clients=self.clients)
        self.plans: list[RoundPlan] = list(schedule.plan())
        width = max(data.shard_sizes)
        infos = [ClientInfo(k, data.shard_sizes[k], data.client_pos_ratio(k), width) for k in self.clients]
        self.states = tmap(lambda x: x.to(self.device), stack([algorithm.init(c) for c in infos]))
        self.round = 0  # rounds completed
        if getattr(algorithm, "begin_batch", False):  # before round 0; its bytes count in round 0
            self.states = algorithm.begin(self.states, self._collective(), self._batch(self.sampler.next()))

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    @property
    def done(self) -> bool:
        return self.round >= len(self.plans)

    def _batch(self, positions) -> dict[str, torch.Tensor]:
        batch = self.local_data.batch(positions, self.device)
        extra = getattr(self.algorithm, "uniforms_per_step", 0)
        if extra:
            batch["uniform"] = torch.from_numpy(self.sampler.uniforms(extra)).to(self.device)
        return batch

    def run_round(self) -> RoundPlan:
        """I local steps on every client, then the algorithm's communication."""
        plan = self.plans[self.round]
        next_plan = self.plans[self.round + 1] if self.round + 1 < len(self.plans) else None
        for i in range(plan.window):
            ctx = StepContext(plan.first_step + i, i, plan.round, plan.stage, plan.lr, plan.window)
            batch = self._batch(self.sampler.next())
            self.states = self.engine.map_clients(
                partial(self.algorithm.local_step, ctx=ctx), self.states, batch
            )
        stage_batch = None
        size = getattr(self.algorithm, "stage_batch_size", 0)
        if size and plan.stage_end and next_plan is not None:
            stage_batch = self.local_data.batch(self.aux_sampler.sample(size), self.device)
        round_batch = None
        round_size = getattr(self.algorithm, "round_batch_size", 0)
        if round_size:
            round_batch = self.local_data.batch(self.aux_sampler.sample(round_size), self.device)
        comm = self._collective()
        self.states = self.algorithm.communicate(
            self.states, comm, RoundContext(plan, next_plan, stage_batch, round_batch)
        )
        self.ledger.close_round()
        self.round += 1
        if not self._finite(comm):
            raise NonFiniteLoss(plan.round)
        return plan

    def _collective(self) -> SimCollective:
        """The round's collective (the distributed engine replaces it)."""
        return SimCollective(self.num_clients, self.engine, self.ledger)

    def _finite(self, comm: Any) -> bool:
        """Whether every client's last loss and model are finite after the round."""
        return bool(torch.isfinite(self.states["loss"]).all()) and is_finite(self.states["w"])

    def train_loss(self) -> float:
        """Mean over clients of the last local step's objective value."""
        return float(self.states["loss"].mean())

    def global_model(self) -> tuple[Tree, Tree]:
        """The averaged model: client 0's parameters (equal on all clients after a round)
        and the client mean of float buffers (they differ under the ``local`` policy)."""
        params, buffers = self.algorithm.model(self.states)
        params = index(params, 0)
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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = state["round"]
        self.states = tmap(lambda x: x.to(self.device), state["states"])
        self.sampler.load_state_dict(state["sampler"])
        self.aux_sampler.load_state_dict(state["aux_sampler"])
        self.ledger.load_state_dict(state["ledger"])

"""The ``distributed`` engine: clients spread over torch.distributed ranks.

Launched with ``torchrun`` (or any launcher that sets ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE``), gloo on CPU and nccl on GPU.
Each rank holds a contiguous block of clients (one by default) and runs the
very same :class:`~fedxrisk.engines.simulation.Simulation` round logic on them
(batched with ``vmap`` when it holds several); only the collective differs
(:class:`~fedxrisk.engines.dist_collective.DistCollective`: one packed
``all_reduce`` per ``mean``, one padded ``all_gather`` per ``gather``/``pool``).

The engine piggybacks a few numbers of its own on the round's first ``mean``
(the clients' loss sum, a non-finite flag, and under ``buffer_policy="local"``
the BatchNorm statistics), so the train loss, the NaN stop and the evaluated
model are global without another collective. Byte accounting is the
simulation's :class:`~fedxrisk.engines.ledger.ByteLedger`, call for call, so
``bytes_up/down`` agree across engines; the piggybacked numbers are not counted.

The rooms: :mod:`~fedxrisk.engines.launch` (rendezvous variables and client
layout, no communication), :mod:`~fedxrisk.engines.watchdog` (heartbeats and
the diagnosis of a dead or hung rank), :mod:`~fedxrisk.engines.dist_collective`
(the process group and the packed collectives), and this file (the engine).
"""

from __future__ import annotations

from typing import Any

import torch

from fedxrisk.algorithms.base import Algorithm
from fedxrisk.algorithms.schedule import Schedule
from fedxrisk.data.federated import FederatedData
from fedxrisk.engines.dist_collective import DistCollective, DistGroup
from fedxrisk.engines.launch import DEFAULT_TIMEOUT, check_launch, client_layout, launched_rank
from fedxrisk.engines.participation import Participation, round_collective
from fedxrisk.engines.privacy import ClientDP
from fedxrisk.engines.simulation import Simulation
from fedxrisk.errors import ConfigError, DistributedError
from fedxrisk.tree import Tree, fitting, index, is_finite, leaves, tmap

# re-exported: the run layer imports these from here until it imports them from their rooms
__all__ = [
    "DEFAULT_TIMEOUT", "DistCollective", "DistGroup", "DistributedError", "DistributedSimulation",
    "check_launch", "client_layout", "launched_rank",
]  # fmt: skip


class DistributedSimulation(Simulation):
    """:class:`Simulation` on this rank's clients, with :class:`DistCollective` between ranks.

    Every rank builds the same :class:`FederatedData` from the shared seed (the
    partition is global) and keeps the shards of its own clients; client k's
    sampler is seeded by ``(seed, k)`` as in the simulation engines, so the
    run is the loop engine's up to the order of floating-point sums.
    ``state_dict`` is collective and returns the full, simulation-format
    checkpoint on every rank (a loop/vmap run can resume it, and vice versa).
    """

    lazy_rounds = False  # every rank takes part in every collective: rounds over all its rows

    def __init__(
        self,
        algorithm: Algorithm,
        data: FederatedData,
        schedule: Schedule,
        batch_size: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        clients_per_rank: int | str | None = 1,
        timeout: float = DEFAULT_TIMEOUT,
        engine: str | None = None,
        privacy: ClientDP | None = None,
        noise: Any = None,
        participation: Participation | None = None,
    ):
        if participation is not None and "pool" in getattr(algorithm, "collectives", ()):
            raise ConfigError(
                f"data.clients_per_round with {algorithm.name} on the distributed engine: a rank without a "
                "participant cannot send score records of the round's shape; use engine loop, vmap or compile"
            )
        self.group = DistGroup.current(timeout, device)
        self.layout = client_layout(data.num_clients, self.group.world_size, clients_per_rank)
        mine = self.layout[self.group.rank]
        inner = engine or ("loop" if len(mine) == 1 else "vmap")
        super().__init__(
            algorithm,
            data,
            schedule,
            batch_size,
            seed,
            inner,
            self.group.device,
            clients=mine,
            privacy=privacy,
            noise=noise,
            participation=participation,
        )
        self.is_primary = self.group.rank == 0
        self._stats: torch.Tensor | None = None
        if self.privacy is not None:  # one secret noise source for all ranks: rank 0's
            self.privacy.share(lambda entropy: self.group.all_gather_object(entropy, "DP noise source"))

    @property
    def rank(self) -> int:
        return self.group.rank

    def _local_buffers(self) -> dict[str, torch.Tensor]:
        """Entries that differ across clients (float buffers under the ``local`` policy, personal
        parameters and buffers): their global mean is tracked for the evaluated model (summed with
        the round's statistics before ``communicate``; again after it at a stage end, which may
        restart them)."""
        problem = self.algorithm.problem
        local = getattr(problem, "local_names", frozenset())
        params, buffers = self.algorithm.model(self.states)
        out = {k: v for k, v in params.items() if k in local}
        if problem.buffer_policy == "local" or local:
            out |= {k: v for k, v in buffers.items() if v.is_floating_point()}
        return out

    def _collective(self) -> Any:
        self.group.watchdog.round = self.round
        loss = self.states["loss"].detach().double()
        bad = float(not bool(torch.isfinite(loss).all()) or not is_finite(self.states["w"]))
        mine = loss if self.participation is None else loss[self._participants.to(loss.device)]  # type: ignore[union-attr]
        parts = [mine.sum().reshape(1), torch.tensor([bad], dtype=torch.float64, device=loss.device)]
        parts += [v.double().sum(0).reshape(-1) for v in self._local_buffers().values()]
        comm = DistCollective(self.group, self.layout, self.engine, self.ledger, torch.cat(parts), self.seed)
        return round_collective(comm, self.privacy, self.participation, self.round, self._participants)

    def _finite(self, comm: Any) -> bool:  # type: ignore[override]
        self._stats = comm.finish()
        assert self._stats is not None
        if self.plans[self.round - 1].stage_end and (local := self._local_buffers()):  # every rank alike
            # a stage end may restart the entries that differ across clients (CODA+'s restart point):
            # the evaluated mean is taken after communicate, as the simulation's, by one more all_reduce
            sums = torch.cat([v.double().sum(0).reshape(-1) for v in local.values()])
            self.group.all_reduce(sums, "personal entries after the stage end (all_reduce)")
            self._stats = torch.cat([self._stats[:2], sums])
        return bool(torch.isfinite(self._stats[0])) and float(self._stats[1]) == 0.0

    def train_loss(self) -> float:
        """Mean over all K clients (the round's participants) of the last local loss (summed across ranks)."""
        if self._stats is None:
            return float(self.states["loss"].mean())
        return float(self._stats[0]) / (
            self.num_clients if self.participation is None else self.participation.count
        )

    def global_model(self) -> tuple[Tree, Tree]:
        """As :meth:`Simulation.global_model`, without communication: any rank can evaluate."""
        params, buffers = self.algorithm.model(self.states)
        params = index(params, 0)
        out = {
            k: v.float().mean(0).to(v.dtype) if v.is_floating_point() else v[0] for k, v in buffers.items()
        }
        local = self._local_buffers()
        if local and self._stats is not None:
            offset = 2
            for k, v in local.items():
                n = v[0].numel()
                mean = (self._stats[offset : offset + n] / self.num_clients).to(v.dtype).view(v.shape[1:])
                (params if k in params else out)[k] = mean
                offset += n
        return params, out

    # -- checkpoints in the simulation's format (collective) ------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The full checkpoint (all K clients), identical on every rank; all ranks must call it."""
        mine = {
            "states": tmap(lambda x: x.detach().cpu(), self.states),
            "sampler": self.sampler.state_dict(),
            "aux_sampler": self.aux_sampler.state_dict(),
        }
        parts = self.group.all_gather_object(mine, "checkpoint (all_gather_object)")
        return {
            "round": self.round,
            "states": tmap(lambda *xs: torch.cat(xs), *[p["states"] for p in parts]),
            "sampler": _merge_samplers([p["sampler"] for p in parts]),
            "aux_sampler": _merge_samplers([p["aux_sampler"] for p in parts]),
            "ledger": self.ledger.state_dict(),
            **({"privacy": self.privacy.state_dict()} if self.privacy is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a full checkpoint (from any engine): keep this rank's clients' slices."""
        first = next(leaves(state["states"]))[1]
        if first.shape[0] != self.num_clients:
            raise ValueError(f"checkpoint holds {first.shape[0]} clients, this run {self.num_clients}")
        rows = torch.tensor(self.clients)
        self.round = state["round"]
        mine = fitting(self.states, tmap(lambda x: x[rows], state["states"]))  # this rank's clients
        self.states = tmap(lambda x: x.to(self.device), mine)
        self.sampler.load_state_dict(_slice_sampler(state["sampler"], self.clients))
        self.aux_sampler.load_state_dict(_slice_sampler(state["aux_sampler"], self.clients))
        self.ledger.load_state_dict(state["ledger"])
        if self.privacy is not None:
            self.privacy.load_state_dict(state["privacy"])
        self._stats = None
        self._start_stream(begin=False)


def _merge_samplers(parts: list[dict[str, Any]]) -> dict[str, Any]:
    if "draws" in parts[0]:  # Poisson batches: one step counter, equal on every rank
        return parts[0]
    return {key: [x for p in parts for x in p[key]] for key in ("rngs", "queues")}


def _slice_sampler(state: dict[str, Any], clients: list[int]) -> dict[str, Any]:
    if "draws" in state:
        return state
    return {key: [state[key][k] for k in clients] for key in ("rngs", "queues")}

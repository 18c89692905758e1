"""The ``distributed`` engine: clients spread over torch.distributed ranks.

Launched with ``torchrun`` (or any launcher that sets ``MASTER_ADDR``,
``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE``), gloo on CPU and nccl on GPU.
Each rank holds a contiguous block of clients (one by default) and runs the
very same :class:`~fedxrisk.engines.simulation.Simulation` round logic on them
(batched with ``vmap`` when it holds several); only the collective differs:

- ``mean(tree)`` sums every leaf over the rank's clients, packs all leaves into
  one flat buffer per dtype (one in practice: float32) and runs ONE
  ``all_reduce(SUM)``, then divides by the number of clients K;
- ``gather(tree)`` packs all leaves of the rank's clients as bytes, pads them
  to the largest rank's size and runs ONE ``all_gather``; ``pool`` does the same
  with records and masks, then every rank runs the server's merge.

The engine piggybacks a few numbers of its own on the round's first ``mean``
(the clients' loss sum, a non-finite flag, and under ``buffer_policy="local"``
the BatchNorm statistics), so the train loss, the NaN stop and the evaluated
model are global without another collective. Byte accounting is the
simulation's :class:`~fedxrisk.engines.ledger.ByteLedger`, call for call, so
``bytes_up/down`` agree across engines; the piggybacked numbers are not counted.

Robustness: every collective runs under the process-group timeout, and a
watchdog thread (a heartbeat in the rendezvous store every second) names the
rank that died or hangs. A failed or overdue collective raises
:class:`DistributedError` naming the suspect ranks; a collective stuck past the
timeout (where the backend does not give up by itself) ends the process with
exit code 3 after printing the same diagnosis.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from fedxrisk.algorithms.base import Algorithm
from fedxrisk.algorithms.schedule import Schedule
from fedxrisk.data.federated import FederatedData
from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.pooling import merge_pool
from fedxrisk.engines.simulation import LoopEngine, Simulation, VmapEngine
from fedxrisk.errors import DistributedError  # noqa: F401  (re-exported)
from fedxrisk.run.spec import DEFAULT_TIMEOUT
from fedxrisk.tree import Tree, broadcast, index, is_finite, leaves, tmap

RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
HEARTBEAT_SECONDS = 1.0
WATCHDOG_EXIT_CODE = 3


# -- launch checks (no communication) -------------------------------------------------
def launch_env() -> dict[str, Any]:
    """The rendezvous variables torchrun sets, checked; raises ``ValueError`` naming what is missing."""
    missing = [v for v in RENDEZVOUS_VARS if not os.environ.get(v)]
    if missing:
        raise ValueError(
            f"the distributed engine needs the rendezvous variable(s) {', '.join(missing)}, which torchrun "
            "sets. Launch with `torchrun --nproc-per-node N -m fedxrisk run --engine distributed ...` "
            "(add --nnodes/--node-rank/--rdzv-endpoint across machines), or set MASTER_ADDR, MASTER_PORT, "
            "RANK and WORLD_SIZE on every process yourself"
        )
    env: dict[str, Any] = {"MASTER_ADDR": os.environ["MASTER_ADDR"]}
    for name in ("MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        raw = os.environ.get(name, os.environ["RANK"] if name == "LOCAL_RANK" else "")
        try:
            env[name] = int(raw)
        except ValueError:
            raise ValueError(f"rendezvous variable {name} must be an integer, got {raw!r}") from None
    if env["WORLD_SIZE"] < 1 or not 0 <= env["RANK"] < env["WORLD_SIZE"]:
        raise ValueError(f"need 0 ≤ RANK < WORLD_SIZE, got RANK={env['RANK']} WORLD_SIZE={env['WORLD_SIZE']}")
    if not 0 < env["MASTER_PORT"] < 65536:
        raise ValueError(f"MASTER_PORT must be a TCP port (1–65535), got {env['MASTER_PORT']}")
    return env


def parse_clients_per_rank(value: int | str | None) -> int | None:
    """``1`` (default), any positive integer, or ``"auto"``/None (spread K evenly); else ``ValueError``."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"clients_per_rank must be a positive integer or 'auto', got {value!r}") from None
    if n < 1:
        raise ValueError(f"clients_per_rank must be ≥ 1 or 'auto', got {n}")
    return n


def client_layout(
    num_clients: int, world_size: int, clients_per_rank: int | str | None = 1
) -> list[list[int]]:
    """The global client indices held by each rank: contiguous blocks, in rank order.

    With ``clients_per_rank = n`` the world size must be exactly ``K / n``; with
    ``"auto"`` the K clients are spread as evenly as possible (every rank gets one or more).
    """
    per_rank = parse_clients_per_rank(clients_per_rank)
    if per_rank is None:
        if world_size > num_clients:
            raise ValueError(
                f"{world_size} ranks but only {num_clients} clients: every rank needs at least one client; "
                f"start at most {num_clients} processes"
            )
        return [b.tolist() for b in np.array_split(np.arange(num_clients), world_size)]
    if world_size * per_rank != num_clients:
        hints = [f"start {num_clients // per_rank} processes"] if num_clients % per_rank == 0 else []
        if world_size <= num_clients:
            hints.append("use --clients-per-rank auto to spread the clients over the ranks")
        raise ValueError(
            f"--engine distributed with {per_rank} client(s) per rank needs WORLD_SIZE × {per_rank} = "
            f"--clients, got WORLD_SIZE={world_size} for {num_clients} clients; " + ", or ".join(hints)
        )
    return [list(range(r * per_rank, (r + 1) * per_rank)) for r in range(world_size)]


def check_launch(
    num_clients: int, clients_per_rank: int | str | None = 1, timeout: float = DEFAULT_TIMEOUT
) -> tuple[int, list[list[int]]]:
    """(rank, layout) for this process, checked before any data is loaded or training starts."""
    if not timeout > 0:
        raise ValueError(f"dist_timeout must be > 0 seconds, got {timeout}")
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        env = launch_env()
        rank, world = env["RANK"], env["WORLD_SIZE"]
    return rank, client_layout(num_clients, world, clients_per_rank)


def launched_rank() -> int:
    """This process's rank as set by the launcher (0 when not launched by one)."""
    return int(os.environ.get("RANK", "0") or 0)


# -- watchdog --------------------------------------------------------------------------
class Watchdog:
    """Heartbeats in the rendezvous store, and the diagnosis of who died or hangs.

    Every ``interval`` seconds a daemon thread writes ``<beat> <round>`` under
    this rank's key. A rank whose beat stops advancing is dead or frozen; a rank
    that beats but reports an older round is alive and stuck. A collective in
    flight for longer than ``timeout + grace`` ends the process (exit code 3).
    """

    PREFIX = "fedxrisk/heartbeat/"

    def __init__(self, rank: int, world_size: int, host: str | None, port: int | None, timeout: float):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.host, self.port = host, port
        self.interval = HEARTBEAT_SECONDS
        self.grace = max(10.0, 0.1 * timeout)
        self.round = 0
        self.inflight: tuple[str, float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.failed = False  # a collective failed: no clean teardown barrier
        self._beat = 0
        self.store = None
        if host is not None and port is not None:
            self.store = dist.TCPStore(
                host, port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False
            )
            self._write()
        self._thread = threading.Thread(target=self._run, name="fedxrisk-watchdog", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        self._beat += 1
        with self._lock:
            self.store.set(f"{self.PREFIX}{self.rank}", f"{self._beat} {self.round}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.store is not None:
                try:
                    self._write()
                except Exception:  # the store's host went away; the diagnosis reports it
                    pass
            flight = self.inflight
            if flight is not None and time.monotonic() - flight[1] > self.timeout + self.grace:
                msg = (
                    f"fedxrisk rank {self.rank}: {flight[0]} in round {self.round} has not finished after "
                    f"{self.timeout + self.grace:.0f} s (timeout {self.timeout:.0f} s). {self.diagnose()}"
                )
                print(msg, file=sys.stderr, flush=True)
                os._exit(WATCHDOG_EXIT_CODE)

    def stop(self) -> None:
        """Stop beating and wait for the thread, so no store call is in flight at teardown."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.interval + 5.0)

    def _read(self) -> dict[int, tuple[int, int] | None]:
        out: dict[int, tuple[int, int] | None] = {}
        for r in range(self.world_size):
            key = f"{self.PREFIX}{r}"
            with self._lock:
                value = self.store.get(key).decode() if self.store.check([key]) else None
            out[r] = tuple(int(x) for x in value.split()) if value else None  # type: ignore[misc]
        return out

    def diagnose(self) -> str:
        """Which peers are dead/frozen or behind, from two heartbeat readings."""
        if self.store is None:
            return "No rendezvous store to diagnose which rank failed."
        try:
            first = self._read()
            time.sleep(2.5 * self.interval)
            second = self._read()
        except Exception:
            return (
                f"The rendezvous store at {self.host}:{self.port} is unreachable: its host is down "
                "(rank 0 hosts it unless torchrun does)."
            )
        dead = [
            r
            for r in range(self.world_size)
            if r != self.rank and (second[r] is None or first[r] == second[r])
        ]
        if dead:
            return f"Rank(s) {dead} stopped responding (no heartbeat for {2.5 * self.interval:.1f} s): dead or frozen."
        rounds = {r: v[1] for r, v in second.items() if v is not None}
        behind = [r for r, rd in rounds.items() if rd < max(rounds.values())]
        if behind:
            return (
                f"Rank(s) {behind} are alive but behind (rounds {[rounds[r] for r in behind]}): hung or slow."
            )
        return (
            "All ranks are alive; the network between them may be broken "
            "(check GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME and firewalls)."
        )

    @contextmanager
    def guard(self, name: str) -> Iterator[None]:
        """Run one collective: a failure becomes a :class:`DistributedError` naming the suspects."""
        self.inflight = (name, time.monotonic())
        try:
            yield
        except (RuntimeError, dist.DistError) as e:
            self.failed = True
            if isinstance(e, DistributedError):
                raise
            detail = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            raise DistributedError(
                f"rank {self.rank}: {name} failed in round {self.round} ({detail}). {self.diagnose()}"
            ) from e
        finally:
            self.inflight = None


# -- the process group ---------------------------------------------------------------------
class DistGroup:
    """This process's membership: rank, world size, device, backend, timeout and watchdog."""

    _current: DistGroup | None = None

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, device: str | torch.device = "cpu"):
        if timeout <= 0:
            raise ValueError(f"dist_timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        device = torch.device(device)
        self.owns_group = not dist.is_initialized()
        env = launch_env() if self.owns_group else None
        local_rank = env["LOCAL_RANK"] if env else int(os.environ.get("LOCAL_RANK", "0") or 0)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.device = device
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if self.owns_group:
            assert env is not None
            try:
                dist.init_process_group(
                    self.backend, init_method="env://", rank=env["RANK"], world_size=env["WORLD_SIZE"],
                    timeout=timedelta(seconds=timeout),
                )  # fmt: skip
            except (RuntimeError, dist.DistError) as e:
                raise DistributedError(
                    f"rank {env['RANK']}: could not join the process group of {env['WORLD_SIZE']} ranks at "
                    f"{env['MASTER_ADDR']}:{env['MASTER_PORT']} within {timeout:.0f} s ({str(e).strip()[:300]}). "
                    "Check that every rank was started with the same MASTER_ADDR/MASTER_PORT/WORLD_SIZE and "
                    "that the port is reachable (firewall; GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)"
                ) from e
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        host = os.environ.get("MASTER_ADDR")
        port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None
        self.watchdog = Watchdog(self.rank, self.world_size, host, port, timeout)
        atexit.register(self.close)

    @classmethod
    def current(cls, timeout: float = DEFAULT_TIMEOUT, device: str | torch.device = "cpu") -> DistGroup:
        """The process's group, created (and the process group initialised) on first use."""
        if cls._current is None:
            cls._current = cls(timeout, device)
        return cls._current

    def close(self) -> None:
        """Stop the watchdog and tear the process group down (also run at exit).

        After a clean run every rank first meets at a barrier: rank 0 hosts the
        rendezvous store, and leaving before the others have finished their last
        collective would pull the store from under them. After a failure there is
        no barrier (a peer may be gone)."""
        self.watchdog.stop()
        if self.owns_group and dist.is_initialized():
            if not self.watchdog.failed:
                try:
                    dist.barrier()
                except (RuntimeError, dist.DistError):
                    pass
            dist.destroy_process_group()
        if DistGroup._current is self:
            DistGroup._current = None

    def all_reduce(self, buf: torch.Tensor, name: str) -> None:
        with self.watchdog.guard(name):
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)

    def all_gather(self, out: list[torch.Tensor], buf: torch.Tensor, name: str) -> None:
        with self.watchdog.guard(name):
            dist.all_gather(out, buf)

    def all_gather_object(self, obj: Any, name: str) -> list[Any]:
        parts: list[Any] = [None] * self.world_size
        with self.watchdog.guard(name):
            dist.all_gather_object(parts, obj)
        return parts


# -- the collective ---------------------------------------------------------------------------
def _refill(tree: Tree, values: Sequence[torch.Tensor]) -> Tree:
    """A tree of the same structure with ``values`` as leaves, in :func:`leaves` order."""
    it = iter(values)
    return tmap(lambda _: next(it), tree)


class DistCollective:
    """``mean``/``gather`` across ranks over the stacked state of this rank's clients.

    ``stats`` (1-D, float) are engine numbers summed across ranks on the round's
    first ``mean`` (or by :meth:`finish` when the algorithm never averages).
    """

    def __init__(
        self,
        group: DistGroup,
        layout: list[list[int]],
        engine: LoopEngine | VmapEngine,
        ledger: ByteLedger,
        stats: torch.Tensor | None = None,
        seed: int = 0,
    ):
        self.group, self.layout, self.engine, self.ledger = group, layout, engine, ledger
        self.seed = seed
        self.num_clients = sum(len(b) for b in layout)
        self.local_clients = len(layout[group.rank])
        self._stats = stats
        self.global_stats: torch.Tensor | None = None

    def mean(self, tree: Tree) -> Tree:
        """Mean over all K clients: local sums, one packed ``all_reduce(SUM)`` per dtype, ÷ K.

        The leaves (summed over this rank's k clients when k > 1) are packed with
        one copy, reduced in place, and handed back as views of the reduced buffer
        (k = 1) or of one ``[k, ...]`` block. Packing and unpacking use torch's
        ``_flatten_dense_tensors`` / ``_unflatten_dense_tensors`` (one C++ call
        each, as DistributedDataParallel does), so the cost per leaf stays small.
        """
        self.ledger.record("mean", tree, self.num_clients)
        items = [t for _, t in leaves(tree)]
        k = self.local_clients
        results: list[torch.Tensor | None] = [None] * len(items)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(items):
            if not t.is_floating_point():
                raise TypeError(f"mean needs floating-point tensors, got {t.dtype}")
            by_dtype.setdefault(t.dtype, []).append(i)
        for dtype, idx in by_dtype.items():
            local = [items[i] if k == 1 else items[i].sum(0) for i in idx]  # [1, *s] or [*s]
            stats = self._stats
            if stats is not None:  # the engine's numbers ride along at the end
                local.append(stats.to(device=local[0].device, dtype=dtype))
            buf = _flatten_dense_tensors(local)
            self.group.all_reduce(buf, "mean (all_reduce)")
            if stats is not None:
                self.global_stats, self._stats = buf[buf.numel() - stats.numel() :].clone(), None
                local.pop()
            buf.div_(self.num_clients)
            means = _unflatten_dense_tensors(buf, local)
            for i, m in zip(idx, means):
                results[i] = m if k == 1 else m.unsqueeze(0).expand(k, *m.shape).clone()
        return _refill(tree, results)  # type: ignore[arg-type]

    def gather(self, tree: Tree) -> Tree:
        """Every client's leaves on every client: one padded ``all_gather`` of the packed bytes.

        Ranks may hold different numbers of clients (``clients_per_rank="auto"``):
        each rank's bytes are padded to the largest rank's. The per-client size
        travels in an 8-byte header and must agree across ranks.
        """
        self.ledger.record("gather", tree, self.num_clients)
        full = self._all_clients(tree)  # [K, *shape], clients in global order
        return broadcast(full, self.local_clients)

    def pool(self, groups: dict[str, Tree], valid: dict[str, torch.Tensor], key: int) -> dict[str, Tree]:
        """``comm.pool``: one all_gather of records and masks, then the server's merge on every rank.

        There is no server between ranks: every rank computes the same merge, so the
        masks and the client order are visible to every rank (one trust domain;
        docs/privacy.md). Results equal the simulation's.
        """
        full = self._all_clients({"groups": groups, "valid": valid})
        merged = merge_pool(full["groups"], full["valid"], self.seed, key)
        self.ledger.record_pool(groups, valid, merged)
        return broadcast(merged, self.local_clients)

    def _all_clients(self, tree: Tree) -> Tree:
        """All K clients' leaves ``[K, *shape]`` from this rank's ``[k, *shape]`` (one all_gather)."""
        items = [t for _, t in leaves(tree)]
        device = items[0].device if items else self.group.device
        per_client = [t[0].numel() * t.element_size() for t in items]
        size = sum(per_client)
        header = torch.tensor([size], dtype=torch.int64).view(torch.uint8).to(device)
        body = [t.contiguous().reshape(-1).view(torch.uint8) for t in items if t.numel()]
        most = max(len(b) for b in self.layout)
        length = 8 + most * size
        buf = torch.zeros(length, dtype=torch.uint8, device=device)
        packed = torch.cat([header, *body])
        buf[: packed.numel()] = packed
        out = [torch.empty_like(buf) for _ in range(self.group.world_size)]
        self.group.all_gather(out, buf, "gather (all_gather)")
        per_leaf: list[list[torch.Tensor]] = [[] for _ in items]
        for r, chunk in enumerate(out):
            theirs = int(chunk[:8].clone().view(torch.int64))
            if theirs != size:
                raise DistributedError(
                    f"rank {self.group.rank}: gather payload of rank {r} has {theirs} bytes per client, "
                    f"this rank {size}: the gathered tree must have the same shapes on every client"
                )
            k, offset = len(self.layout[r]), 8
            for i, t in enumerate(items):
                n = k * per_client[i]
                raw = chunk[offset : offset + n].clone()
                per_leaf[i].append(raw.view(t.dtype).reshape(k, *t.shape[1:]))
                offset += n
        return _refill(tree, [torch.cat(parts) for parts in per_leaf])

    def per_client(self, fn, *trees: Tree) -> Tree:
        return self.engine.map_clients(fn, *trees)

    def finish(self) -> torch.Tensor | None:
        """The summed stats: from the round's first ``mean``, or one extra ``all_reduce`` now."""
        if self._stats is not None:
            buf = self._stats.clone()
            self.group.all_reduce(buf, "engine statistics (all_reduce)")
            self.global_stats, self._stats = buf, None
        return self.global_stats


# -- the engine ----------------------------------------------------------------------------------
class DistributedSimulation(Simulation):
    """:class:`Simulation` on this rank's clients, with :class:`DistCollective` between ranks.

    Every rank builds the same :class:`FederatedData` from the shared seed (the
    partition is global) and keeps the shards of its own clients; client k's
    sampler is seeded by ``(seed, k)`` as in the simulation engines, so the
    run is the loop engine's up to the order of floating-point sums.
    ``state_dict`` is collective and returns the full, simulation-format
    checkpoint on every rank (a loop/vmap run can resume it, and vice versa).
    """

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
    ):
        self.group = DistGroup.current(timeout, device)
        self.layout = client_layout(data.num_clients, self.group.world_size, clients_per_rank)
        mine = self.layout[self.group.rank]
        inner = engine or ("loop" if len(mine) == 1 else "vmap")
        super().__init__(algorithm, data, schedule, batch_size, seed, inner, self.group.device, clients=mine)
        self.is_primary = self.group.rank == 0
        self._stats: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        return self.group.rank

    def _local_buffers(self) -> dict[str, torch.Tensor]:
        """Float buffers that differ across clients (``local`` policy): their global mean is tracked."""
        if self.algorithm.problem.buffer_policy != "local":
            return {}
        _, buffers = self.algorithm.model(self.states)
        return {k: v for k, v in buffers.items() if v.is_floating_point()}

    def _collective(self) -> DistCollective:
        self.group.watchdog.round = self.round
        loss = self.states["loss"].detach().double()
        bad = float(not bool(torch.isfinite(loss).all()) or not is_finite(self.states["w"]))
        parts = [loss.sum().reshape(1), torch.tensor([bad], dtype=torch.float64, device=loss.device)]
        parts += [v.double().sum(0).reshape(-1) for v in self._local_buffers().values()]
        return DistCollective(self.group, self.layout, self.engine, self.ledger, torch.cat(parts), self.seed)

    def _finite(self, comm: DistCollective) -> bool:  # type: ignore[override]
        self._stats = comm.finish()
        assert self._stats is not None
        return bool(torch.isfinite(self._stats[0])) and float(self._stats[1]) == 0.0

    def train_loss(self) -> float:
        """Mean over all K clients of the last local loss (summed across ranks in the round)."""
        if self._stats is None:
            return float(self.states["loss"].mean())
        return float(self._stats[0]) / self.num_clients

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
                out[k] = (self._stats[offset : offset + n] / self.num_clients).to(v.dtype).view(v.shape[1:])
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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a full checkpoint (from any engine): keep this rank's clients' slices."""
        first = next(leaves(state["states"]))[1]
        if first.shape[0] != self.num_clients:
            raise ValueError(f"checkpoint holds {first.shape[0]} clients, this run {self.num_clients}")
        rows = torch.tensor(self.clients)
        self.round = state["round"]
        self.states = tmap(lambda x: x[rows].to(self.device), state["states"])
        self.sampler.load_state_dict(_slice_sampler(state["sampler"], self.clients))
        self.aux_sampler.load_state_dict(_slice_sampler(state["aux_sampler"], self.clients))
        self.ledger.load_state_dict(state["ledger"])
        self._stats = None
        self._start_stream(begin=False)


def _merge_samplers(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: [x for p in parts for x in p[key]] for key in ("rngs", "queues")}


def _slice_sampler(state: dict[str, Any], clients: list[int]) -> dict[str, Any]:
    return {key: [state[key][k] for k in clients] for key in ("rngs", "queues")}

"""The process group and the collective between ranks of the ``distributed`` engine.

- ``mean(tree)`` sums every leaf over the rank's clients, packs all leaves into
  one flat buffer per dtype (one in practice: float32) and runs ONE
  ``all_reduce(SUM)``, then divides by the number of clients K;
- ``gather(tree)`` packs all leaves of the rank's clients as bytes, pads them
  to the largest rank's size and runs ONE ``all_gather``; ``pool`` does the same
  with records and masks, then every rank runs the server's merge.

The engine's own numbers (``stats``) ride along on the round's first ``mean``.
Byte accounting is the simulation's :class:`~fedxrisk.engines.ledger.ByteLedger`,
call for call; the piggybacked numbers are not counted. Every call runs under
the :class:`~fedxrisk.engines.watchdog.Watchdog`'s guard.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from fedxrisk.engines.launch import DEFAULT_TIMEOUT, launch_env
from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.pooling import merge_pool
from fedxrisk.engines.simulation import LoopEngine, VmapEngine
from fedxrisk.engines.watchdog import Watchdog
from fedxrisk.errors import DistributedError
from fedxrisk.tree import Tree, broadcast, leaves, tmap


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

    def sum_over_ranks(
        self, sums: dict[str, torch.Tensor], count: int
    ) -> tuple[dict[str, torch.Tensor], int]:
        """Client-level DP: this rank's clipped sums (float64) and participant count, summed over
        ranks in one packed ``all_reduce``; every rank then adds the same seeded noise."""
        if self._stats is not None:  # the engine's numbers ride along, as in :meth:`mean`
            stats = self._stats.to(torch.float64)
        else:
            stats = torch.zeros(0, dtype=torch.float64)
        local = [*sums.values(), torch.tensor([float(count)], dtype=torch.float64), stats]
        local = [t.to(self.group.device, torch.float64) for t in local]
        buf = _flatten_dense_tensors(local)
        self.group.all_reduce(buf, "private mean (all_reduce)")
        out = _unflatten_dense_tensors(buf, local)
        if self._stats is not None:
            self.global_stats, self._stats = out[-1].to(self._stats.dtype), None
        return dict(zip(sums, out[: len(sums)])), int(round(float(out[len(sums)])))

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

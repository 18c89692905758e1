"""Launching the distributed engine: the rendezvous variables and the client layout.

Everything here runs before any communication (and before data is loaded), so a
bad launch fails in a fraction of a second with one line naming the problem.
Heavy libraries are imported inside the functions that need them: the run
config reads :data:`DEFAULT_TIMEOUT` from here without importing torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

DEFAULT_TIMEOUT = 300.0  # seconds a collective may take; must exceed the slowest round (steps + evaluation)
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
_PLANNED: ContextVar[int | None] = ContextVar("planned_world_size", default=None)


@contextmanager
def planned_world(world_size: int) -> Iterator[None]:
    """Check a config as rank 0 of ``world_size`` ranks not started yet (:func:`launch_local`)."""
    token = _PLANNED.set(world_size)
    try:
        yield
    finally:
        _PLANNED.reset(token)


def launch_env() -> dict[str, Any]:
    """The rendezvous variables torchrun sets, checked; raises ``ValueError`` naming what is missing."""
    missing = [v for v in RENDEZVOUS_VARS if not os.environ.get(v)]
    if missing:
        raise ValueError(
            f"the distributed engine needs the rendezvous variable(s) {', '.join(missing)}, which torchrun "
            "sets. On one machine: `fedxrisk run --engine distributed --nproc-per-node N ...`; across "
            "machines: `torchrun --nnodes/--node-rank/--rdzv-endpoint ... -m fedxrisk run --engine distributed ...`; "
            "or set MASTER_ADDR, MASTER_PORT, "
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
        import numpy as np

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
    dist = sys.modules.get("torch.distributed")  # a process group exists only if torch is loaded
    if _PLANNED.get() is not None:
        rank, world = 0, _PLANNED.get()
    elif dist is not None and dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        env = launch_env()
        rank, world = env["RANK"], env["WORLD_SIZE"]
    return rank, client_layout(num_clients, world, clients_per_rank)


def launched_rank() -> int:
    """This process's rank as set by the launcher (0 when not launched by one)."""
    return int(os.environ.get("RANK", "0") or 0)


def launch_local(nproc: int, args: Sequence[str]) -> int:
    """Run ``fedxrisk ARGS`` as ``nproc`` ranks on this machine, as ``torchrun --standalone`` would,
    and return the exit status: 0, or the first failed rank's. The ranks print their own errors
    (rank 0 a config error, every rank a lost peer); torchrun's report of the failure (its
    traceback and failure table) is not printed: one line is, when a rank died without a word."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: one thread per rank unless set
    argv = ["--standalone", f"--nproc-per-node={nproc}", "-m", "fedxrisk", *args]
    options = parse_args(argv)
    options.rdzv_backend, options.rdzv_endpoint = "c10d", "localhost:0"  # what --standalone means
    options.rdzv_id = f"fedxrisk-{os.getpid()}"
    config, command, command_args = config_from_args(options)
    quiet = logging.getLogger("torch.distributed.elastic")  # "failed (exitcode: 2) local_rank: 0 …"
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        elastic_launch(config=config, entrypoint=command)(*command_args)
    except ChildFailedError as e:
        _rank, failure = e.get_first_failure()
        if failure.exitcode < 0 or failure.exitcode > 2:  # 1 and 2: the rank said why
            print(
                f"Error: rank {failure.global_rank} {_death(failure.exitcode)}; the other ranks were stopped",
                file=sys.stderr,
            )
        return failure.exitcode if failure.exitcode > 0 else 1
    finally:
        quiet.level = level
    return 0


def _death(exitcode: int) -> str:
    import signal

    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"

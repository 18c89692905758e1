"""Heartbeats and diagnosis for the distributed engine: which rank died, hangs or lags.

Every collective runs under the process-group timeout, and a watchdog thread
(a heartbeat in the rendezvous store every second) names the rank that died or
hangs. A failed or overdue collective raises :class:`DistributedError` naming
the suspect ranks; a collective stuck past the timeout (where the backend does
not give up by itself) ends the process with exit code 3 after printing the
same diagnosis.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

from fedxrisk.errors import DistributedError

HEARTBEAT_SECONDS = 1.0
WATCHDOG_EXIT_CODE = 3


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

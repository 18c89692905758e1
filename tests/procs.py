"""Real processes for deployment tests: find an executable, a free port, stop a process tree."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

HOST = "127.0.0.1"


def exe(name: str) -> str:
    """``name`` next to this Python (a virtualenv's bin) or on PATH; skip the test if absent."""
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} not found next to {sys.executable} or on PATH")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), deepest last."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    out, frontier = [], [pid]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        out += frontier
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_all(procs: Iterable[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGTERM ``procs`` and all their descendants (Flower detaches some), SIGKILL what is left."""
    procs = list(procs)
    pids = [p for proc in procs for p in (proc.pid, *descendants(proc.pid))]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)
        if not any(alive(p) for p in pids):
            return

"""A real Flower deployment on 127.0.0.1: one SuperLink, two SuperNodes, ``flwr run``.

Skipped unless the extra is installed (``pip install -e '.[flower]'``). One
federation serves the whole module: every message starts a ClientApp process
on each SuperNode (torch imported anew), so the cost is the number of
messages, and the runs are as short as the checks allow. Two runs submitted
together are checked against the loop engine: CODASCA over two rounds (state
kept in the node's context across messages and rounds, ``mean``) and FeDXL2
over one round (its ``begin`` hook and ``gather``); the other algorithms'
numbers are checked through the same protocol in-process
(test_flower_protocol.py). Then a SuperNode is shut down in the middle of a
LocalSGDM run and the server must stop that run with a message naming the
site. Every process started here is stopped at the end (its process group
and descendants).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")

from fedxrisk.algorithms import ALGORITHMS  # noqa: E402
from fedxrisk.flower.__main__ import write_app  # noqa: E402
from fedxrisk.flower.app import from_records, to_records  # noqa: E402
from fedxrisk.flower.wire import Packet  # noqa: E402
from fedxrisk.metrics import evaluate  # noqa: E402
from helpers import make_sim, max_abs_diff, run_all  # noqa: E402

HOST = "127.0.0.1"
SRC = Path(__file__).resolve().parents[1] / "src"
SPLIT = {"partition": "iid", "imratio": 0.3, "seed": 0}
SETTINGS = {"local-steps": 2, "batch-size": 8, "lr": 0.1, "stages": 1, "test-data": "digits", **SPLIT}
ALGORITHM_ROUNDS = {"codasca": 2, "fedxl2": 1}  # 4 and 5 messages per site


def _options(algorithm: str) -> dict:
    """Class-aware algorithms (FeDXL): B1 = 4 positives + 4 negatives in the batch of 8."""
    return {"positives_per_batch": 4} if ALGORITHMS[algorithm].positives_per_batch else {}


RUN_WAIT = 900.0  # s; an idle 2-core machine needs about a minute, a heavily loaded one many


def _toml(value) -> str:
    """A --run-config value: flwr's parser takes no escaped quotes, so JSON text goes in a literal string."""
    return f"'{value}'" if isinstance(value, str) and '"' in value else json.dumps(value)


def _exe(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} not found next to {sys.executable} or on PATH")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """All descendants of ``pid`` (from /proc), deepest last."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process, its group and its descendants; SIGKILL what is left after ``timeout``."""
    pids = [proc.pid, *_children(proc.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids[1:]):
            time.sleep(0.2)
        if not any(_alive(p) for p in pids[1:]):
            return


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Federation:
    def __init__(self, root: Path):
        self.root = root
        self.port = _free_port()
        self.env = {
            **os.environ,
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
            # Flower starts flower-superexec and flwr-clientapp by name
            "PATH": os.pathsep.join([str(Path(_exe("flower-superlink")).parent), os.environ.get("PATH", "")]),
        }
        self.procs: list[subprocess.Popen] = []
        self.nodes: list[subprocess.Popen] = []
        home = root / "cli-home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "{HOST}:{self.port}"\ninsecure = true\n'
        )
        self.app = write_app(root / "app", SETTINGS)

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        home = self.root / f"home-{name}"
        home.mkdir()
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            args, cwd=self.root, env={**self.env, "FLWR_HOME": str(home)}, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        self._start(
            "superlink",
            [_exe("flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
             "--host", HOST, "--port", str(self.port)],
        )  # fmt: skip
        self._wait_port(self.port)
        for k in range(2):
            config = f'dataset="digits" partition-id={k} num-partitions=2'
            args = [_exe("flower-supernode"), "--insecure", "--superlink", f"{HOST}:{self.port}",
                    "--host", HOST, "--port", str(_free_port()), "--node-config", config]  # fmt: skip
            self.nodes.append(self._start(f"supernode-{k}", args))

    def _wait_port(self, port: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[0].poll() is not None:
                raise RuntimeError(
                    f"flower-superlink exited: {(self.root / 'superlink.log').read_text()[-2000:]}"
                )
            with socket.socket() as s:
                if s.connect_ex((HOST, port)) == 0:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"SuperLink not listening on {HOST}:{port} after {timeout} s")

    def submit(self, out: Path, **run_config) -> None:
        overrides = " ".join(f"{k}={_toml(v)}" for k, v in {**run_config, "out-dir": str(out)}.items())
        result = subprocess.run(
            [_exe("flwr"), "run", str(self.app), "local", "--run-config", overrides],
            env={**self.env, "FLWR_HOME": str(self.root / "cli-home")}, capture_output=True, text=True,
            timeout=180, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr

    def wait_summary(self, out: Path, timeout: float = RUN_WAIT) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (out / "summary.json").exists():
                return json.loads((out / "summary.json").read_text())
            time.sleep(0.5)
        logs = {p.name: p.read_text()[-1500:] for p in self.root.glob("*.log")}
        raise TimeoutError(f"no {out}/summary.json after {timeout} s; logs: {logs}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = Federation(tmp_path_factory.mktemp("flower"))
    try:
        fed.start()
        yield fed
    finally:
        fed.stop()
        assert all(p.poll() is not None for p in fed.procs)


def _reference(algorithm: str, rounds: int):
    sim = run_all(
        make_sim(
            algorithm, "loop", clients=2, rounds=rounds, local_steps=SETTINGS["local-steps"],
            batch_size=SETTINGS["batch-size"], lr=SETTINGS["lr"], stages=SETTINGS["stages"],
            options=_options(algorithm), **SPLIT,
        )
    )  # fmt: skip
    params, buffers = sim.global_model()
    return sim, params, evaluate(sim.algorithm.problem, params, buffers, sim.data)


def test_packets_map_to_named_records():
    """Each tensor group is one ArrayRecord of named arrays; config and metrics have their own records."""
    packet = Packet(
        config={"pending": 2, "kind": "mean"},
        metrics={"loss": 0.25},
        arrays={
            "payload": {
                "w/fc1.weight": torch.ones(2, 3),
                "alpha": torch.tensor(0.5),
                "buffers/": torch.empty(0),
            }
        },
    )
    records = to_records(packet)
    assert sorted(records) == ["arrays.payload", "config", "metrics"]
    assert list(records["arrays.payload"]) == ["w/fc1.weight", "alpha", "buffers/"]
    back = from_records(records)
    assert back.config == packet.config and back.metrics == packet.metrics
    assert max_abs_diff(back.arrays["payload"], packet.arrays["payload"]) == 0.0


def test_flower_runs_match_the_loop_engine(federation, tmp_path):
    """CODASCA and FeDXL2 through flwr run: the loop engine's numbers."""
    outs = {name: tmp_path / name for name in ALGORITHM_ROUNDS}
    for name, rounds in ALGORITHM_ROUNDS.items():  # submitted together: the SuperNodes interleave them
        federation.submit(outs[name], algorithm=name, rounds=rounds, options=json.dumps(_options(name)))
    for name, rounds in ALGORITHM_ROUNDS.items():
        summary = federation.wait_summary(outs[name])
        assert summary["status"] == "completed", summary["error"]
        sim, params, metrics = _reference(name, rounds)
        assert summary["rounds"] == rounds and summary["num_clients"] == 2
        for key in ("test_auroc", "test_ap", "client_auroc_mean"):
            assert summary["final"][key] == pytest.approx(metrics[key], abs=1e-5), (name, key)
        assert summary["final"]["train_loss"] == pytest.approx(sim.train_loss(), abs=1e-5)
        assert max_abs_diff(torch.load(outs[name] / "model.pt")["params"], params) < 1e-5
        assert summary["communication"] == sim.ledger.summary()


def test_a_supernode_shut_down_mid_run_stops_the_run_with_a_clear_message(federation, tmp_path):
    """Runs last (it removes site 1). Policy: the round fails, naming the site; nothing hangs."""
    out = tmp_path / "lost"
    federation.submit(out, algorithm="localsgdm", rounds=40, **{"round-timeout": 240.0})
    deadline = time.monotonic() + RUN_WAIT
    while not (out / "history.csv").exists() or len((out / "history.csv").read_text().splitlines()) < 2:
        assert time.monotonic() < deadline, "the run never finished its first round"
        time.sleep(0.3)
    _stop(federation.nodes[1])  # the organization shuts its SuperNode down in the middle of round 2+
    summary = federation.wait_summary(out)
    assert summary["status"] == "failed"
    assert "site 1 (node" in summary["error"] and "partition-id 1" in summary["error"]
    assert "left the federation" in summary["error"]  # SIGTERM: the SuperNode deregisters at once
    assert 1 <= summary["rounds"] < 40
    assert (out / "model.pt").exists()

"""``fedxrisk run --nproc-per-node N``: a distributed run started on this machine, its config
checked before any rank starts, a failure reported in one line (issue 25: a torchrun mistake
printed the error twice, then torchrun's 30-line traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedxrisk.engines.launch import _death
from fedxrisk.run.recipes import run_experiment
from fedxrisk.run.spec import RunConfig

SRC = Path(__file__).resolve().parents[1] / "src"
TORCHRUN_NOISE = ("Traceback", "ChildFailedError", "FAILED", "Root Cause", "exitcode", "site-packages/torch")


def _fedxrisk(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(var, None)
    return subprocess.run(
        [sys.executable, "-m", "fedxrisk", "run", *args], env=env, cwd=cwd, capture_output=True, text=True
    )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def test_a_launch_mistake_is_one_line_before_any_rank_starts(tmp_path):
    cases = {
        "more ranks than clients": (["--clients", "2"], "got WORLD_SIZE=3 for 2 clients"),
        # one mistake each: three clients for the three ranks, so only the key is wrong (check lists every error)
        "bad key": (["--clients", "3", "--set", "data.clientz=2"], "unknown key 'data.clientz'"),
        "not distributed": (["--engine", "loop"], "add --engine distributed"),
    }
    for name, (args, piece) in cases.items():
        engine = [] if "--engine" in args else ["--engine", "distributed"]
        done = _fedxrisk(*engine, "--nproc-per-node", "3", *args, "--rounds", "1", cwd=tmp_path)
        assert done.returncode == 2, (name, done.stderr)
        assert len(_error_lines(done.stderr)) == 1 and piece in done.stderr, (name, done.stderr)
        assert not any(noise in done.stderr for noise in TORCHRUN_NOISE), (name, done.stderr)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.slow  # torchrun: 2 real ranks
def test_a_rank_that_fails_is_reported_once_without_torchrun_s_report(tmp_path):
    """A data file only the ranks read: rank 0 says what is wrong, the launcher adds nothing."""
    (tmp_path / "data.npz").write_text("not an npz archive")
    done = _fedxrisk(
        "--dataset", "npz", "--data-dir", str(tmp_path), "--engine", "distributed", "--clients", "2",
        "--nproc-per-node", "2", "--rounds", "1", "--out", str(tmp_path / "run"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert len(_error_lines(done.stderr)) == 1, done.stderr
    assert "data.npz: not a readable .npz archive" in done.stderr
    assert not any(noise in done.stderr for noise in TORCHRUN_NOISE), done.stderr


@pytest.mark.slow  # torchrun: 2 real ranks
def test_a_launched_run_equals_the_loop_engine(tmp_path):
    """The ranks read the checked settings unresolved (the step size still follows the data)."""
    settings = ["--clients", "2", "--rounds", "2", "--local-steps", "2", "--stages", "1", "--eval-every", "1"]
    done = _fedxrisk(
        "--engine", "distributed", "--nproc-per-node", "2", *settings, "--out", str(tmp_path / "run"), "-q",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "run")  # rank 0 reports, once
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    cfg = RunConfig(clients=2, rounds=2, local_steps=2, stages=1, eval_every=1, engine="loop")
    loop = run_experiment(cfg, tmp_path / "loop").summary
    for key in ("test_auroc", "test_ap", "client_auroc_mean"):
        assert abs(summary["final"][key] - loop["final"][key]) < 1e-5, key
    assert summary["config"]["lr"] == loop["config"]["lr"]
    assert summary["engine"] == "distributed"


def test_a_rank_that_died_silently_is_named():
    assert _death(-9) == "was killed by SIGKILL"
    assert _death(3) == "exited with status 3"

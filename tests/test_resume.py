"""Resume: a run killed by SIGKILL partway and resumed ends with the uninterrupted run's numbers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.experiment import (
    CHECKPOINT,
    ConfigError,
    RunConfig,
    load_checkpoint,
    load_run,
    resume_experiment,
    run_experiment,
    save_checkpoint,
)

SRC = str(Path(__file__).resolve().parents[1] / "src")
# eval every round, checkpoint every 2: killed after round 5, the run restarts from round 4
# and history row 5 (written before the kill) must be dropped and recomputed.
CFG = dict(clients=3, rounds=6, local_steps=2, batch_size=16, eval_every=1, checkpoint_every=2, stages=2)
KILL_AFTER = 5

CHILD = """
import sys, time
from fedxrisk.experiment import RunConfig, run_experiment
def stop(row, done, total):
    if done == {kill}:
        print("READY", flush=True)
        time.sleep(600)
run_experiment(RunConfig(**{cfg}), sys.argv[1], stop)
"""


def _comparable(run) -> dict:
    s = run.summary
    rows = [{k: v for k, v in r.items() if k != "wall_seconds"} for r in run.history]
    return {
        "final": s["final"],
        "best": s["test_oracle"],
        "selected": s["selected"],
        "communication": s["communication"],
        "rows": rows,
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_experiment(RunConfig(**CFG), tmp_path_factory.mktemp("ref") / "run")


@pytest.mark.slow  # a real run killed and resumed
def test_killed_run_resumes_to_identical_metrics(reference, tmp_path):
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": SRC}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(kill=KILL_AFTER, cfg=CFG), str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout.readline().strip() == "READY"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    assert load_checkpoint(out / CHECKPOINT)["simulation"]["round"] == 4
    assert len(load_run(out).history) == KILL_AFTER  # the row after the checkpoint is on disk

    result = CliRunner().invoke(main, ["run", "--resume", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    resumed = load_run(out)
    assert _comparable(resumed) == _comparable(reference)  # bit for bit, history included
    assert [r["round"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]
    assert resumed.summary["resumed_at_rounds"] == [4]
    assert not (out / CHECKPOINT).exists()  # removed once the run completed
    walls = [r["wall_seconds"] for r in resumed.history]
    assert walls == sorted(walls)  # time continues from the checkpoint, it does not restart


def test_resume_without_checkpoint_starts_over_from_config_toml(reference, tmp_path):
    out = tmp_path / "early"
    out.mkdir()
    (out / "config.toml").write_text((reference.out_dir / "config.toml").read_text())
    (out / "history.csv").write_text("round,garbage\n1,half-written")
    assert _comparable(resume_experiment(out)) == _comparable(reference)


def test_finished_run_cannot_be_resumed_or_overwritten(reference):
    with pytest.raises(ConfigError, match="already finished"):
        resume_experiment(reference.out_dir)
    with pytest.raises(ConfigError, match="already holds a finished run"):
        run_experiment(RunConfig(**CFG), reference.out_dir)


def test_resume_refuses_other_settings(reference):
    result = CliRunner().invoke(main, ["run", "--resume", str(reference.out_dir), "--clients", "9"])
    assert result.exit_code == 2
    assert "--resume continues a run with its own config; drop --clients" in result.output


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / CHECKPOINT
    save_checkpoint(path, {"format": 1, "round": 1, "x": torch.arange(3)})

    def crash(obj, f):
        f.write(b"partial garbage")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, {"format": 1, "round": 2, "x": torch.arange(5)})
    monkeypatch.undo()
    ckpt = load_checkpoint(path)
    assert ckpt["round"] == 1 and ckpt["x"].tolist() == [0, 1, 2]


def test_tensorboard_events_continue_without_duplicates(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Crash(Exception):
        pass

    def crash(row, done, total):
        if done == 3:
            raise Crash

    out = tmp_path / "tb"
    cfg = RunConfig(clients=2, rounds=4, stages=1, local_steps=1, eval_every=1, checkpoint_every=2)
    with pytest.raises(Crash):
        run_experiment(cfg, out, crash)
    resume_experiment(out)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    history = load_run(out).history
    assert [(e.step, e.value) for e in events.Scalars("test_auroc")] == [
        (r["round"], pytest.approx(r["test_auroc"], abs=1e-6)) for r in history
    ]


def test_model_pt_is_the_final_global_model(reference):
    from fedxrisk.data import make_federated
    from fedxrisk.experiment import load_model
    from fedxrisk.metrics import auroc

    model = load_model(reference.out_dir)
    data = make_federated("digits", CFG["clients"], "class", 0.1, 0)
    with torch.no_grad():
        scores = model(data.data.x_test).reshape(-1).numpy()
    assert auroc(data.data.y_test.numpy(), scores) == reference.summary["final"]["test_auroc"]

"""The run layer's seams: config checks run once where a run starts, callbacks can stop a run and keep state."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fedxrisk.errors import ConfigError
from fedxrisk.run import checks
from fedxrisk.run.callbacks import Callback, LoopState
from fedxrisk.run.configfile import load_config
from fedxrisk.run.folder import CHECKPOINT, load_checkpoint
from fedxrisk.run.recipes import resume_experiment, run_experiment
from fedxrisk.run.spec import RunConfig

TINY = dict(
    clients=2, rounds=4, stages=1, lr=0.1, local_steps=2, eval_every=1, checkpoint_every=1, tensorboard=False
)


@pytest.fixture
def validations(monkeypatch) -> list[str]:
    """The algorithm of every config :func:`checks.check` is called on (the stage of a two-stage
    config is checked inside its main config's check, as ``pretrain.*``)."""
    seen: list[str] = []
    real = checks.check

    def spy(cfg: RunConfig, *args: Any):
        seen.append(cfg.algorithm)
        return real(cfg, *args)

    monkeypatch.setattr(checks, "check", spy)
    return seen


def test_a_two_stage_run_is_checked_once(tmp_path, validations):
    cfg = RunConfig(**{**TINY, "rounds": 2}, pretrain={"rounds": 1})
    result = run_experiment(cfg, tmp_path / "run")
    assert result.summary["status"] == "completed"
    assert validations == ["codasca"]  # both stages in one pass, where the run starts; before: 7 calls


def test_a_config_read_from_a_file_is_checked_when_read_and_when_the_run_starts(tmp_path, validations):
    cfg = load_config(
        None, ["experiment.rounds=2", "data.clients=2", "algorithm.stages=1", "pretrain.rounds=1"]
    )
    assert validations == ["codasca"]
    run_experiment(cfg, tmp_path / "run")
    assert validations == ["codasca", "codasca"]  # no cache on the config: checked again, once


def test_check_lists_every_error_and_caches_nothing():
    cfg = RunConfig(**TINY)
    assert checks.check(cfg) == [] and not set(vars(cfg)) - {f.name for f in dataclasses.fields(cfg)}
    cfg.rounds, cfg.imratio, cfg.seed = 0, 1.5, -1
    assert [str(e) for e in checks.check(cfg)] == [
        "experiment.seed must be ≥ 0, got -1",  # in the config file's order (run/spec.py)
        "experiment.rounds must be ≥ 1, got 0",
        "data.imratio must lie in (0, 1), got 1.5",
    ]
    with pytest.raises(ConfigError, match=r"seed must be ≥ 0, got -1 \(and 2 more: "):
        checks.checked(cfg)


class StopAfter(Callback):
    """Stops after ``n`` evaluations; counts them across a resume."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def on_evaluation(self, row: dict[str, Any], state: LoopState) -> None:
        self.seen += 1
        if self.seen >= self.n:
            state.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def test_a_callback_stops_the_run_which_then_finishes_normally(tmp_path):
    result = run_experiment(RunConfig(**TINY), tmp_path / "run", callbacks=[StopAfter(2)])
    assert result.summary["status"] == "completed" and result.summary["rounds"] == 2
    assert [r["round"] for r in result.history] == [1, 2]
    assert (tmp_path / "run" / "model.pt").exists() and not (tmp_path / "run" / CHECKPOINT).exists()


def test_callback_state_goes_into_the_checkpoint_and_comes_back_on_resume(tmp_path):
    out = tmp_path / "run"

    def interrupt(row, done, total):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(RunConfig(**TINY), out, interrupt, callbacks=[StopAfter(3)])
    assert load_checkpoint(out / CHECKPOINT)["callbacks"] == {"StopAfter": {"seen": 2}}
    again = StopAfter(3)
    result = resume_experiment(out, callbacks=[again])
    assert again.seen == 3 and result.summary["rounds"] == 3


def test_a_checkpoint_without_stateful_callbacks_keeps_its_old_keys(tmp_path):
    def interrupt(row, done, total):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(RunConfig(**TINY), tmp_path / "run", interrupt)
    keys = list(load_checkpoint(tmp_path / "run" / CHECKPOINT))
    assert keys == [
        "format",
        "config",
        "config_sha256",
        "simulation",
        "history",
        "best",
        "wall_seconds",
        "resumed_at",
        "torch_version",
    ]

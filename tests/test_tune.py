"""`fedxrisk tune`: search spaces, bad --space, resume after kill -9, two processes on one study,
and the best config reproducing its trial's validation value."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.errors import ConfigError
from fedxrisk.run.spec import RunConfig
from fedxrisk.run.tunespace import Param, apply_params, default_params, parse_space, space_for
from helpers import PROCESS_WAIT

optuna = pytest.importorskip("optuna")

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = ["--rounds", "2", "--eval-every", "1", "--clients", "4", "--set", "experiment.checkpoint_every=1"]
MONITOR: list[str] = []


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
    }


def _tune_cmd(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fedxrisk",
        "tune",
        *TINY,
        *MONITOR,
        "--no-prune",
        "-q",
        "--out",
        str(out),
        *extra,
    ]


def _records(out: Path, storage: str | None = None):
    from fedxrisk.run.tune import load_records

    return load_records(out, storage)


# ---- spaces -------------------------------------------------------------------------------------


def test_default_space_is_lr_around_the_algorithm_default_and_its_knobs():
    space = space_for("codasca")
    assert space["lr"] == Param("lr", 0.3, 30.0, True)
    assert set(space) == {"lr", "margin", "eta_g"}
    assert set(space_for("localsgdm")) == {"lr", "momentum"}


def test_space_override_replaces_and_adds():
    space = space_for("codasca", ("lr=0.5:5:log", "local_steps=2:16"))
    assert space["lr"] == Param("lr", 0.5, 5.0, True)
    assert space["local_steps"] == Param("local_steps", 2, 16, False, True)
    assert Param("lr", 0.1, 10.0, True).grid(3) == [0.1, 1.0, 10.0]


def test_params_become_config_fields_and_options():
    from fedxrisk.run.spec import RunConfig

    cfg = apply_params(RunConfig(), {"lr": 0.5, "margin": 0.7, "local_steps": 4})
    assert (cfg.lr, cfg.local_steps, cfg.options) == (0.5, 4, {"margin": 0.7})
    assert default_params(RunConfig(), space_for("codasca")) == {"lr": 3.0, "margin": 1.0, "eta_g": 1.0}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("lr=5:1", "--space lr=5:1: LOW 5 is above HIGH 1"),
        ("lr=0:1:log", "a log range needs LOW > 0"),
        ("nope=1:2", "'nope' is neither a run setting nor a hyperparameter of codasca"),
        ("lr=a:2", "LOW 'a' is not a number"),
        ("lr", "expects KEY=LOW:HIGH[:log]"),
        ("lr=1:2:lin", "expected KEY=LOW:HIGH[:log]"),
        ("form=1:2", "form is not a number"),
    ],
)
def test_bad_space_is_one_line_exit_2(tmp_path, spec, message):
    result = CliRunner().invoke(main, ["tune", "--space", spec, "--out", str(tmp_path / "t")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists()
    with pytest.raises(ConfigError, match="LOW"):
        parse_space("lr=5:1", "codasca")


def test_foreign_folder_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("x")
    result = CliRunner().invoke(main, ["tune", *TINY, "--out", str(tmp_path)])
    assert result.exit_code == 2 and "holds no fedxrisk tune" in result.output


# ---- studies -------------------------------------------------------------------------------------


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_best_config_reproduces_its_trial_value(tmp_path):
    from fedxrisk.run.configfile import load_config
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.tune import validation_value

    out = tmp_path / "t"
    result = CliRunner().invoke(main, ["tune", *TINY, *MONITOR, "--trials", "2", "-q", "--out", str(out)])
    assert result.exit_code == 0, result.output
    best = json.loads((out / "best.json").read_text())
    records = _records(out)
    assert [r.state for r in records] == ["complete", "complete"]
    assert records[0].params == {"lr": 3.0, "margin": 1.0, "eta_g": 1.0}  # the defaults come first
    assert best["value"] == max(r.value for r in records)
    rerun = run_experiment(load_config(out / "best_config.toml"), tmp_path / "again")
    assert validation_value(rerun.summary, rerun.history, best["monitor"]) == best["value"]
    assert (out / "trials.csv").read_text().count("\n") == 3
    assert (out / "history.png").stat().st_size > 0 and (out / "importances.png").stat().st_size > 0


@pytest.mark.slow  # real tune processes, killed or racing
def test_killed_tune_resumes_without_repeating_finished_trials(tmp_path):
    out = tmp_path / "t"
    proc = subprocess.Popen(_tune_cmd(out, "--trials", "4"), env=_env(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + PROCESS_WAIT
    while not (out / "trials" / "0001" / "summary.json").exists():  # trial 0 done, trial 1 finishing
        assert proc.poll() is None and time.monotonic() < deadline, "tune ended or hung before the kill"
        time.sleep(0.2)
    while not (out / "trials" / "0002").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {
        r.number: (out / r.folder / "summary.json").read_bytes()
        for r in _records(out)
        if r.state == "complete"
    }
    assert len(finished) >= 2
    subprocess.run(_tune_cmd(out, "--trials", "4"), env=_env(), check=True, stdout=subprocess.DEVNULL)
    records = _records(out)
    complete = [r for r in records if r.state == "complete"]
    assert len(complete) == 4
    for number, summary in finished.items():  # not run again: the same files
        assert (out / f"trials/{number:04d}/summary.json").read_bytes() == summary
    killed = [r for r in records if r.state == "failed"]
    assert all(r.note == "killed" for r in killed) and len(killed) <= 1
    assert len({r.folder for r in complete}) == 4


@pytest.mark.slow  # real tune processes, killed or racing
@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_two_processes_share_one_study(tmp_path, storage):
    out = tmp_path / "t"
    url = f"sqlite:///{tmp_path / 'study.db'}" if storage == "sqlite" else None
    extra = ["--trials", "4", *(["--storage", url] if url else [])]
    first = subprocess.Popen(_tune_cmd(out, *extra, "--seed", "1"), env=_env(), stdout=subprocess.DEVNULL)
    while not (out / "tune.json").exists():
        assert first.poll() is None
        time.sleep(0.1)
    second = subprocess.Popen(_tune_cmd(out, *extra, "--seed", "2"), env=_env(), stdout=subprocess.DEVNULL)
    assert first.wait(timeout=PROCESS_WAIT) == 0 and second.wait(timeout=PROCESS_WAIT) == 0
    records = _records(out, url)
    assert [r.state for r in records] == ["complete"] * 4
    assert {json.loads((out / r.folder / "summary.json").read_text())["rounds"] for r in records} == {2}
    folders = sorted(p.name for p in (out / "trials").iterdir())
    assert folders == ["0000", "0001", "0002", "0003"]  # each trial once, no fifth run


def test_only_run_tune_imports_optuna():
    importers = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if "import optuna" in p.read_text() or "from optuna" in p.read_text()
    )
    assert importers == ["fedxrisk/run/tune.py"]


def test_missing_optuna_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    result = CliRunner().invoke(main, ["tune", *TINY, "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "pip install 'fedxrisk[tune]'" in result.output
    assert not (tmp_path / "t").exists()


# ---- defaults that do not blow up -------------------------------------------------------------------


def test_coda_default_lr_keeps_lr_times_p_one_minus_p():
    from fedxrisk.algorithms import ALGORITHMS

    coda = ALGORITHMS["codasca"]
    assert coda.default_lr_for(0.10000000149011612) == 3.0  # the float32 ratio of the default run: unchanged
    assert coda.default_lr_for(0.02) == 3.0  # never raised
    assert coda.default_lr_for(0.101) == 3.0  # within 5 %: kept (a validation split moves p a little)
    assert coda.default_lr_for(0.55) == pytest.approx(0.27 / (0.55 * 0.45))
    assert ALGORITHMS["localsgdm"].default_lr_for(0.55) == ALGORITHMS["localsgdm"].default_lr


def test_a_balanced_run_writes_the_lowered_default_into_its_config(tmp_path):
    from fedxrisk.run.configfile import load_config
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.spec import RunConfig

    cfg = RunConfig(imratio=None, rounds=3, eval_every=3, clients=4, tensorboard=False)
    with pytest.warns(UserWarning, match="lr not set: codasca's default 3 lowered to"):
        result = run_experiment(cfg, tmp_path / "r")
    p = result.summary["data"]["train_pos_ratio"]
    assert 0.3 < p < 0.7
    assert result.summary["config"]["lr"] == pytest.approx(0.27 / (p * (1 - p)))
    assert load_config(tmp_path / "r" / "config.toml").lr == result.summary["config"]["lr"]


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_several_algorithms_get_the_same_number_of_trials(tmp_path):
    out = tmp_path / "t"
    args = ["tune", "-a", "codasca,LocalSGDM", *TINY, "--trials", "1", "-q", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    for name in ("codasca", "localsgdm"):  # the paper spelling resolves to the registry key
        assert [r.state for r in _records(out / name)] == ["complete"]
        assert (out / name / "best_config.toml").exists()


# ---- any setting, sectioned keys and choices (issue 42) ------------------------------------------


def test_sectioned_keys_and_choices_parse_and_apply():
    server_lr = parse_space("server.lr=0.003:0.3:log", "localsgdm")
    assert (server_lr.low, server_lr.high, server_lr.log, server_lr.choices) == (0.003, 0.3, True, None)
    optimizer = parse_space("server.optimizer=adam,yogi", "localsgdm")
    assert optimizer.choices == ("adam", "yogi") and optimizer.grid(4) == ["adam", "yogi"]
    ppb = parse_space("data.positives_per_batch=2:8", "localsgdm")
    assert ppb.integer and (ppb.low, ppb.high) == (2, 8)
    assert parse_space("model.personal=none,head", "localsgdm").choices == ("none", "head")
    assert parse_space("algorithm.lam=0.01:1:log", "ditto").log
    cfg = apply_params(
        RunConfig(algorithm="ditto", server={"optimizer": "adam"}),
        {"server.lr": 0.05, "data.positives_per_batch": 4, "model.personal": "head", "algorithm.lam": 0.2,
         "model.finetune_steps": 3, "local_steps": 2},
    )  # fmt: skip
    assert cfg.server == {"optimizer": "adam", "lr": 0.05}
    assert (cfg.positives_per_batch, cfg.personal, cfg.finetune_steps, cfg.local_steps) == (4, "head", 3, 2)
    assert cfg.options == {"lam": 0.2}
    space = {"server.optimizer": optimizer, "server.lr": server_lr}
    assert default_params(RunConfig(server={"optimizer": "adam", "lr": 1.0}), space) == {
        "server.optimizer": "adam", "server.lr": 0.3
    }  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("server.momentum=0:1", "'momentum' is not a key of [server]"),
        ("privacy.noise_multiplier=1:2", "tune is refused under [privacy]"),
        ("model.personal=0:1", "personal is not a number; search its choices as model.personal=A,B"),
        ("data.positives_per_batch=a,b", "data.positives_per_batch takes numbers"),
        ("server.optimizer=adam,adam", "a choice is listed twice"),
        ("nosuch.key=1:2", "unknown section 'nosuch'"),
    ],
)
def test_bad_sectioned_space_is_one_line(tmp_path, spec, message):
    result = CliRunner().invoke(
        main, ["tune", "-a", "localsgdm", "--space", spec, "--out", str(tmp_path / "t")]
    )
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "t").exists()


def test_a_refused_choice_is_named_before_any_trial(tmp_path):
    args = [
        "tune",
        "-a",
        "localsgdm",
        *TINY,
        "--space",
        "server.optimizer=adam,adamm",
        "--out",
        str(tmp_path / "t"),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "server.optimizer must be one of" in result.output, result.output
    assert "'adamm'" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists()


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_tune_searches_the_server_lr_and_shows_each_warning_once(tmp_path, recwarn):
    out = tmp_path / "t"
    skewed = ["--clients", "8", "--set", "data.partition=dirichlet", "--set", "data.dirichlet_alpha=0.05"]
    args = ["tune", "-a", "localsgdm", *TINY, *skewed, "--set", "server.optimizer=adam",
            "--space", "server.lr=0.003:0.3:log", "--trials", "3", "--no-prune", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    records = _records(out)
    assert [r.state for r in records] == ["complete"] * 3
    lrs = [r.params["server.lr"] for r in records]
    assert all(0.003 <= v <= 0.3 for v in lrs) and len(set(lrs)) == 3
    from fedxrisk.run.configfile import load_config

    for r in records:  # each trial ran with its own server lr
        assert load_config(out / r.folder / "config.toml").server == {
            "optimizer": "adam",
            "lr": r.params["server.lr"],
        }
    shown = [str(w.message) for w in recwarn]  # what reached the display (pytest records it)
    assert any("exceeds the data of" in w for w in shown), shown  # raised by every trial
    assert len(shown) == len(set(shown)), shown  # each shown once, not once per trial
    recwarn.clear()
    quiet = CliRunner().invoke(main, [*args[:-1], str(tmp_path / "q"), "-q"])
    assert quiet.exit_code == 0 and not [w for w in recwarn if "exceeds" in str(w.message)]


def test_a_best_trial_below_chance_is_flagged_not_crowned():
    from fedxrisk.run.tuneout import TrialRecord, best_warning

    inverted = TrialRecord(3, "complete", 0.31, {"lr": 1.0}, "trials/0003")
    assert "best trial's val_auroc is 0.310 < 0.5" in best_warning(inverted, "val_auroc")
    assert best_warning(TrialRecord(3, "complete", 0.71, {}, "t"), "val_auroc") is None  # the control
    assert (
        best_warning(TrialRecord(3, "complete", 0.2, {}, "t"), "val_ap") is None
    )  # AP has no 0.5 chance line

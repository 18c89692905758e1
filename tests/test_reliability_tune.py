"""`fedxrisk tune` as safe as `run` (issue 34): symlinks, bad flags, a damaged study, a full disk,
a dead process's trial and a diverging confirmation seed. Trials are a fake run (no training)
unless the test needs a real one, so the file runs in seconds."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.errors import ConfigError, NonFiniteLoss
from fedxrisk.run.configfile import config_to_toml
from fedxrisk.run.tunespace import parse_space

optuna = pytest.importorskip("optuna")

TINY = ["--rounds", "2", "--eval-every", "1", "--clients", "4", "--no-prune", "-q"]


def fake_run(values: dict[int, float] | None = None, fail: dict[int, BaseException] | None = None):
    """A stand-in for run_experiment: writes config.toml, returns a selected validation value."""
    calls: list[Path] = []

    def run(cfg, folder, callback=None, callbacks=()):
        folder = Path(folder)
        calls.append(folder)
        if fail and cfg.seed in fail and "confirm" in str(folder):
            raise fail[cfg.seed]
        folder.mkdir(parents=True)
        (folder / "config.toml").write_text(config_to_toml(cfg))
        value = (values or {}).get(len(calls), 0.5 + 0.01 * len(calls))
        summary = {"selected": {"monitor": cfg.resolved_monitor(), "value": value, "test_auroc": value},
                   "final": {"test_auroc": value}, "status": "completed"}  # fmt: skip
        (folder / "summary.json").write_text(json.dumps(summary))
        (folder / "model.pt").write_bytes(b"")
        return SimpleNamespace(summary=summary, history=[])

    run.calls = calls
    return run


@pytest.fixture
def fake(monkeypatch):
    run = fake_run()
    monkeypatch.setattr("fedxrisk.run.recipes.run_experiment", run)
    return run


def tune(*args: str):
    return CliRunner().invoke(main, ["tune", *TINY, *args])


def one_line(result, code: int = 2) -> str:
    assert result.exit_code == code, (result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture
def study(tmp_path, fake) -> Path:
    out = tmp_path / "t"
    assert tune("--trials", "2", "--out", str(out)).exit_code == 0
    assert (out / "history.png").exists() and (out / "importances.png").exists()
    return out


# ---- links and damaged files ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["study.journal", "history.png", "importances.png", "trials", "dangling"])
def test_tune_never_writes_through_a_symlink_in_its_folder(study, tmp_path, name):
    user = tmp_path / "user"
    user.mkdir()
    (user / "mine.txt").write_text("precious")
    if name == "dangling":
        name, target = "history.png", user / "new.png"
        (study / name).unlink()
    elif name == "trials":
        target = user
        shutil.rmtree(study / name)
    else:
        target = user / "mine.txt"
        (study / name).unlink()
    (study / name).symlink_to(target)
    line = one_line(tune("--trials", "3", "--out", str(study)))
    assert "symbolic link" in line and name in line
    assert sorted(p.name for p in user.iterdir()) == ["mine.txt"]
    assert (user / "mine.txt").read_text() == "precious"


def test_a_planted_trial_folder_link_is_refused(study, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (study / "trials" / "0002").symlink_to(tmp_path / "elsewhere")
    assert "symbolic link" in one_line(tune("--trials", "3", "--out", str(study)))
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe", b"[1, 2]"])
def test_a_damaged_tune_json_is_one_line(study, damage):
    (study / "tune.json").write_bytes(damage)
    assert "tune.json" in one_line(tune("--trials", "3", "--out", str(study)))


def test_a_damaged_journal_is_one_line_and_kept(study):
    (study / "study.journal").write_text('{"op_code": 0, "worker_id": "x", "study_name": \n garbage')
    before = (study / "study.journal").read_bytes()
    assert "study.journal" in one_line(tune("--trials", "3", "--out", str(study)))
    assert (study / "study.journal").read_bytes() == before


# ---- flags checked before anything is written ----------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid-points", "0", "--sampler", "grid"], "--grid-points must be ≥ 1"),
        (["--grid-points", "-3"], "--grid-points must be ≥ 1"),
        (["--timeout", "nan"], "--timeout must be"),
        (["--timeout", "inf"], "--timeout must be"),
        (["--confirm-seeds", "1,2,1"], "repeats seed 1"),
        (["--confirm-seeds", ","], "--confirm-seeds: expected a comma-separated list of at least one value"),
        (["--space", "lr=0:0"], "lr = 0 is refused: algorithm.lr must be > 0"),
        (["--space", "local_steps=0:0"], "local_steps = 0 is refused"),
        (["-a", "localsgdm", "--space", "momentum=0.5:1.5"], "momentum must lie in [0, 1)"),
        (["--storage", "foo"], "expected a database URL"),
        (["--storage", "redis://localhost/0"], "expected a database URL"),
        (["--storage", "sqlite://"], "expected a database URL"),
        (["--storage", "sqlite:////no/such/folder/x.db"], "cannot open the study storage"),
        (["--storage", "postgresql://u@127.0.0.1:1/db"], "cannot open the study storage"),
        (["--storage", "mysql://u@127.0.0.1:1/db"], "cannot open the study storage"),
    ],
)
def test_bad_tune_flags_are_one_line_and_write_nothing(tmp_path, fake, args, message):
    out = tmp_path / "new"
    line = one_line(tune(*args, "--out", str(out)))
    assert message in line
    assert not out.exists() and fake.calls == []


def test_momentum_range_is_checked_by_parse_space():
    with pytest.raises(ConfigError, match=r"momentum must lie in \[0, 1\)"):
        parse_space("momentum=0.5:1", "localsgdm")
    assert parse_space("momentum=0:0.99", "localsgdm").high == 0.99


# ---- failures during the search ------------------------------------------------------------------


def test_a_trial_failed_on_a_full_disk_is_labelled_so(tmp_path, monkeypatch):
    def full(cfg, folder, callback=None, callbacks=()):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder))

    monkeypatch.setattr("fedxrisk.run.recipes.run_experiment", full)
    out = tmp_path / "t"
    assert "No space left on device" in one_line(tune("--trials", "2", "--out", str(out)))
    from fedxrisk.run.tune import load_records

    [record] = load_records(out)
    assert (record.state, record.note) == ("failed", "disk: No space left on device")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_trial_of_a_killed_process_is_rerun_not_listed_as_running(tmp_path, monkeypatch):
    """Another process on the study is killed mid-trial while this one runs: its trial is failed
    ("killed"), its parameters rerun here, and nothing is left "running"."""
    from fedxrisk.run import tune as tune_module
    from fedxrisk.run.tune import load_records

    out = tmp_path / "t"
    inner = fake_run()

    def run(cfg, folder, callback=None, callbacks=()):
        if not inner.calls:  # the other process's trial, started then killed
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            storage = JournalStorage(JournalFileBackend(str(out / "study.journal")))
            name = json.loads((out / "tune.json").read_text())["study"]
            other = optuna.load_study(study_name=name, storage=storage)
            t = other.ask()
            t.set_user_attr("host", tune_module.HOST)
            t.set_user_attr("pid", _dead_pid())
        return inner(cfg, folder)

    monkeypatch.setattr("fedxrisk.run.recipes.run_experiment", run)
    assert tune("--trials", "2", "--out", str(out)).exit_code == 0
    states = sorted((r.state, r.note) for r in load_records(out))
    assert states == [("complete", ""), ("complete", ""), ("failed", "killed")]
    assert "running" not in (out / "trials.csv").read_text()


def test_a_diverging_confirmation_seed_keeps_the_others(tmp_path, monkeypatch):
    run = fake_run(fail={2: NonFiniteLoss(3)})
    monkeypatch.setattr("fedxrisk.run.recipes.run_experiment", run)
    out = tmp_path / "t"
    result = tune("--trials", "1", "--confirm-seeds", "1,2,3", "--out", str(out))
    assert result.exit_code == 0, result.output
    done = json.loads((out / "confirm.json").read_text())
    assert done["by_seed"].keys() == {"1", "3"} and done["n"] == 2
    assert done["failed"] == {"2": "non-finite loss at round 3"}
    assert "seed 2 not counted: non-finite loss at round 3" in result.output
    assert "Traceback" not in result.output


def test_best_config_names_the_data_by_an_absolute_path(tmp_path, fake, monkeypatch):
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 4)).astype(np.float32), np.arange(60) % 2
    np.savez(tmp_path / "d.npz", x_train=x[:40], y_train=y[:40], x_test=x[40:], y_test=y[40:])
    monkeypatch.chdir(tmp_path)
    args = ["--dataset", "npz", "--data-dir", "d.npz", "--model", "linear", "--partition", "iid"]
    assert tune(*args, "--trials", "1", "--out", "t").exit_code == 0
    best = (tmp_path / "t" / "best_config.toml").read_text()
    assert f'data_dir = "{tmp_path / "d.npz"}"' in best


def test_a_trial_on_a_really_full_disk_is_one_line_and_labelled_so(tmpfs, monkeypatch):
    """A 40 kB tmpfs (root only, else skipped): room for the study and a trial's first files only."""
    from fedxrisk.run.tune import load_records

    out = tmpfs("40k") / "t"
    line = one_line(CliRunner().invoke(main, ["tune", *TINY, "--clients", "2", "--model", "cnn", "--trials", "2",
                                              "--out", str(out)]))  # fmt: skip
    assert "No space left on device" in line
    [record] = load_records(out)
    assert record.state == "failed" and "No space left on device" in record.note and record.note != "killed"

"""Every writing command: no user file overwritten, no symlink followed, no input replaced, a full
disk in one line with nothing half-written, and a run's files bound to its config (issue 26)."""

from __future__ import annotations

import csv
import errno
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.experiment import CHECKPOINT, RunConfig, load_checkpoint, load_run, run_experiment
from helpers import TINY_RUN

SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = TINY_RUN  # conftest's finished_run
BASE = ["--set", "data.clients=2", "--set", "experiment.rounds=4", "--set", "algorithm.stages=1"]
BASE += ["--set", "algorithm.local_steps=2", "--set", "experiment.eval_every=1"]
BASE += ["--set", "data.batch_size=16", "--set", "experiment.checkpoint_every=2"]
CMP = [*BASE, "-a", "codasca,localsgdm", "--seeds", "0", "-q"]


def cli(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def error_line(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert len(lines) == 1, result.output
    return lines[0]


def tmp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*.tmp"))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- run identity ----------------------------------------------------------------------------------


def test_summary_and_checkpoint_record_the_run_identity(finished_run, tmp_path):
    from fedxrisk.run.folder import fingerprint

    summary = json.loads((finished_run / "summary.json").read_text())
    assert summary["config_sha256"] == fingerprint(RunConfig(**TINY).to_dict())
    assert summary["model_sha256"] == digest(finished_run / "model.pt")
    cfg = RunConfig(**{**TINY, "rounds": 3})
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "r", lambda row, done, total: _stop(done == 2))
    ckpt = load_checkpoint(tmp_path / "r" / CHECKPOINT)
    assert ckpt["config_sha256"] == fingerprint(cfg.to_dict())


def _stop(now: bool) -> None:
    if now:
        raise KeyboardInterrupt


def _unfinished(folder: Path, **changes) -> Path:
    cfg = RunConfig(**{**TINY, "rounds": 3, **changes})
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, folder, lambda row, done, total: _stop(done == 2))
    assert (folder / CHECKPOINT).exists()
    return folder


def test_resume_refuses_an_edited_config(tmp_path):
    out = _unfinished(tmp_path / "r")
    text = (out / "config.toml").read_text()
    (out / "config.toml").write_text(text.replace("rounds = 3", "rounds = 5"))
    before = {p.name: digest(p) for p in out.iterdir()}
    result = cli("run", "--resume", out, "-q")
    assert result.exit_code == 2
    assert error_line(result) == (
        f"Error: {out}/config.toml differs from the run in checkpoint.pt (rounds: 5 vs 3); --resume continues "
        f"the checkpoint's run only: start a new run from this config with `fedxrisk run --config "
        f"{out}/config.toml --out NEW_FOLDER`, or restore the original config.toml"
    )
    assert {p.name: digest(p) for p in out.iterdir()} == before


def test_resume_refuses_another_runs_checkpoint(tmp_path):
    mine = _unfinished(tmp_path / "mine", clients=2, algorithm="codasca")
    other = _unfinished(tmp_path / "other", clients=3, algorithm="localsgdm")
    shutil.copy(other / CHECKPOINT, mine / CHECKPOINT)
    result = cli("run", "--resume", mine, "-q")
    assert result.exit_code == 2
    assert "differs from the run in checkpoint.pt (algorithm: 'codasca' vs 'localsgdm', clients: 2 vs 3" in (
        error_line(result)
    )


def test_resume_after_a_step_size_change_continues_with_the_new_step(tmp_path):
    out = _unfinished(tmp_path / "r")
    from fedxrisk.run.configfile import load_config
    from fedxrisk.run.recipes import resume_overrides, write_config

    write_config(out, resume_overrides(load_config(out / "config.toml"), ["algorithm.lr=0.01"]))
    result = cli("run", "--resume", out, "-q")
    assert result.exit_code == 0, result.output
    assert load_run(out).summary["config"]["lr"] == 0.01


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_model_that_is_not_the_runs_is_refused(finished_run, run_copy, tmp_path, command):
    other = tmp_path / "other"
    run_experiment(RunConfig(**{**TINY, "seed": 5}), other)
    shutil.copy(other / "model.pt", run_copy / "model.pt")
    args = (
        [run_copy, finished_run.parent / "x.npz", "--out", tmp_path / "s.csv"]
        if command == "predict"
        else [run_copy]
    )
    result = cli(command, *args, "-q")
    assert result.exit_code == 2
    assert error_line(result) == (
        f"Error: {run_copy}/model.pt is not the model this run wrote (its sha256 differs from summary.json's "
        "model_sha256); put the run's own model.pt back, or use the run folder the model came from"
    )
    assert not (tmp_path / "s.csv").exists() and not (run_copy / "evaluation.json").exists()


# ---- foreign folders and inputs --------------------------------------------------------------------


def _users_folder(path: Path) -> dict[str, str]:
    path.mkdir()
    (path / "curves.csv").write_text("my,own\n1,2\n")
    (path / "auroc_vs_rounds.png").write_bytes(b"mine")
    return {p.name: digest(p) for p in path.iterdir()}


@pytest.mark.parametrize("command", ["compare", "plot", "evaluate"])
def test_a_users_folder_is_refused(finished_run, tmp_path, command):
    mine = tmp_path / "mine"
    before = _users_folder(mine)
    args = {
        "compare": ["compare", *CMP],
        "plot": ["plot", finished_run],
        "evaluate": ["evaluate", finished_run, "-q"],
    }[command]
    result = cli(*args, "--out", mine)
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"Error: --out {mine} is not empty and holds no fedxrisk ")
    assert line.endswith("(auroc_vs_rounds.png, curves.csv); choose a new or empty folder")
    assert {p.name: digest(p) for p in mine.iterdir()} == before


def test_plot_writes_into_a_folder_of_runs_and_over_its_own_plots(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path / "runs" / "a")
    for _ in range(2):  # the second time over its own files
        result = cli("plot", tmp_path / "runs")
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        "a",
        "auroc_vs_bytes.png",
        "auroc_vs_rounds.png",
        "curves.csv",
    ]


@pytest.mark.parametrize("target", ["input", "model.pt", "history.csv"])
def test_predict_never_overwrites_its_input_or_the_run(finished_run, run_copy, target):
    x = run_copy.parent / "x.npz"
    shutil.copy(finished_run.parent / "x.npz", x)
    path = x if target == "input" else run_copy / target
    before = digest(path)
    result = cli("predict", run_copy, x, "--out", path, "--overwrite", "-q")
    assert result.exit_code == 2
    what = "the input" if target == "input" else f"a file of the run {run_copy}"
    assert (
        error_line(result)
        == f"Error: --out {path} is {what}; fedxrisk never overwrites an input, choose another path"
    )
    assert digest(path) == before


# ---- symlinks: one test per writing command ---------------------------------------------------------


def _outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside.txt"
    target.write_text("precious\n")
    return target


def _refused_link(result, link: Path) -> None:
    assert result.exit_code == 2
    assert error_line(result) == (
        f"Error: {link} is a symbolic link; fedxrisk never writes through one: remove it or choose another output"
    )


def test_resume_never_writes_through_a_symlink(run_copy, tmp_path):
    target = _outside(tmp_path)
    for name in ("summary.json", "model.pt", "history.csv"):
        (run_copy / name).unlink()
    (run_copy / "history.csv").symlink_to(target)  # killed before its first checkpoint, then a link planted
    _refused_link(cli("run", "--resume", run_copy, "-q"), run_copy / "history.csv")
    assert target.read_text() == "precious\n"


def test_plot_never_writes_through_a_symlink(run_copy, tmp_path):
    target = _outside(tmp_path)
    (run_copy / "curves.csv").symlink_to(target)
    _refused_link(cli("plot", run_copy), run_copy / "curves.csv")
    assert target.read_text() == "precious\n" and not (run_copy / "auroc_vs_rounds.png").exists()


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_compare_never_writes_through_a_symlink(tmp_path):
    out = tmp_path / "cmp"
    assert cli("compare", *CMP, "--out", out).exit_code == 0
    target = _outside(tmp_path)
    (out / "curves.csv").unlink()
    (out / "curves.csv").symlink_to(target)
    _refused_link(cli("compare", *CMP, "--out", out), out / "curves.csv")
    assert target.read_text() == "precious\n" and tmp_files(out) == []


def test_evaluate_never_writes_through_a_dangling_symlink(run_copy, tmp_path):
    target = tmp_path / "elsewhere" / "roc.png"
    (run_copy / "roc.png").symlink_to(target)
    result = cli("evaluate", run_copy, "-q")
    assert result.exit_code == 2 and "already holds roc.png" in error_line(result)
    _refused_link(cli("evaluate", run_copy, "-q", "--overwrite"), run_copy / "roc.png")
    assert not target.exists() and not (run_copy / "evaluation.json").exists() and tmp_files(run_copy) == []


def test_predict_never_follows_a_stale_tmp_link_or_writes_through_out(finished_run, tmp_path):
    target = _outside(tmp_path)
    (tmp_path / "scores.csv.tmp").symlink_to(target)
    result = cli(
        "predict", finished_run, finished_run.parent / "x.npz", "--out", tmp_path / "scores.csv", "-q"
    )
    assert result.exit_code == 0, result.output
    assert target.read_text() == "precious\n" and len((tmp_path / "scores.csv").read_text().splitlines()) == 6
    assert tmp_files(tmp_path) == []
    (tmp_path / "link.csv").symlink_to(target)
    result = cli(
        "predict",
        finished_run,
        finished_run.parent / "x.npz",
        "--out",
        tmp_path / "link.csv",
        "--overwrite",
        "-q",
    )
    _refused_link(result, tmp_path / "link.csv")
    assert target.read_text() == "precious\n"


# ---- a full disk, a read-only folder ---------------------------------------------------------------


@pytest.fixture
def full_disk(tmpfs):
    """A 256 kB tmpfs filled up (root only, else skipped): a real ENOSPC."""
    mount = tmpfs("256k")
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return mount


def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(finished_run, full_disk):
    out = full_disk / "scores.csv"
    result = cli("predict", finished_run, finished_run.parent / "x.npz", "--out", out, "-q")
    assert result.exit_code == 2
    assert (
        error_line(result)
        == f"Error: cannot write {out}: No space left on device; nothing was written to scores.csv"
    )
    result = cli("evaluate", finished_run, "--out", full_disk / "ev", "-q", "--bootstrap", "0")
    assert result.exit_code == 2
    assert error_line(result).endswith(
        ": No space left on device; no evaluation file was written or replaced"
    )
    result = cli("plot", finished_run, "--out", full_disk / "plots")
    assert result.exit_code == 2 and "No space left on device" in error_line(result)
    left = sorted(p.name for p in full_disk.rglob("*") if p.is_file())
    assert left == ["filler"]  # no .tmp, no 0-byte PNG, no evaluation.md without its json


def _no_space(after: int):
    """os.fsync that fails with ENOSPC from its ``after``-th call on (a disk filling up mid-run)."""
    real, calls = os.fsync, [0]

    def fsync(fd):
        calls[0] += 1
        if calls[0] > after:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    return fsync


def test_a_disk_full_mid_run_stops_in_one_line_and_resumes_exactly(tmp_path, monkeypatch):
    reference = run_experiment(RunConfig(**{**TINY, "rounds": 4}), tmp_path / "ref")
    out = tmp_path / "run"
    monkeypatch.setattr("fedxrisk.outfiles.os.fsync", _no_space(after=3))  # config, history, 1st checkpoint
    args = ["run", "--rounds", 4, "--stages", 1, "--eval-every", 1, "--clients", 2, "--checkpoint-every", 1]
    result = cli(*args, "--out", out, "-q")
    assert result.exit_code == 2
    assert error_line(result) == (
        f"Error: cannot write {out}/checkpoint.pt: No space left on device; the run keeps its last checkpoint; "
        f"free space, then `fedxrisk run --resume {out}`"
    )
    assert tmp_files(out) == [] and load_checkpoint(out / CHECKPOINT)["simulation"]["round"] == 1
    monkeypatch.undo()
    assert cli("run", "--resume", out, "-q").exit_code == 0
    assert load_run(out).summary["final"] == reference.summary["final"]


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_read_only_folder_is_one_line(finished_run, tmp_path, monkeypatch, code):
    def refuse(*a, **k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("fedxrisk.outfiles.os.fsync", refuse)
    result = cli("evaluate", finished_run, "--out", tmp_path / "ev", "-q", "--bootstrap", "0")
    assert result.exit_code == 2
    assert error_line(result) == (
        f"Error: cannot write {tmp_path}/ev/evaluation.json: {os.strerror(code)}; no evaluation file was written or replaced"
    )
    assert sorted(os.listdir(tmp_path / "ev")) == []


# ---- compare: continue, refuse another comparison, kill -9 -------------------------------------------

CHILD = """
import sys, time
from fedxrisk.run import folder
from fedxrisk.cli import main
real = folder.RunFolder.save_checkpoint
def save(self, state):
    real(self, state)
    if "localsgdm" in str(self.path) and state["simulation"]["round"] == 2:
        print("READY", flush=True)
        time.sleep(600)
folder.RunFolder.save_checkpoint = save
main(sys.argv[1:])
"""


def _comparable(out: Path) -> dict:
    def rows(name, drop):
        with open(out / name, newline="") as f:
            return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(f)]

    return {
        "spec": json.loads((out / "compare.json").read_text()),
        "curves": rows("curves.csv", ("run_dir",)),
        "table": rows("comparison.csv", ("wall_seconds_mean",)),
    }


@pytest.mark.slow  # a real compare killed and continued
def test_a_killed_compare_continues_to_the_uninterrupted_result(tmp_path):
    whole = tmp_path / "whole"
    assert cli("compare", *CMP, "--out", whole).exit_code == 0
    out = tmp_path / "killed"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "compare", *CMP, "--out", str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    try:
        assert child.stdout.readline().strip() == "READY"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    run_dir = out / "localsgdm" / "seed0"
    assert (run_dir / CHECKPOINT).exists() and not (run_dir / "summary.json").exists()
    result = cli("compare", *CMP, "--out", out)
    assert result.exit_code == 0, result.output
    assert _comparable(out) == _comparable(whole)
    assert load_run(run_dir).summary["resumed_at_rounds"] == [2]


def test_compare_refuses_to_replace_another_comparison(tmp_path):
    out = tmp_path / "cmp"
    assert cli("compare", *BASE, "-a", "codasca", "--seeds", "0", "-q", "--out", out).exit_code == 0
    before = {str(p): digest(p) for p in out.rglob("*") if p.is_file()}
    result = cli("compare", *CMP, "--out", out)
    assert result.exit_code == 2
    assert error_line(result) == (
        f"Error: {out} holds another comparison (variants: codasca); rerun its own command to continue it, "
        "or choose another --out"
    )
    assert {str(p): digest(p) for p in out.rglob("*") if p.is_file()} == before


# ---- the table in docs/reliability.md -----------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "outputs_table", ROOT / "benchmarks" / "reliability" / "outputs_table.py"
)
table = importlib.util.module_from_spec(_spec)
sys.modules["outputs_table"] = table  # dataclasses look their module up
_spec.loader.exec_module(table)
COMMITTED = {r["id"]: r for r in json.loads((ROOT / "benchmarks/results/outputs.json").read_text())}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return table.prepare(tmp_path_factory.mktemp("table"))


def test_docs_show_the_rendering_of_the_committed_outputs_table():
    rendered = table.render(list(COMMITTED.values()))
    assert (ROOT / "benchmarks/results/outputs.md").read_text() == rendered
    doc = (ROOT / "docs/reliability.md").read_text()
    assert f"<!-- BEGIN GENERATED benchmarks/results/outputs.md -->\n{rendered}<!-- END GENERATED -->" in doc


@pytest.mark.parametrize("case", table.CASES, ids=lambda c: c.id)
def test_every_bad_output_is_one_line_and_keeps_every_file(case, base, tmp_path):
    row = table.run_case(case, base, tmp_path / "case")
    assert row["kept"] and row["one_line"] and COMMITTED[case.id]["kept"]  # no file changed, no .tmp left
    assert (row["exit"], row["message"]) == (COMMITTED[case.id]["exit"], COMMITTED[case.id]["message"])
    assert row["exit"] == (0 if case.id == "predict-stale-tmp" else 2)


def test_an_unwrapped_permission_error_is_still_one_line(finished_run, monkeypatch):
    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", "/data/model.pt")

    monkeypatch.setattr("fedxrisk.evaluation.load_trained", denied)
    result = cli("evaluate", finished_run, "-q", "--out", finished_run.parent / "ev")
    assert result.exit_code == 2
    assert error_line(result) == "Error: /data/model.pt: Permission denied"

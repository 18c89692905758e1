"""Frictions a new user met (issue 34): their own data keeps its positive ratio unless --imratio says
otherwise (and then it is said aloud), `run -a`, `tune --imratio`, `tune --set experiment.selection=best`
without data.validation, a Dirichlet split valid for every seed, quiet notices."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.cli.common import resolve
from fedxrisk.data.partition import dirichlet_partition, partition


def test_a_users_dataset_keeps_its_own_ratio_by_default():
    assert resolve(None, {"dataset": "npz"}, (), ())["data"]["imratio"] is None
    assert resolve(None, {}, (), ("data.dataset=tabular",))["data"]["imratio"] is None
    assert "imratio" not in resolve(None, {"dataset": "digits"}, (), ()).get("data", {})  # benchmark: 0.1
    assert resolve(None, {"dataset": "npz", "imratio": 0.2}, (), ())["data"]["imratio"] == 0.2


def test_resampling_a_users_dataset_is_printed(capsys):
    resolve(None, {"dataset": "npz", "imratio": 0.1}, (), ())
    assert "note: resampling npz's training data to imratio 0.1" in capsys.readouterr().err
    resolve(None, {"dataset": "digits", "imratio": 0.1}, (), ())
    assert capsys.readouterr().err == ""


def test_run_takes_dash_a_for_the_algorithm(tmp_path):
    result = CliRunner().invoke(main, ["run", "-a", "nope", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "unknown algorithm 'nope'" in result.output


def _tune_config(monkeypatch, tmp_path, *args):
    seen = {}

    def fake_tune(cfg, folder, space, settings, report, progress=None):
        seen["cfg"] = cfg
        return []

    monkeypatch.setattr("fedxrisk.run.tune.tune", fake_tune)
    result = CliRunner().invoke(main, ["tune", *args, "--out", str(tmp_path / "t"), "-q"])
    assert result.exit_code == 0, result.output
    return seen["cfg"]


def test_tune_takes_imratio_and_selection_best_without_validation(monkeypatch, tmp_path):
    pytest.importorskip("optuna")
    cfg = _tune_config(monkeypatch, tmp_path, "--imratio", "0.3", "--set", "experiment.selection=best")
    assert (cfg.imratio, cfg.selection, cfg.validation) == (0.3, "best", "auto")
    assert _tune_config(monkeypatch, tmp_path, "--imratio", "none").imratio is None


def test_a_dirichlet_split_leaving_a_client_empty_is_redrawn_deterministically():
    y = np.array([0] * 36 + [1] * 4)
    draw = lambda seed: partition("dirichlet", y, y, 8, np.random.default_rng(seed), 1.0)  # noqa: E731
    first = lambda seed: dirichlet_partition(y, 8, 1.0, np.random.default_rng(seed))  # noqa: E731
    assert any(len(p) == 0 for p in first(1))  # seed 1's first draw leaves a client empty
    for seed in range(20):
        parts = draw(seed)
        assert all(len(p) for p in parts) and sorted(np.concatenate(parts)) == list(range(40))
        assert all(np.array_equal(a, b) for a, b in zip(parts, draw(seed)))  # the same split every time
        if all(len(p) for p in first(seed)):  # a seed that worked keeps its split
            assert all(np.array_equal(a, b) for a, b in zip(parts, first(seed)))


API_THREADS = """
import sys, torch
from fedxrisk.experiment import RunConfig, run_experiment
run_experiment(RunConfig(rounds=1, stages=1, clients=2, tensorboard=False), sys.argv[1])
print(torch.get_num_threads())
"""


@pytest.mark.slow  # a real process per case
@pytest.mark.parametrize("omp, expected", [(None, "1"), ("2", "2")])
def test_the_python_api_uses_one_thread_for_a_small_model_unless_omp_says(tmp_path, omp, expected):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | (
        {"OMP_NUM_THREADS": omp} if omp else {}
    )
    out = subprocess.run([sys.executable, "-c", API_THREADS, str(tmp_path / "r")], env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out.split() == [expected]


@pytest.mark.slow  # a real fedxrisk process
def test_a_notice_is_one_clean_line_not_a_python_warning(tmp_path):
    import os
    import subprocess
    import sys

    args = ["run", "--rounds", "1", "--stages", "1", "--clients", "2", "--batch-size", "100000", "-q"]
    err = subprocess.run([sys.executable, "-m", "fedxrisk", *args, "--out", str(tmp_path / "r")],
                         env={**os.environ, "PYTHONWARNINGS": "always"}, capture_output=True, text=True,
                         check=True).stderr  # fmt: skip
    lines = [ln for ln in err.splitlines() if "batch_size = 100000" in ln]
    assert len(lines) == 1 and lines[0].startswith(
        "warning: data.batch_size = 100000 exceeds every client's data"
    )
    assert "UserWarning" not in err and "warnings.warn" not in err


def test_tune_quiet_silences_optuna_per_trial_warnings(monkeypatch, tmp_path):
    import logging

    optuna = pytest.importorskip("optuna")
    from fedxrisk.errors import NonFiniteLoss

    def diverge(cfg, folder, callback=None, callbacks=()):
        raise NonFiniteLoss(1)

    monkeypatch.setattr("fedxrisk.run.recipes.run_experiment", diverge)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("optuna").addHandler(handler)
    try:
        args = ["tune", "--rounds", "2", "--trials", "2", "--out", str(tmp_path / "t")]
        assert CliRunner().invoke(main, [*args, "-q"]).exit_code == 0
        assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
        assert CliRunner().invoke(main, [*args[:-1], str(tmp_path / "u")]).exit_code == 0
        assert any("failed" in r.getMessage() for r in records)  # without -q Optuna says it
    finally:
        logging.getLogger("optuna").removeHandler(handler)
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_the_readme_python_snippet_says_where_it_writes():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    snippet = readme.split("```python", 1)[1].split("```", 1)[0]
    assert "run_experiment(" in snippet and "./runs/" in snippet


def test_every_results_file_the_readme_names_exists():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    named = set(
        re.findall(r"benchmarks/results/[\w./-]+\.(?:json|md|csv|png)", (root / "README.md").read_text())
    )
    assert named and [n for n in sorted(named) if not (root / n).exists()] == []


def test_tune_shows_each_trials_rounds_and_validation_value_on_stderr_unless_quiet(tmp_path):
    """Issue 34: "tune shows no progress inside a trial". Piped: one stderr line per evaluation,
    its value the trial's own history.csv value; -q: none."""
    import csv
    import re

    pytest.importorskip("optuna")
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(120, 4)).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    np.savez(tmp_path / "d.npz", x_train=x[:80], y_train=y[:80], x_test=x[80:], y_test=y[80:])
    args = ["tune", "--dataset", "npz", "--data-dir", str(tmp_path / "d.npz"), "--model", "linear", "--partition",
            "iid", "--clients", "2", "--rounds", "4", "--eval-every", "2", "--imratio", "none", "--trials", "1",
            "--no-prune", "--set", "algorithm.stages=1"]  # fmt: skip
    shown = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "t")])
    assert shown.exit_code == 0, shown.output
    lines = [ln for ln in shown.stderr.splitlines() if "round" in ln]
    assert [re.sub(r"\d\.\d{4}$", "V", ln) for ln in lines] == [
        "trial 0: round 2/4, val_auroc V",
        "trial 0: round 4/4, val_auroc V",
    ]
    history = list(csv.DictReader(open(tmp_path / "t" / "trials" / "0000" / "history.csv")))
    assert [ln[-6:] for ln in lines] == [f"{float(r['val_auroc']):.4f}" for r in history if r["round"] != "0"]
    quiet = CliRunner().invoke(main, [*args, "-q", "--out", str(tmp_path / "q")])
    assert quiet.exit_code == 0 and "round" not in quiet.stderr
    assert quiet.stdout.strip() == str(tmp_path / "q")


def test_tune_progress_redraws_one_line_on_a_terminal():
    import io

    from fedxrisk.cli.tune import TrialProgress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    progress = TrialProgress(screen)
    progress(3, {}, 1, 2, "val_auroc")  # a round without an evaluation: the round only
    progress(3, {"val_auroc": 0.75}, 2, 2, "val_auroc")
    progress.end()
    assert screen.getvalue() == (
        "\r\x1b[Ktrial 3: round 1/2\r\x1b[Ktrial 3: round 2/2, val_auroc 0.7500\r\x1b[K"
    )


def test_compare_piped_prints_each_runs_progress_as_plain_lines(tmp_path):
    """Issue 34: "compare prints nothing when piped" (a live display cannot redraw a pipe: nothing
    showed until the end). Now a plain line every tenth of each run, its AUROC the history's."""
    import csv

    rng = np.random.default_rng(0)
    x = rng.uniform(size=(120, 4)).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    np.savez(tmp_path / "d.npz", x_train=x[:80], y_train=y[:80], x_test=x[80:], y_test=y[80:])
    sets = ["data.dataset=npz", f"data.data_dir={str(tmp_path / 'd.npz')!r}", "model.model=linear",
            "data.partition=iid", "data.clients=2", "experiment.rounds=4", "experiment.eval_every=2",
            "algorithm.stages=1", "data.imratio='none'"]  # fmt: skip
    args = ["compare", "-a", "codasca,localsgdm", *[x for s in sets for x in ("--set", s)]]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stderr.splitlines() if " round " in ln]
    expected = []
    for i, name in enumerate(("codasca", "localsgdm")):
        for r in csv.DictReader(open(tmp_path / "cmp" / name / "seed0" / "history.csv")):
            if r["round"] != "0":
                expected.append(
                    f"[{i + 1}/2] {name} seed 0 round {r['round']}/4, test AUROC {float(r['test_auroc']):.4f}"
                )
    assert lines == expected and "\x1b" not in result.stderr


def test_list_shows_the_coda_familys_lr_with_its_positive_ratio_bound():
    """Issue 34: `fedxrisk list` showed CODASCA's lr as 3, although a run lowers it for its positive ratio."""
    listed = CliRunner().invoke(main, ["list"], env={"COLUMNS": "300"}).output
    rows = {
        ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in listed.splitlines() if ln.count("│") > 3
    }
    assert rows["codasca"] == rows["codaplus"] == "3 (≤ 0.27/(p(1−p)))"
    assert rows["localsgdm"] == "0.3"


def test_evidence_render_only_reproduces_the_committed_tables(tmp_path, monkeypatch):
    """Issue 34: `evidence.py --render-only` rewrote the README and docs (the committed tables had
    drifted from the committed raw results). Rendered again, every table equals the committed one."""
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench.parent))  # the repository root: `benchmarks.*`
    from benchmarks.evidence import report as evidence_report
    from benchmarks.evidence import study as evidence

    results = evidence.load_results()
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    names = evidence_report.render(results)  # the tables only: the figures are plots.py's
    assert len(names) == 6
    for name in names:
        assert (tmp_path / name).read_text() == (bench / "results" / name).read_text(), name
    assert "benchmarks.evidence.study" in sys.modules


def test_bootstrap_counts_equal_the_draws_counted_one_by_one():
    """Issue 34: evaluate's bootstrap was slow on a large test set; its resample counts are now one
    bincount (np.add.at took a third of the time). Same draws, same counts as counting each draw."""
    from fedxrisk.stats.bootstrap import class_streams, stratified_counts

    y = np.random.default_rng(1).random(500) < 0.1
    counts = stratified_counts(y, 7, class_streams(3))
    rngs = class_streams(3)
    expected = np.zeros((7, 500), dtype=np.int32)
    for members, rng in zip((np.flatnonzero(y), np.flatnonzero(~y)), rngs):
        draws = members[rng.integers(0, len(members), size=(7, len(members)))]
        for r in range(7):
            for i in draws[r]:
                expected[r, i] += 1
    assert counts.dtype == np.int32 and np.array_equal(counts, expected)
    assert (counts[:, y].sum(1) == y.sum()).all() and (counts[:, ~y].sum(1) == (~y).sum()).all()

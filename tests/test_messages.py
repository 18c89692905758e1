"""What the command line says: no empty progress bar before an error or for runs read back, hints
that work when followed, a default number of stages that fits few rounds, a table() that names its extra."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.text import Text

from fedxrisk.cli import main
from fedxrisk.cli import progress as cli
from fedxrisk.experiment import RunResult

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TINY = [
    "--clients",
    "2",
    "--partition",
    "iid",
    "--local-steps",
    "2",
    "--batch-size",
    "16",
    "--eval-every",
    "1",
]


def _run(args):
    return CliRunner().invoke(main, args)


def test_no_progress_bar_is_drawn_before_a_settings_error(tmp_path):
    done = tmp_path / "done"
    assert _run(["run", *TINY, "--rounds", "1", "--out", str(done), "-q"]).exit_code == 0
    for args in (
        ["run", "--resume", str(tmp_path / "missing")],
        ["run", *TINY, "--rounds", "1", "--out", str(done)],  # holds a finished run
        ["run", "--dataset", "cifar10"],  # no data_dir
    ):
        result = _run(args)
        assert result.exit_code == 2, result.output
        assert result.output.startswith("Error: ") and "round" not in result.output.split("Error: ")[0], args


def test_a_continued_comparison_draws_no_bars_for_runs_read_back(tmp_path):
    args = [
        "compare",
        "-a",
        "localsgdm",
        "--seeds",
        "0",
        "--set",
        "experiment.rounds=1",
        "--out",
        str(tmp_path),
    ]
    args += ["--set", "data.clients=2", "--set", "algorithm.local_steps=2", "--set", "data.partition=iid"]
    first = _run(args)
    assert first.exit_code == 0 and "round 1/1" in first.output
    again = _run(args)
    assert again.exit_code == 0 and "round" not in again.output.split("comparison")[0]


def test_the_data_dir_hint_names_a_key_that_is_accepted(tmp_path):
    hint = _run(["run", "--dataset", "cifar10"]).output
    assert "--set data.data_dir=DIR" in hint
    followed = _run(["run", "--dataset", "cifar10", "--set", f"data.data_dir={tmp_path / 'nowhere'}"])
    assert followed.exit_code == 2 and "data_dir" in followed.output and "does not exist" in followed.output


def test_few_rounds_take_one_stage_each_unless_stages_are_set(tmp_path):
    result = _run(["run", *TINY, "--rounds", "2", "--out", str(tmp_path / "r2"), "-q"])
    assert result.exit_code == 0, result.output
    assert tomllib.loads((tmp_path / "r2" / "config.toml").read_text())["algorithm"]["stages"] == 2
    refused = _run(["run", *TINY, "--rounds", "2", "--stages", "3", "--out", str(tmp_path / "x")])
    assert refused.exit_code == 2
    assert (
        "algorithm.stages must lie in [1, rounds=2], got 3 (lower it: --stages N, or --set algorithm.stages=N)"
        in (refused.output)
    )


def test_progress_lines_leave_room_for_the_echoed_ctrl_c(monkeypatch):
    monkeypatch.setattr(cli, "console", Console(file=io.StringIO(), width=60, force_terminal=True))
    with cli.training_progress() as progress:
        bar = cli.Bar(progress, "training")
        bar({"test_auroc": 0.91234}, 3, 1000)
        assert progress.console.width == 58
    lines = cli.console.file.getvalue().replace("\r", "\n").splitlines()
    assert "round 3/1000" in cli.console.file.getvalue()
    assert max(len(Text.from_ansi(line).plain) for line in lines) <= 58


def test_table_names_the_extra_that_installs_pandas(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r'pip install "fedxrisk\[pandas\]"'):
        RunResult({}, [], Path(".")).table()
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert any(r.startswith("pandas") for r in pyproject["project"]["optional-dependencies"]["pandas"])

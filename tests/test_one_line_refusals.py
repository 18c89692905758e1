"""Issue 39: the last tracebacks and silent no-ops of the commands become one-line refusals (exit 2),
with nothing written: predict into /proc, extending a run whose summary.json is damaged, cross-site
with --split validation or with a run named twice."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.experiment import RunConfig, run_experiment


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "r"
    cfg = RunConfig(rounds=1, stages=1, eval_every=1, clients=2, engine="loop", tensorboard=False)
    run_experiment(cfg, out)
    return out


def _refused(args) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_predict_into_proc_is_one_line(run_dir, tmp_path):
    import numpy as np
    from sklearn.datasets import load_digits

    x = tmp_path / "x.npz"
    np.savez(x, x=(load_digits().data[:4] / 16).astype("float32").reshape(4, 1, 8, 8))
    line = _refused(["predict", str(run_dir), str(x), "--out", "/proc/x.csv"])
    assert line.startswith("Error: cannot write /proc/x.csv") and "nothing was written" in line


def test_extending_a_run_whose_summary_is_not_json_is_one_line(run_dir, tmp_path):
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(run_dir, copy)
    (copy / "summary.json").write_text("{not json")
    line = _refused(["run", "--resume", str(copy), "--rounds", "3", "-q"])
    assert "summary.json is unreadable (JSONDecodeError)" in line and "--rounds cannot extend" in line
    assert (copy / "summary.json").read_text() == "{not json"  # nothing replaced


def test_cross_site_refuses_a_validation_split_instead_of_reading_train(run_dir, tmp_path):
    line = _refused(["cross-site", str(run_dir), "--dataset", "digits", "--split", "validation",
                     "--out", str(tmp_path / "x")])  # fmt: skip
    assert line == "Error: --split must be 'test' or 'train', got 'validation'"
    assert not (tmp_path / "x").exists()


def test_cross_site_refuses_a_run_named_twice(run_dir, tmp_path):
    line = _refused(["cross-site", str(run_dir), f"{run_dir}/", "--out", str(tmp_path / "x")])
    assert "named again; name each run once" in line
    assert not (tmp_path / "x").exists()

"""Issue 25's small items that had no test of their own: the learning-rate defaults `run --help`
points at are in `fedxrisk list`; `predict` on an unscaled `.npz` names the training range and a
wrong shape names the expected one."""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from fedxrisk import catalog
from fedxrisk.cli import main
from fedxrisk.experiment import RunConfig, run_experiment


def _invoke(args: list[str]):
    return CliRunner(env={"COLUMNS": "250"}).invoke(main, [str(a) for a in args])


def test_run_help_points_at_list_and_list_shows_every_default_lr():
    help_text = " ".join(_invoke(["run", "--help"]).output.split())
    assert "default: the algorithm's, see `fedxrisk list`" in help_text
    listed = _invoke(["list"]).output
    assert "default lr" in listed
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in listed.splitlines()
        if line.count("│") > 3
    }
    for name, entry in catalog.load()["algorithms"].items():
        shown = rows[name].split(" ")[0]
        assert float(shown) == entry["default_lr"], (name, rows[name])


def test_predict_on_npz_refuses_unscaled_inputs_and_a_wrong_shape(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(120, 5)).astype(np.float32)  # trained on [0, 1]
    y = (x[:, 0] > 0.5).astype(np.int64)
    np.savez(tmp_path / "d.npz", x_train=x[:80], y_train=y[:80], x_test=x[80:], y_test=y[80:])
    cfg = RunConfig(dataset="npz", data_dir=str(tmp_path / "d.npz"), imratio=None, partition="iid", clients=2,
                    rounds=1, stages=1, eval_every=1, tensorboard=False, checkpoint_every=0, model="linear")  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    np.savez(tmp_path / "raw.npz", x=x * 255)  # pixel values never scaled to [0, 1]
    np.savez(tmp_path / "wide.npz", x=np.zeros((3, 7), np.float32))
    unscaled = _invoke(["predict", tmp_path / "run", tmp_path / "raw.npz", "--out", tmp_path / "s.csv", "-q"])
    assert unscaled.exit_code == 2
    assert (
        "the model was trained on inputs in [0" in unscaled.output and "nothing was scored" in unscaled.output
    )
    wide = _invoke(["predict", tmp_path / "run", tmp_path / "wide.npz", "--out", tmp_path / "s.csv", "-q"])
    assert wide.exit_code == 2 and "the model expects [5]" in wide.output
    assert not (tmp_path / "s.csv").exists()

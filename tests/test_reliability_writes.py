"""Issue 34's data-loss items outside tune: a kill -9 mid-write leaves no ``.tmp`` (predict's
scores.csv and every other atomic write), σ = 0 and a fixed sampling that draws no client are
refused up front, a tabular CSV with a repeated column name is refused at load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedxrisk.errors import ConfigError, DataFileError
from fedxrisk.outfiles import replace_atomic

SRC = os.environ.get("PYTHONPATH") or str(Path(__file__).resolve().parents[1] / "src")

KILLED_PREDICT = """
import sys, time
import numpy as np
import fedxrisk.prediction as p

def slow_cell(value, _count=[0]):
    _count[0] += 1
    if _count[0] == 500:
        print("writing", flush=True)
        time.sleep(60)
    return str(value)

p.csv_cell = slow_cell
pred = p.Predictions(("row",), [(i,) for i in range(1000)], np.zeros((1000, 1), np.float32), ["score"])
p.write_csv(pred, p.Path(sys.argv[1]))
"""


def _kill_while_writing(script: str, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], stdout=subprocess.PIPE, env=env)
    assert proc.stdout.readline().strip() == b"writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow  # a real process killed mid-write
def test_a_predict_killed_while_writing_leaves_no_tmp_and_the_old_scores(tmp_path):
    out = tmp_path / "scores.csv"
    out.write_text("row,prob\n0,0.5\n")
    _kill_while_writing(KILLED_PREDICT, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.csv"]
    assert out.read_text() == "row,prob\n0,0.5\n"


def test_an_atomic_write_still_replaces_a_stale_tmp_link_without_following_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / "out.txt.tmp").symlink_to(victim)
    replace_atomic(tmp_path / "out.txt", lambda f: f.write("new"))
    assert (tmp_path / "out.txt").read_text() == "new" and victim.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "victim.txt"]


# ---- refused up front ----------------------------------------------------------------------------


def _privacy(**table):
    from fedxrisk.run.checks import checked
    from fedxrisk.run.spec import RunConfig

    return checked(RunConfig(clients=4, privacy={"clip": 1.0, **table}))


def test_noise_multiplier_zero_is_refused_before_training():
    with pytest.raises(ConfigError, match=r"noise_multiplier must be a finite number > 0 \(σ = 0"):
        _privacy(noise_multiplier=0.0)
    _privacy(noise_multiplier=0.5)  # any positive σ is fine


def test_fixed_sampling_that_draws_no_client_is_refused_not_raised_to_one():
    with pytest.raises(ConfigError, match=r"draws round\(q·K\) = 0 of K = 4 clients"):
        _privacy(noise_multiplier=1.0, sampling_rate=0.01, sampling="fixed")
    _privacy(noise_multiplier=1.0, sampling_rate=0.25, sampling="fixed")  # one client of four
    _privacy(noise_multiplier=1.0, sampling_rate=0.01)  # Poisson: q is q, whatever K


def test_a_repeated_column_name_is_refused_at_load(tmp_path):
    from fedxrisk.data.readers.arrays import read_tabular_csv

    rows = ["a,b,a,label", *(f"{i},{i % 3},{i % 5},{i % 2}" for i in range(20))]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataFileError, match="column 'a' appears 2 times in the header"):
        read_tabular_csv(tmp_path)


def test_csv_predict_for_an_npz_model_never_takes_an_id_column_as_a_feature(tmp_path):
    import csv

    from fedxrisk.experiment import RunConfig, run_experiment
    from fedxrisk.prediction import predict

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(120, 5)).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64)
    np.savez(tmp_path / "d.npz", x_train=x[:80], y_train=y[:80], x_test=x[80:], y_test=y[80:])
    cfg = RunConfig(dataset="npz", data_dir=str(tmp_path / "d.npz"), imratio=None, partition="iid", clients=2,
                    rounds=1, stages=1, eval_every=1, tensorboard=False, checkpoint_every=0, model="linear")  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    np.savez(tmp_path / "new.npz", x=x[80:])
    with open(tmp_path / "new.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["patient_id", *(f"f{i}" for i in range(5)), "PatientID"])
        w.writerows([[1000 + i, *row, 7] for i, row in enumerate(x[80:].tolist())])
    from_csv = predict(tmp_path / "run", tmp_path / "new.csv")
    assert from_csv.id_columns == ("patient_id",) and from_csv.ids[0] == ("1000",)
    np.testing.assert_array_equal(from_csv.logits, predict(tmp_path / "run", tmp_path / "new.npz").logits)

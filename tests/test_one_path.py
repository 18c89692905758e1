"""One run path (issue 31): one config through ``fedxrisk run`` on loop, vmap and distributed, and
through the Flower trial in one process, gives the same model, the same history columns and the
same ε. Nothing is set that a default would set: no ``lr`` (CODASCA's step size follows the data,
whose positive ratio 0.3 is far from 0.1), the default stages (capped at the 2 rounds: a stage restart
after round 1); client-level DP in the reproducible
test mode (``privacy.reproducible_noise``) so the engines can be compared; validation data and
``selection = "best"``: under DP the validation is a released statistic (the summed histograms through
the Gaussian mechanism, accounted in ε; docs/privacy.md), drawn from the same noise on every engine,
so every engine selects the same model. Two sites are far too few for the default validation noise
(the run would be refused as noise), so the test lowers ``privacy.validation_noise_multiplier``.
The Flower trial runs with SecAgg+ (in one process, Flower's own workflow and mod): under DP its
validation histograms may reach the server only as a secure sum.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.flower.config import Deployment, FlowerConfig, to_flat
from fedxrisk.flower.coordinator import Coordinator
from fedxrisk.run.configfile import load_config
from helpers import max_abs_diff

pytest.importorskip("dp_accounting")

pytestmark = pytest.mark.slow  # fedxrisk run in real processes on every engine, torchrun ranks included

SRC = Path(__file__).resolve().parents[1] / "src"
CONFIG = """\
[experiment]
rounds = 2
eval_every = 1
selection = "best"

[data]
clients = 2
imratio = 0.3
partition = "iid"
batch_size = 8
validation = 0.25

[algorithm]
local_steps = 2

[privacy]
clip = 0.5
noise_multiplier = 0.8
reproducible_noise = 7
validation_noise_multiplier = 0.02
"""
ENGINES = ("loop", "vmap", "distributed")


def _fedxrisk_run(config: Path, engine: str, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(var, None)
    ranks = ["--nproc-per-node", "2"] if engine == "distributed" else []
    cmd = [sys.executable, "-m", "fedxrisk", "run", "--config", str(config), "--engine", engine, *ranks]
    done = subprocess.run([*cmd, "--out", str(out), "-q"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def _flower_trial(config: Path, out: Path) -> None:
    """The Flower trial: the same config as Flower's flat run config, two trial sites in-process with
    the real ClientApp and Flower's SecAgg+ (under DP, selection = best needs the validation
    histograms summed securely; docs/flower.md)."""
    pytest.importorskip("flwr")
    from fedxrisk.flower.app import GridTransport, client_app
    from flower_grid import InProcessGrid

    deploy = Deployment(test_data="digits", out_dir=str(out), secure_aggregation=True)
    flat = to_flat(load_config(config), deploy)
    nodes = {1000 + k: {"dataset": "digits", "partition-id": k, "num-partitions": 2} for k in range(2)}
    cfg = FlowerConfig.from_run_config(flat)
    grid = InProcessGrid(client_app, flat, nodes)
    Coordinator(cfg, GridTransport(grid, cfg), poll_interval=0.01).run()


def _header(out: Path) -> list[str]:
    with open(out / "history.csv", newline="") as f:
        return next(csv.reader(f))


def _column(out: Path, key: str) -> list[float]:
    with open(out / "history.csv", newline="") as f:
        return [float(row[key]) for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("one_path")
    config = root / "run.toml"
    config.write_text(CONFIG)
    outs = {}
    for engine in ENGINES:
        outs[engine] = root / engine
        _fedxrisk_run(config, engine, outs[engine])
    outs["flower"] = root / "flower"
    _flower_trial(config, outs["flower"])
    return outs


def test_the_step_size_follows_the_data_everywhere(runs):
    """CODASCA's default lr is lowered for p = 0.3 (with_data_lr): the case Flower once missed."""
    summary = json.loads((runs["loop"] / "summary.json").read_text())
    assert summary["config"]["lr"] < ALGORITHMS["codasca"].default_lr
    assert summary["data"]["train_pos_ratio"] == pytest.approx(0.3, abs=0.01)


@pytest.mark.parametrize("other", ["vmap", "distributed", "flower"])
def test_one_config_gives_one_model_history_and_epsilon(runs, other):
    ref, out = runs["loop"], runs[other]
    for name in ("model.pt", "last.pt"):  # the selected model and the last
        a, b = torch.load(ref / name), torch.load(out / name)
        assert max_abs_diff(a["params"], b["params"]) < 1e-5, name
    assert _header(out) == _header(ref)
    assert _header(ref)[-3:] == ["epsilon", "epsilon_replace_one", "privacy"]  # test mode: NOT PRIVATE
    with open(out / "history.csv", newline="") as f:
        assert all(row["privacy"].startswith("NOT PRIVATE") for row in csv.DictReader(f))
    for key in ("epsilon", "epsilon_replace_one"):
        assert _column(out, key) == pytest.approx(_column(ref, key), rel=1e-9), key
    keys = ("test_auroc", "test_pauc30_norm", "bytes_up_per_client") + (
        () if other == "flower" else ("train_loss",)
    )
    for key in keys:  # Flower under DP releases no site's loss (the column is empty)
        assert _column(out, key) == pytest.approx(_column(ref, key), abs=1e-5), key
    for key in ("val_auroc", "val_ap", "val_auroc_bound"):  # the same release on every engine
        assert _column(out, key) == pytest.approx(_column(ref, key), abs=1e-12), key
    s_ref = json.loads((ref / "summary.json").read_text())
    s_out = json.loads((out / "summary.json").read_text())
    assert s_out["privacy"]["epsilon"] == pytest.approx(s_ref["privacy"]["epsilon"], rel=1e-12)
    assert s_out["selected"]["round"] == s_ref["selected"]["round"]
    assert s_ref["selected"]["selection"] == "best"
    assert s_out["privacy"]["validation"] == s_ref["privacy"]["validation"]
    assert s_out["communication"] == s_ref["communication"]
    assert s_out["config"]["lr"] == pytest.approx(s_ref["config"]["lr"], rel=1e-6)  # the lr it trained with
    # one summary writer (run/loop.train): the same keys; Flower adds its sites and deployment
    assert set(s_out) - set(s_ref) == ({"sites", "deployment"} if other == "flower" else set())
    assert set(s_ref) - set(s_out) == set()
    for block in ("final", "config", "selected", "data"):
        assert set(s_out[block]) == set(s_ref[block]), block
    # the same privacy block, value for value; Flower adds who clips and who adds the noise
    deployment = {"noise_added_by", "clipped_by"} if other == "flower" else set()
    assert set(s_out["privacy"]) - set(s_ref["privacy"]) == deployment
    for key, value in s_ref["privacy"].items():
        if key.startswith("epsilon"):
            assert s_out["privacy"][key] == pytest.approx(value, rel=1e-12), key
        else:
            assert s_out["privacy"][key] == value, key
    assert s_out["hyperparameters"] == s_ref["hyperparameters"]
    for key in ("train_samples", "test_samples", "client_counts"):
        assert s_out["data"][key] == s_ref["data"][key], key

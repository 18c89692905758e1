"""Issue 31 item 2: the Flower server is ``fedxrisk run``'s loop (run/loop.train) over the sites.

A Flower trial (the protocol in one process) with validation, ``selection = "best"`` and early
stopping writes the files ``fedxrisk run`` writes for the same run: the ``config.toml`` it leaves
in ``out-dir``, run by ``fedxrisk run`` on the loop engine, gives the same history rows (``val_*``
within the histograms' printed bound), the same summary keys, the same selected and stopping
round, the same ``model.pt`` and ``last.pt``. A site lost mid-run is recorded by the same code.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math

import pytest
import torch

from fedxrisk.engines.validation import BOUND_KEYS, VAL_KEYS
from fedxrisk.flower.transport import FederationError
from fedxrisk.run.configfile import load_config
from fedxrisk.run.recipes import run_experiment
from helpers import max_abs_diff
from test_flower_protocol import LeavingTransport, run_config, run_local, trial_nodes

SELECT = {"validation": 0.25, "stages": 1, "eval-every": 1, "selection": "best", "early-stopping": 2}


def _rows(out) -> list[dict[str, float]]:
    with open(out / "history.csv", newline="") as f:
        return [{k: float(v) if v else math.nan for k, v in row.items()} for row in csv.DictReader(f)]


def _header(out) -> list[str]:
    with open(out / "history.csv", newline="") as f:
        return next(csv.reader(f))


def test_a_flower_trial_writes_what_fedxrisk_run_writes_for_its_config_toml(tmp_path):
    rc = run_config("codasca", tmp_path / "flower", rounds=12, lr=2.0, **SELECT)
    flower, _ = run_local(rc, trial_nodes())
    cfg = load_config(tmp_path / "flower" / "config.toml", ["engine.engine=loop"])
    assert (cfg.clients, cfg.lr, cfg.checkpoint_every) == (2, 2.0, 0)  # the sites, the lr it ran with
    ref = run_experiment(cfg, tmp_path / "run").summary
    out, run = tmp_path / "flower", tmp_path / "run"
    assert flower["early_stopping"] == ref["early_stopping"] and flower["rounds"] == ref["rounds"] < 12
    assert flower["selected"]["round"] == ref["selected"]["round"] != flower["rounds"]
    for name in ("model.pt", "last.pt"):
        a, b = torch.load(out / name), torch.load(run / name)
        assert max_abs_diff(a["params"], b["params"]) < 1e-6, name
        assert set(a) == set(b), name  # one model.pt format
    assert _header(out) == _header(run)
    rows, ref_rows = _rows(out), _rows(run)
    assert [r["round"] for r in rows] == [r["round"] for r in ref_rows]
    exact = ("step", "stage", "lr", "bytes_up_per_client", "bytes_down_per_client")
    close = (
        "train_loss",
        "test_auroc",
        "test_ap",
        "test_pauc30_norm",
        "client_auroc_mean",
        "client_auroc_std",
    )
    for row, ref_row in zip(rows, ref_rows):
        assert {k: row[k] for k in exact} == {k: ref_row[k] for k in exact}
        for key in close:
            assert row[key] == pytest.approx(ref_row[key], abs=1e-6), (key, row["round"])
        for key, bound in zip(VAL_KEYS, BOUND_KEYS):  # summed histograms vs exact scores
            assert abs(row[key] - ref_row[key]) <= row[bound] + 1e-12, (key, row["round"])
    assert set(flower) - set(ref) == {"sites", "deployment"} and set(ref) <= set(flower)
    for block in ("final", "selected", "data", "communication"):
        assert set(flower[block]) == set(ref[block]), block
    assert flower["communication"] == ref["communication"]
    assert flower["hyperparameters"] == ref["hyperparameters"]
    assert flower["engine"] == "flower" and flower["num_clients"] == 2
    assert flower["deployment"]["test_data"] == "digits"
    written = json.loads((out / "summary.json").read_text())
    assert written["model_sha256"] == hashlib.sha256((out / "model.pt").read_bytes()).hexdigest()


def test_a_lost_site_is_recorded_by_the_loop_with_the_last_evaluated_model(tmp_path):
    """The node-loss policy through train(): status failed naming the site and round, the rounds
    finished, history.csv up to the last evaluation, model.pt of that evaluation (its sha256)."""
    rc = run_config("localsgdm", tmp_path, rounds=4, stages=1, **{"round-timeout": 0.3, "eval-every": 1})
    with pytest.raises(FederationError, match=r"round 2/4: site 1 .* left the federation"):
        run_local(rc, trial_nodes(), LeavingTransport)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("round 2/4: site 1 (node 1001")
    assert summary["rounds"] == 1 and summary["final"]["round"] == 1 and len(summary["sites"]) == 2
    assert [r["round"] for r in _rows(tmp_path)] == [1.0]
    assert hashlib.sha256((tmp_path / "model.pt").read_bytes()).hexdigest() == summary["model_sha256"]


def test_a_failed_set_up_is_recorded_without_a_model(tmp_path):
    nodes = {**trial_nodes(1), 7: {"data-dir": str(tmp_path / "nowhere"), "partition-id": 1}}
    with pytest.raises(FederationError, match="node 7 failed"):
        run_local(run_config("codasca", tmp_path / "out"), nodes)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["status"], summary["rounds"], summary["engine"]) == ("failed", 0, "flower")
    assert "nowhere" in summary["error"] and not (tmp_path / "out" / "model.pt").exists()


def test_an_error_train_does_not_record_is_still_recorded_in_summary_json(tmp_path, monkeypatch):
    """A refusal met mid-run (any error but a RunFailure, which train() records itself) still leaves
    a failed summary.json with the rounds the sites finished; history.csv keeps the evaluated rows."""
    from fedxrisk.flower.federation import Federation

    reduce, calls = Federation._reduce, []

    def failing(self, replies, round_):
        calls.append(round_)
        if round_ >= 2:
            raise RuntimeError("a refusal met in round 3")
        return reduce(self, replies, round_)

    monkeypatch.setattr(Federation, "_reduce", failing)
    rc = run_config("localsgdm", tmp_path, rounds=4, stages=1, **{"eval-every": 1})
    with pytest.raises(RuntimeError, match="a refusal met in round 3"):
        run_local(rc, trial_nodes())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["rounds"]) == ("failed", 2)
    assert summary["error"] == "a refusal met in round 3" and len(summary["sites"]) == 2
    assert [r["round"] for r in _rows(tmp_path)] == [1.0, 2.0]

"""Federated validation on Flower (issue 22 item 1): each site sends per-class histograms of its
validation scores, the server sums them; the same val_* numbers as the distributed engine's
histogram path, validation disjoint from training and test, selection and early stopping."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import make_federated
from fedxrisk.data.validation import carve_validation
from fedxrisk.engines import Simulation
from fedxrisk.engines.validation import (
    BOUND_KEYS,
    VAL_KEYS,
    exact_validation,
    federated_validation,
    score_histograms,
    validation_histogram,
)
from fedxrisk.errors import ConfigError
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.coordinator import FederationError
from fedxrisk.flower.sitedata import export_trial, load_holdout, load_site
from fedxrisk.metrics import auroc, predict
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from test_flower_protocol import K, RecordingTransport, run_config, run_local, trial_nodes

VAL = {"validation": 0.25, "stages": 1, "eval-every": 1}


def _history(out) -> list[dict[str, float]]:
    """history.csv's numbers (the test mode's text column ``privacy``, "NOT PRIVATE …", left out)."""
    with open(out / "history.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: float(v) if v else math.nan for k, v in row.items() if k != "privacy"} for row in rows]


def _reference(rc: dict) -> tuple[Simulation, Problem]:
    """The loop engine on the trial split with data.validation carved the same way."""
    data = carve_validation(
        make_federated("digits", K, "iid", rc["imratio"], rc["seed"]), rc["validation"], 0
    )
    problem = Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio)
    alg = ALGORITHMS[rc["algorithm"]](problem)
    schedule = Schedule.build(rc["rounds"], rc["local-steps"], rc["lr"], rc["stages"])
    return Simulation(alg, data, schedule, rc["batch-size"], rc["seed"], "loop"), problem


def _distributed(sim: Simulation, problem: Problem) -> dict[str, float]:
    """The distributed engine's validation: rank 0 holds client 0, its all_reduce adds rank 1's counts."""

    class Group:
        device = torch.device("cpu")

        def all_reduce(self, buf, name):
            buf += torch.from_numpy(validation_histogram(problem, *sim.global_model(), sim.data, [1]))

    rank0 = SimpleNamespace(global_model=sim.global_model, group=Group(), clients=[0])
    return federated_validation(rank0, problem, sim.data)


@pytest.mark.parametrize("algorithm", ["codasca", "localsgdm"])
def test_flower_validation_equals_the_distributed_engines_histograms(algorithm, tmp_path):
    rc = run_config(algorithm, tmp_path, rounds=3, **VAL)
    _, transport = run_local(rc, trial_nodes(), RecordingTransport)
    rows = _history(tmp_path)
    sim, problem = _reference(rc)
    for row in rows:
        sim.run_round()
        dist = _distributed(sim, problem)
        exact = exact_validation(problem, *sim.global_model(), sim.data)
        for key, bound in zip(VAL_KEYS, BOUND_KEYS):
            assert row[key] == dist[key] and row[bound] == dist[bound], (key, row["round"])
            assert abs(row[key] - exact[key]) <= row[bound] + 1e-12  # the exact value within the bound
            assert row[bound] > 0
    sent = [r.arrays["validation"] for _, r in transport.log if r is not None and "validation" in r.arrays]
    assert len(sent) == K * len(rows)
    for group in sent:  # integer counts per class and bin, no score
        assert set(group) == {"counts"} and group["counts"].dtype == torch.int64
        assert group["counts"].shape == (1, 2, 4097)


def test_validation_is_disjoint_from_training_and_test_on_flower(tmp_path):
    cfg = FlowerConfig.from_run_config(run_config("codasca", tmp_path, **VAL))
    sim, _ = _reference(run_config("codasca", tmp_path, **VAL))
    x_test = load_holdout("digits", cfg)[0]  # type: ignore[index]
    test = {tuple(r.tolist()) for r in x_test.flatten(1)}
    held, trained = 0, 0
    for node in trial_nodes().values():
        site = load_site(node, cfg)
        k = node["partition-id"]
        assert site.x_val is not None and site.y_val is not None
        rows = torch.from_numpy(sim.data.val_shards[k])  # type: ignore[index]
        assert torch.equal(site.x_val, sim.data.data.x_val[rows])  # type: ignore[index]
        assert torch.equal(site.x, sim.data.client_view(k)[0])  # what the loop engine's client k trains on
        val = {tuple(r.tolist()) for r in site.x_val.flatten(1)}
        train = {tuple(r.tolist()) for r in site.x.flatten(1)}
        assert not val & train
        assert len(val & test) <= 2  # digits holds a few identical images; index-disjoint by construction
        for c in (0, 1):  # round(0.25 n) of each class of the part held out
            n_c = int((site.y == c).sum() + (site.y_val == c).sum())
            assert int((site.y_val == c).sum()) == round(0.25 * n_c)
        held, trained = held + len(site.y_val), trained + len(site.y)
    assert held == len(sim.data.data.y_val) and trained == len(sim.data.data.y_train)  # type: ignore[arg-type]


def _test_auroc(path, x, y, problem_like: Problem) -> float:
    model = torch.load(path)
    return auroc(y.numpy(), predict(problem_like, model["params"], model["buffers"], x))


def test_selection_best_and_early_stopping_on_flower(tmp_path):
    rc = run_config("codasca", tmp_path, rounds=12, lr=2.0, selection="best", **{"early-stopping": 2}, **VAL)
    summary, _ = run_local(rc, trial_nodes())
    rows = _history(tmp_path)
    vals = [r["val_auroc"] for r in rows]
    best, wait, stop = math.nan, 0, None  # the rule of run/callbacks.EarlyStopping
    for r in rows:
        if math.isnan(best) or r["val_auroc"] > best:
            best, wait = r["val_auroc"], 0
        else:
            wait += 1
            if wait >= 2 and stop is None:
                stop = int(r["round"])
    assert stop is not None and summary["early_stopping"] == {"patience": 2, "stopped_at_round": stop}
    assert rows[-1]["round"] == stop == summary["rounds"] < 12  # stopped there
    chosen = rows[int(np.nanargmax(vals))]
    sel = summary["selected"]
    assert (sel["selection"], sel["round"], sel["value"]) == ("best", chosen["round"], chosen["val_auroc"])
    cfg = FlowerConfig.from_run_config(rc)
    x, y = load_holdout("digits", cfg)  # type: ignore[misc]
    problem = Problem(build_model("mlp", tuple(x.shape[1:]), 0), 0.3)
    assert _test_auroc(tmp_path / "model.pt", x, y, problem) == pytest.approx(sel["test_auroc"], abs=1e-12)
    assert _test_auroc(tmp_path / "last.pt", x, y, problem) == pytest.approx(
        rows[-1]["test_auroc"], abs=1e-12
    )
    assert chosen["round"] != rows[-1]["round"]  # so model.pt and last.pt differ


def test_selection_without_validation_data_is_refused(tmp_path):
    """Refused by the run layer's check when validation = 0; by the server when no site holds any."""
    rc = run_config("codasca", tmp_path, stages=1, selection="best")
    with pytest.raises(ConfigError, match=r"selection = 'best' chooses on validation data"):
        run_local(rc, trial_nodes())
    rc["validation"] = "official"  # the sites' own val.npz / val.csv; these folders have none
    export_trial(
        FlowerConfig.from_run_config({**rc, "selection": "last", "validation": 0}),
        "digits",
        K,
        tmp_path / "s",
    )
    nodes = {1000 + k: {"data-dir": str(tmp_path / "s" / f"site-{k}")} for k in range(K)}
    with pytest.raises(FederationError, match=r"no site holds any: set validation = FRACTION"):
        run_local(rc, nodes)


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"validation": 1.0}, "validation must be 0 (none) or a fraction"),
        ({"selection": "first"}, "unknown selection 'first'"),
        ({"monitor": "test_auroc"}, "unknown monitor 'test_auroc'"),
        ({"early-stopping": -1}, "early-stopping must be ≥ 0"),
    ],
)
def test_selection_settings_are_checked(extra, words, tmp_path):
    with pytest.raises(ConfigError) as e:
        FlowerConfig.from_run_config({**run_config("codasca", tmp_path), **extra})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_validation_counts_cross_flower_records_as_int64():
    """What a site sends for validation survives Flower's ArrayRecord exactly (int64 counts)."""
    pytest.importorskip("flwr")
    from fedxrisk.flower.app import from_records, to_records
    from fedxrisk.flower.wire import Packet

    counts = torch.from_numpy(score_histograms(np.array([0, 1, 1.0]), np.array([-30.0, 0.1, 2**40]), 1))
    back = from_records(to_records(Packet(arrays={"validation": {"counts": counts}})))
    assert back.arrays["validation"]["counts"].dtype == torch.int64
    assert torch.equal(back.arrays["validation"]["counts"], counts)

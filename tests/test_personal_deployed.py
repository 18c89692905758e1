"""Issue 42: a personalized run is selected, reported and flagged on the models its sites deploy.

The data are generated with one client per source: sites 0 and 1 label ``x0 > 0`` positive,
sites 2 and 3 label ``x0 < 0`` positive, so each site's own head can rank its rows while the
global head (the mean of opposite heads) cannot: the global model's validation and the sites'
disagree by construction.
"""

from __future__ import annotations

import csv
import json
import math
import warnings

import numpy as np
import pytest
import torch

from fedxrisk.experiment import ConfigError, RunConfig, build
from fedxrisk.run.checks import checked
from fedxrisk.run.personalize import finish_personal
from fedxrisk.run.recipes import run_experiment
from helpers import run_all


def _write(path, signs: list[float], one_class_site: int | None = None, n: int = 120) -> str:
    rng = np.random.default_rng(0)
    src = np.repeat(np.arange(len(signs)), n)
    x = rng.normal(size=(len(src), 4)).astype(np.float32)
    y = (np.asarray(signs)[src] * x[:, 0] + 0.5 * rng.normal(size=len(src)) > 0).astype(np.int64)
    if one_class_site is not None:  # this site holds positives only
        keep = (src != one_class_site) | (y == 1)
        x, y, src = x[keep], y[keep], src[keep]
    xt = rng.normal(size=(100, 4)).astype(np.float32)
    np.savez(path, x_train=x, y_train=y, x_test=xt, y_test=(xt[:, 0] > 0).astype(np.int64), source_train=src)
    return str(path)


@pytest.fixture(scope="module")
def opposite_sites(tmp_path_factory) -> str:
    return _write(tmp_path_factory.mktemp("data") / "opposite.npz", [1.0, 1.0, -1.0, -1.0])


def _config(path: str, **overrides) -> RunConfig:
    base = dict(algorithm="localsgdm", dataset="npz", data_dir=path, partition="source", clients=4, rounds=6,
                eval_every=1, personal="head", validation=0.3, checkpoint_every=0, tensorboard=False, seed=1,
                lr=1.0, allow_missing_class=True, stages=1, imratio=None)  # fmt: skip
    return RunConfig(**(base | overrides))


def test_a_personalized_run_monitors_its_sites_by_default_and_a_declared_aggregate():
    assert _config("x").resolved_monitor() == "site_val_auroc_mean"
    assert _config("x", personal_monitor="worst").resolved_monitor() == "site_val_auroc_worst"
    assert _config("x", monitor="val_auroc").resolved_monitor() == "val_auroc"  # the global model, declared
    assert _config("x", personal="none").resolved_monitor() == "val_auroc"
    assert RunConfig(algorithm="ditto").resolved_monitor() == "site_val_auroc_mean"  # Ditto's v per site
    dp = {"level": "instance", "clip": 1.0, "noise_multiplier": 1.0}
    assert _config("x", privacy=dp).resolved_monitor() == "val_auroc"  # DP: the released global validation
    with pytest.raises(ConfigError, match="not released through DP"):
        checked(_config("x", privacy=dp, monitor="site_val_auroc_mean"))
    with pytest.raises(ConfigError, match="personal_monitor"):
        checked(_config("x", personal_monitor="median"))
    with pytest.raises(ConfigError, match="needs model.personal"):
        checked(_config("x", personal="none", monitor="site_val_auroc_mean"))


@pytest.mark.slow
def test_selection_follows_the_sites_models_where_the_global_model_disagrees(opposite_sites, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the global model is below chance here: warned (tested below)
        result = run_experiment(_config(opposite_sites, selection="best", seed=0), tmp_path / "run")
    history, selected, block = result.history, result.summary["selected"], result.summary["personal"]
    assert all(f"site_val_auroc_{k}" in history[0] for k in range(4))
    by_sites = max(history, key=lambda r: r["site_val_auroc_mean"])["round"]  # first of equal values
    by_global = max(history, key=lambda r: r["val_auroc"])["round"]
    assert by_sites != by_global  # the construction: the two monitors disagree
    assert selected["monitor"] == "site_val_auroc_mean" and selected["round"] == by_sites
    # the sites' models written are those of the selected round, not the last one
    row = next(r for r in history if r["round"] == by_sites)
    assert by_sites != history[-1]["round"]
    assert block["from_round"] == "selected"
    for k in range(4):
        assert block[f"site_val_auroc_{k}"] == row[f"site_val_auroc_{k}"]
    assert block["site_val_auroc_mean"] == selected["value"] != history[-1]["site_val_auroc_mean"]
    headline = result.summary["deployed"]  # the deployed models' numbers beside the global model's
    assert headline["val_auroc_mean"] == selected["value"] > headline["global_val_auroc_mean"]
    assert headline["test_auroc_mean"] == block["personal_auroc_mean"]
    assert headline["worst_site_test_auroc"] == min(block[f"site_auroc_{k}"] for k in range(4))
    # model.pt (the global model) ranks below chance on validation: flagged as such
    assert result.summary["below_chance"]["metric"] == "val_auroc"
    assert result.summary["below_chance"]["value"] == row["val_auroc"] < 0.5


def test_a_site_holding_one_class_deploys_the_global_model(tmp_path):
    path = _write(tmp_path / "one_class.npz", [1.0, 1.0, 1.0, 1.0], one_class_site=3)
    with pytest.warns(UserWarning, match=r"site\(s\) 3 .*hold one class in their training data"):
        result = run_experiment(_config(path, rounds=2, validation=0), tmp_path / "run")
    block = result.summary["personal"]
    assert block["global_model_sites"] == [3]
    assert block["site_auroc_3"] == block["site_global_auroc_3"]
    assert block["site_auroc_0"] != block["site_global_auroc_0"]  # the control: a two-class site's own head
    site = torch.load(tmp_path / "run" / "site_3.pt", weights_only=False)
    shared = torch.load(tmp_path / "run" / "model.pt", weights_only=False)
    own = torch.load(tmp_path / "run" / "site_0.pt", weights_only=False)
    key = next(k for k in shared["params"] if k.endswith("weight"))
    last = list(shared["params"])[-1]  # the head: personal
    assert all(torch.equal(site["params"][k], shared["params"][k]) for k in shared["params"])
    assert torch.equal(own["params"][key], shared["params"][key])  # shared body
    assert not torch.equal(own["params"][last], shared["params"][last])


def test_a_site_model_below_chance_on_its_validation_is_flagged(opposite_sites):
    """Site 2's head negated after training (its logit flipped): its validation AUROC becomes
    1 − what it was, and the run names that site, with that value, in a warning and summary.json."""
    cfg = checked(_config(opposite_sites, rounds=3)).config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        setup = build(cfg)
        run_all(setup.simulation)
        before = finish_personal(setup)[1]
        assert before is not None and before["below_chance_sites"] == []
    states = setup.simulation.states
    head = [k for k in states["w"] if k in setup.problem.local_names]
    assert head
    for name in head:
        states["w"][name][2] = -states["w"][name][2]
    with pytest.warns(UserWarning, match=r"site model\(s\) below chance.*site 2"):
        block = finish_personal(setup)[1]
    assert block is not None
    low = block["below_chance_sites"]
    assert [s["site"] for s in low] == [2] and low[0]["metric"] == "site_val_auroc"
    assert math.isclose(low[0]["value"], 1 - before["site_val_auroc_2"], abs_tol=1e-9)


@pytest.mark.slow  # a tune (3 s)
def test_tune_follows_the_sites_models_of_a_personalized_run(opposite_sites, tmp_path):
    pytest.importorskip("optuna")
    from click.testing import CliRunner

    from fedxrisk.cli import main

    out = tmp_path / "t"
    args = ["tune", "-a", "localsgdm", "--dataset", "npz", "--data-dir", opposite_sites, "--clients", "4",
            "--rounds", "2", "--eval-every", "1", "--trials", "1", "--no-prune", "-q", "--out", str(out),
            "--set", "data.partition=source", "--set", "data.imratio=none", "--set", "model.personal=head",
            "--set", "algorithm.stages=1", "--set", "experiment.personal_monitor=worst"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    best = json.loads((out / "best.json").read_text())
    assert best["monitor"] == "site_val_auroc_worst"
    rows = list(csv.DictReader((out / "trials" / "0000" / "history.csv").open()))
    chosen = max(rows, key=lambda r: float(r["site_val_auroc_worst"]))
    assert best["value"] == float(chosen["site_val_auroc_worst"])
    assert best["value"] == min(float(chosen[f"site_val_auroc_{k}"]) for k in range(4))  # the worst site


@pytest.mark.slow  # three runs
def test_a_resumed_run_keeps_the_selected_sites_models(opposite_sites, tmp_path):
    """The sites' states of the selected round travel in the checkpoint: a run cut after round 3
    (checkpoint at round 2, the selected one) and resumed writes the same site_<k>.pt."""
    from fedxrisk.run.callbacks import Callback
    from fedxrisk.run.recipes import resume_experiment

    class Cut(Callback):
        def on_round_end(self, row, state) -> None:
            if state.round == 3:
                raise KeyboardInterrupt

    cfg = _config(opposite_sites, selection="best", seed=0, checkpoint_every=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = run_experiment(cfg, tmp_path / "full")
        with pytest.raises(KeyboardInterrupt):
            run_experiment(cfg, tmp_path / "cut", callbacks=[Cut()])
        resumed = resume_experiment(tmp_path / "cut")
    assert full.summary["selected"]["round"] == resumed.summary["selected"]["round"] == 2
    assert full.summary["personal"]["site_models"] == resumed.summary["personal"]["site_models"]

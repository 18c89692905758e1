"""``fedxrisk cross-site``: every model at every site, AUROC [DeLong CI] per cell (issue 32)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.evaluation.cross import cross_site
from fedxrisk.experiment import RunConfig, build_data, load_model, run_experiment
from fedxrisk.inference import feature_standardization
from fedxrisk.stats import delong
from test_evaluate_federated import SITES, TINY, runs  # noqa: F401  (the module fixture: two runs on four sites)


def _config(run) -> RunConfig:
    return RunConfig(**json.loads((run / "summary.json").read_text())["config"])


@pytest.fixture(scope="module")
def local_run(runs):  # noqa: F811
    """Site 0's local-only model: a table of site 0's raw training rows (train.csv), every raw test row (test.csv)."""
    cfg = _config(runs / "codasca")
    fed, _ = build_data(cfg)
    mean, std = feature_standardization(cfg)
    raw = {k: getattr(fed.data, f"x_{k}").numpy() * std + mean for k in ("train", "test")}
    site0 = np.asarray(fed.data.groups_train["source"]) == 0
    folder = runs / "local0-data"
    folder.mkdir()
    for name, x, y in (("train", raw["train"][site0], fed.data.y_train.numpy()[site0]),
                       ("test", raw["test"], fed.data.y_test.numpy())):  # fmt: skip
        with open(folder / f"{name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["f0", "f1", "f2", "label"])
            w.writerows([[*map(float, r), int(t)] for r, t in zip(x, y.reshape(-1))])
    local = RunConfig(dataset="tabular", data_dir=str(folder), imratio=None, partition="iid", clients=1,
                      algorithm="localsgdm", lr=0.5, **TINY)  # fmt: skip
    run_experiment(local, runs / "local0")
    return runs / "local0", raw["test"]


def test_every_cell_is_delong_of_that_model_at_that_site(runs, local_run, tmp_path):  # noqa: F811
    local, raw_test = local_run
    result = cross_site([runs / "codasca", local], out=tmp_path)
    cfg = _config(runs / "codasca")
    fed, _ = build_data(cfg)
    y = fed.data.y_test.numpy().reshape(-1).astype(bool)
    source = np.asarray(fed.data.groups_test["source"])
    with torch.no_grad():
        s_fed = load_model(runs / "codasca")(fed.data.x_test).reshape(-1).numpy().astype(np.float64)
        lmean, lstd = feature_standardization(_config(local))
        x_local = torch.from_numpy(((raw_test - lmean) / lstd).astype(np.float32))
        s_local = load_model(local)(x_local).reshape(-1).numpy().astype(np.float64)
    assert result["sites"] == [*sorted(SITES), "pooled"]  # the CSV's source names
    for name, s in (("codasca", s_fed), ("local0", s_local)):
        for k in range(4):
            expected = delong(y[source == k], s[source == k])
            got = result["matrix"][name][sorted(SITES)[k]]
            assert got["auroc"] == pytest.approx(expected.auroc, abs=1e-6)
            assert (got["low"], got["high"]) == pytest.approx((expected.low, expected.high), abs=1e-6)
        assert result["matrix"][name]["pooled"]["auroc"] == pytest.approx(delong(y, s).auroc, abs=1e-6)
    assert (tmp_path / "cross_site.png").stat().st_size > 1000
    assert "| local0 |" in (tmp_path / "cross_site.md").read_text()


def test_cli_cross_site_and_its_refusals(runs, tmp_path):  # noqa: F811
    out = tmp_path / "x"
    res = CliRunner().invoke(
        main, ["cross-site", str(runs / "codasca"), str(runs / "localsgdm"), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "| localsgdm |" in res.output and (out / "cross_site.json").exists()
    assert "\\x0a" not in res.output and res.output.count("\n| ") >= 3  # the table line by line
    again = CliRunner().invoke(main, ["cross-site", str(runs / "codasca"), "--out", str(out)])
    assert again.exit_code == 2 and "already holds cross_site.json" in again.output
    none = CliRunner().invoke(main, ["cross-site", str(tmp_path / "nothing"), "--out", str(tmp_path / "y")])
    assert none.exit_code == 2 and len(none.output.strip().splitlines()) == 1, none.output


def test_on_a_dataset_equals_on_the_runs_own_test_set(runs, tmp_path):  # noqa: F811
    """The same file and split through --dataset: the same rows and sites, so the same cells."""
    own = cross_site([runs / "codasca", runs / "localsgdm"], out=tmp_path / "own")
    via = cross_site([runs / "codasca", runs / "localsgdm"], dataset="tabular", data_dir=str(runs / "data"),
                     out=tmp_path / "via")  # fmt: skip
    assert own["sites"] == via["sites"]
    for model, row in own["matrix"].items():
        for site, c in row.items():
            assert via["matrix"][model][site]["auroc"] == pytest.approx(c["auroc"], abs=1e-6)

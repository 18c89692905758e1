"""``fedxrisk evaluate RUN``: per-client rows on each client's own test portion where the data has
one (a ``source`` partition whose reader keeps the test rows' sites), else on training shards in a
table labelled as such; never training numbers in the test table (issue 25)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import fedxrisk
from fedxrisk.data.readers import read_tabular_csv
from fedxrisk.evaluation import label_metrics
from fedxrisk.experiment import RunConfig, build_data, load_model, run_experiment

TINY = dict(rounds=2, stages=1, eval_every=2, tensorboard=False, checkpoint_every=0, model="linear")
SITES = ("north", "south", "west")


def _write_sites_table(path, rows: int = 240, seed: int = 0) -> None:
    """data.csv: 3 features, a label that depends on them, and a site (``source``) column."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    label = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(size=rows) > 0.3).astype(int)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["f0", "f1", "f2", "label", "source"])
        w.writerows([[*map(float, r), int(t), SITES[i % 3]] for i, (r, t) in enumerate(zip(x, label))])


@pytest.fixture(scope="module")
def site_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("portions")
    (root / "data").mkdir()
    _write_sites_table(root / "data" / "data.csv")
    cfg = RunConfig(dataset="tabular", data_dir=str(root / "data"), imratio=None, partition="source",
                    clients=3, **TINY)  # fmt: skip
    run_experiment(cfg, root / "run")
    return root


def test_each_client_is_scored_on_its_own_sites_test_rows(site_run, tmp_path):
    result = fedxrisk.evaluate(site_run / "run", bootstrap=20, out=tmp_path)
    assert result["group_kind"] == "client" and result["groups_split"] == "test"
    data = read_tabular_csv(site_run / "data")
    sites = data.groups_test["source"]
    assert sorted(np.unique(sites)) == [0, 1, 2]  # the split kept the test rows' sites
    fed, _ = build_data(RunConfig(**json.loads((site_run / "run" / "summary.json").read_text())["config"]))
    model = load_model(site_run / "run")
    import torch

    with torch.no_grad():
        scores = model(fed.data.x_test).reshape(-1).numpy().astype(np.float64)
    y = fed.data.y_test.numpy().reshape(-1).astype(np.float64)
    for k, site in enumerate(np.unique(fed.data.groups_train["source"])):
        own = fed.data.groups_test["source"] == site
        expected = label_metrics(y[own], scores[own], 20, [0, 1 + k, 0])
        got = result["groups"][fed.data.source_names[site]]["score"]  # named by the CSV's source column
        assert got["n"] == int(own.sum()) and got["positives"] == int(y[own].sum())
        assert got["auroc"] == pytest.approx(expected["auroc"], abs=1e-12)
        assert got["ap"] == pytest.approx(expected["ap"], abs=1e-12)
    assert sum(g["score"]["n"] for g in result["groups"].values()) == result["overall"]["score"]["n"]
    # summary.json's client_auroc_mean is still its training-shard definition, reproduced
    final = json.loads((site_run / "run" / "summary.json").read_text())["final"]
    assert result["summary"]["client_auroc_mean"] == final["client_auroc_mean"]
    text = (tmp_path / "evaluation.md").read_text()
    assert "## Per client: its own test portion" in text and "TRAINING" not in text


def test_clients_that_are_not_sites_get_their_training_shards_labelled_apart(site_run, tmp_path):
    cfg = RunConfig(dataset="tabular", data_dir=str(site_run / "data"), imratio=None, partition="iid",
                    clients=2, **TINY)  # fmt: skip
    run_experiment(cfg, tmp_path / "iid")
    result = fedxrisk.evaluate(tmp_path / "iid", bootstrap=0, out=tmp_path / "e")
    assert result["groups_split"] == "train"
    train_n = json.loads((tmp_path / "iid" / "summary.json").read_text())["data"]["train_samples"]
    assert sum(g["score"]["n"] for g in result["groups"].values()) == train_n  # not test rows
    text = (tmp_path / "e" / "evaluation.md").read_text()
    assert "## Per client: its TRAINING shard (in-sample, not test data" in text


def test_separate_train_and_test_files_keep_the_test_rows_sites(tmp_path):
    _write_sites_table(tmp_path / "all.csv", rows=60)
    lines = (tmp_path / "all.csv").read_text().splitlines()
    (tmp_path / "train.csv").write_text("\n".join([lines[0], *lines[1:46]]) + "\n")
    (tmp_path / "test.csv").write_text("\n".join([lines[0], *lines[46:]]) + "\n")
    data = read_tabular_csv(tmp_path)
    codes = sorted(SITES)  # a site's code: its place among the sorted training sites
    assert data.groups_test["source"].tolist() == [codes.index(line.rsplit(",", 1)[1]) for line in lines[46:]]


def test_a_datasets_test_split_is_grouped_by_its_own_sites(site_run, tmp_path):
    result = fedxrisk.evaluate(site_run / "run", dataset="tabular", data_dir=str(site_run / "data"),
                               split="test", bootstrap=0, out=tmp_path)  # fmt: skip
    sites = read_tabular_csv(site_run / "data").groups_test["source"]
    assert result["group_kind"] == "site" and result["groups_split"] == "test"
    assert [g["score"]["n"] for g in result["groups"].values()] == np.bincount(sites).tolist()

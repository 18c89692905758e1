"""Survival as a registered task (issue 41, item 4): ``fedxrisk run --dataset tcga_brca -a fedxl2_cox``
writes a run folder whose summary.json C-index equals lifelines' on the model's risk scores; ``evaluate``
and ``predict`` work on it and agree; ``list`` names the survival dataset and algorithms; an algorithm
on the other task's data is refused in one line. Data: small generated files in FLamby's
Fed-TCGA-BRCA format (never ../shared/data)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner
from lifelines.utils import concordance_index

from fedxrisk.cli import main
from fedxrisk.errors import ConfigError
from fedxrisk.stats.concordance import c_index
from fedxrisk.stats.survival import _pair_matrices, _weighted_c, cindex_report

REGIONS = (36, 28, 24, 20, 20, 12)


def write_tcga_like(root, per_region=REGIONS, seed=0):
    """brca.csv (pid, 39 features, E, T), train_test_split.csv (fold2 = train_K/test_K) and centers.csv
    (the barcode's TSS code → region): FLamby's layout; risk = f0 + f1/2, exponential times, censoring."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows, split = [], []
    for k, n in enumerate(per_region):
        for i in range(n):
            x = rng.normal(size=39)
            t, c = rng.exponential(np.exp(-(x[0] + 0.5 * x[1]))) * 1000, rng.exponential(3000)
            part = "test" if i % 4 == 0 else "train"
            rows.append(
                [f"TCGA-T{k}-{i:04d}", *(f"{v:.4f}" for v in x), str(int(t <= c)), f"{min(t, c):.1f}"]
            )
            split.append([rows[-1][0], part, f"{part}_{k}"])
    with (root / "brca.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["pid", *(f"f{j}" for j in range(39)), "E", "T"], *rows])
    with (root / "train_test_split.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["pid", "fold", "fold2"], *split])
    with (root / "centers.csv").open("w", newline="") as f:
        centers = [[f"T{k}", f"site {k}", "X", "Y", f"R{k}"] for k in range(6)]
        csv.writer(f).writerows([["TSS Code", "Source Site", "Country", "State", "Region"], *centers])
    test = [(r, s[2]) for r, s in zip(rows, split) if s[1] == "test"]
    return {  # the test patients as the run's test set holds them (reader order), raw features
        "pid": [r[0] for r, _ in test],
        "x": np.array([[float(v) for v in r[1:40]] for r, _ in test]),
        "event": np.array([int(r[40]) for r, _ in test]),
        "time": np.array([float(r[41]) for r, _ in test]),
        "region": np.array([int(fold.split("_")[1]) for _, fold in test]),
    }


@pytest.fixture(scope="module")
def tcga(tmp_path_factory):
    root = tmp_path_factory.mktemp("tcga")
    return root, write_tcga_like(root)


@pytest.fixture(scope="module")
def survival_run(tcga, tmp_path_factory):
    root, _ = tcga
    out = tmp_path_factory.mktemp("runs") / "cox"
    args = ["run", "--dataset", "tcga_brca", "--data-dir", str(root), "-a", "fedxl2_cox", "--rounds", "3",
            "--set", "data.partition=source", "--clients", "6", "--set", "data.validation=0.25",
            "--set", "experiment.selection=best", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out


def _predicted(run, tcga, tmp_path):
    """``predict`` on the reader's own brca.csv (pid identifies a row, E and T are skipped): the test
    patients' risk scores, in the run's test order."""
    root, test = tcga
    out = tmp_path / "risk.csv"
    result = CliRunner().invoke(main, ["predict", str(run), str(root / "brca.csv"), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    with out.open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["pid", "risk"] and len(table) == sum(REGIONS)
    risk = {r["pid"]: float(r["risk"]) for r in table}
    return np.array([risk[p] for p in test["pid"]])


@pytest.mark.slow
def test_a_survival_run_writes_a_folder_whose_c_index_equals_lifelines(survival_run, tcga, tmp_path):
    _, test = tcga
    assert {p.name for p in survival_run.iterdir()} >= {"model.pt", "history.csv", "summary.json"}
    summary = json.loads((survival_run / "summary.json").read_text())
    assert summary["selected"]["monitor"] == "val_cindex" and summary["selected"]["selection"] == "best"
    risk = _predicted(survival_run, tcga, tmp_path)  # the saved model's risk scores of the raw test rows
    report = summary["test_cindex"]
    pooled = concordance_index(test["time"], -risk, test["event"])  # lifelines takes survival times: −risk
    assert report["pooled"]["c_index"] == pytest.approx(pooled, abs=1e-9)
    assert report["pooled"]["c_index"] == pytest.approx(summary["selected"]["test_cindex"], abs=1e-9)
    assert report["pooled"]["low"] < report["pooled"]["c_index"] < report["pooled"]["high"]
    for k in range(6):
        m = test["region"] == k
        entry = report["per_site"][f"region {k}"]
        assert entry["events"] == int(test["event"][m].sum()) and entry["patients"] == int(m.sum())
        if test["event"][m].sum():
            assert entry["c_index"] == pytest.approx(
                concordance_index(test["time"][m], -risk[m], test["event"][m])
            )
    header = (survival_run / "history.csv").read_text().splitlines()[0].split(",")
    assert "test_cindex" in header and "val_cindex" in header and "test_auroc" not in header


@pytest.mark.slow
def test_evaluate_reproduces_the_summary_and_agrees_with_predict(survival_run, tcga, tmp_path):
    _, test = tcga
    out = tmp_path / "eval"
    result = CliRunner().invoke(main, ["evaluate", str(survival_run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "region 5" in result.output and "pooled" in result.output
    written = json.loads((out / "evaluation.json").read_text())
    evaluated, fed = written["test_cindex"], written["federated"]
    assert abs(fed["c_index"] - evaluated["pooled"]["c_index"]) <= fed["bound"] + 1e-12  # no score pooled
    assert "without site or event flag" in fed["note"]
    summary = json.loads((survival_run / "summary.json").read_text())["test_cindex"]
    assert evaluated == summary  # same model, patients, resamples (seed 0)
    risk = _predicted(survival_run, tcga, tmp_path)
    assert evaluated["pooled"]["c_index"] == pytest.approx(
        c_index(test["time"], test["event"], risk), abs=1e-12
    )
    refused = CliRunner().invoke(main, ["evaluate", str(survival_run), "--out", str(out), "--overwrite",
                                        "--calibration"])  # fmt: skip
    assert refused.exit_code == 2 and "--calibration applies to binary runs" in refused.output


def test_list_names_the_survival_dataset_and_algorithms():
    result = CliRunner().invoke(main, ["list"])
    assert result.exit_code == 0
    for name in ("tcga_brca", "fedavg_cox", "fedxl2_cox", "fedxl1_cindex"):
        assert name in result.output


@pytest.mark.parametrize(
    ("dataset", "algorithm", "said"),
    [
        ("tcga_brca", "codaplus", "is survival data"),
        ("breast_cancer", "fedxl2_cox", "is a survival algorithm"),
    ],
)
def test_an_algorithm_on_the_other_tasks_data_is_refused_at_check_time(
    tcga, tmp_path, dataset, algorithm, said
):
    root, _ = tcga
    data = ["--data-dir", str(root)] if dataset == "tcga_brca" else []
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["run", "--dataset", dataset, *data, "-a", algorithm, "--out", str(out)]
    )
    assert result.exit_code == 2 and said in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()  # refused before anything is written


def test_flower_and_compare_refuse_survival_in_one_line():
    from fedxrisk.compare import build_variants
    from fedxrisk.flower.config import check_honoured
    from fedxrisk.run.spec import RunConfig

    with pytest.raises(ConfigError, match="Flower deployment does not honour"):
        check_honoured(RunConfig(dataset="tcga_brca", algorithm="fedxl2_cox"))
    with pytest.raises(ConfigError, match="survival runs are not compared"):
        build_variants({"data": {"dataset": "tcga_brca"}}, ["fedavg_cox"])


def test_the_bootstrap_c_of_a_resample_equals_harrells_c_on_the_repeated_patients():
    rng = np.random.default_rng(3)
    t, e, s = rng.integers(1, 30, 40).astype(float), rng.integers(0, 2, 40), rng.normal(size=40).round(1)
    k, m = _pair_matrices(t, e, s)
    w = rng.multinomial(40, np.full(40, 1 / 40), size=5).astype(float)
    for row, got in zip(w, _weighted_c(k, m, w)):
        rows = np.repeat(np.arange(40), row.astype(int))  # the resample, patient by patient
        assert got == pytest.approx(concordance_index(t[rows], -s[rows], e[rows]), abs=1e-12)


def test_no_interval_where_c_is_one_or_events_are_few():
    t = np.arange(1.0, 21.0)
    report = cindex_report(
        t, np.ones(20, int), -t, sites=np.repeat([0, 1], 10), site_names=("a", "b"), draws=50
    )
    assert report["pooled"]["c_index"] == 1.0 and report["pooled"]["low"] is None
    assert "C = 1" in report["pooled"]["note"]
    few = cindex_report(t, (t < 4).astype(int), np.random.default_rng(0).normal(size=20), draws=50)
    assert few["pooled"]["low"] is None and "only 3 event(s)" in few["pooled"]["note"]


def test_a_generic_time_event_table_runs_by_site_name_and_equals_lifelines(tmp_path):
    """``--dataset survival``: <data_dir>/survival.csv with time, event, features, source and split."""
    rng = np.random.default_rng(1)
    n = 120
    x = rng.normal(size=(n, 2))
    t, c = rng.exponential(np.exp(-x[:, 0])) * 100, rng.exponential(300, n)
    site, split = (
        np.array(["north", "south", "east"])[np.arange(n) % 3],
        np.where(np.arange(n) % 4 == 0, "test", "train"),
    )
    rows = [
        [f"{min(a, b):.2f}", int(a <= b), *map(str, xi), s, sp]
        for a, b, xi, s, sp in zip(t, c, x, site, split)
    ]
    with (tmp_path / "survival.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["time", "event", "age", "grade", "source", "split"], *rows])
    out = tmp_path / "run"
    args = ["run", "--dataset", "survival", "--data-dir", str(tmp_path), "-a", "fedavg_cox", "--rounds", "2",
            "--set", "data.partition=source", "--clients", "3", "--set", "server.optimizer=adam",
            "--set", "server.lr=0.01", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    test = split == "test"
    with (tmp_path / "new.csv").open("w", newline="") as f:
        csv.writer(f).writerows(
            [["patient_id", "age", "grade"], *([i, *map(str, xi)] for i, xi in enumerate(x[test]))]
        )
    result = CliRunner().invoke(
        main, ["predict", str(out), str(tmp_path / "new.csv"), "--out", str(tmp_path / "r.csv")]
    )
    assert result.exit_code == 0, result.output
    with (tmp_path / "r.csv").open() as f:
        risk = np.array([float(r["risk"]) for r in csv.DictReader(f)])
    report = json.loads((out / "summary.json").read_text())["test_cindex"]
    times, events = np.minimum(t, c)[test].round(2), (t <= c)[test].astype(int)
    assert report["pooled"]["c_index"] == pytest.approx(concordance_index(times, -risk, events), abs=1e-9)
    assert set(report["per_site"]) == {"north", "south", "east"}
    assert (
        json.loads((out / "summary.json").read_text())["config"]["server"]["optimizer"] == "adam"
    )  # FedAdam-Cox


@pytest.mark.slow
def test_load_run_reads_a_survival_run_and_cross_site_and_plot_refuse_it(survival_run, tmp_path):
    from fedxrisk import load_run

    run = load_run(survival_run)
    assert (
        run.history[-1]["test_cindex"]
        == json.loads((survival_run / "summary.json").read_text())["final"]["test_cindex"]
    )
    for args in (
        ["cross-site", str(survival_run), "--out", str(tmp_path / "cs")],
        ["plot", str(survival_run), "--out", str(tmp_path / "pl")],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and "fedxrisk evaluate RUN" in result.output, result.output
        assert not (tmp_path / args[-1]).exists()


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"personal": "head", "model": "mlp"}, "model.personal = 'head' on survival data"),
        ({"engine": "distributed"}, "engine = 'distributed' on survival data"),
        ({"monitor": "val_auroc"}, "experiment.monitor = 'val_auroc'"),
        ({"privacy": {"level": "client"}, "selection": "best", "validation": 0.2}, "validation release"),
    ],
)
def test_what_survival_does_not_support_is_refused_in_one_line(settings, said):
    from fedxrisk.run.checks import check
    from fedxrisk.run.spec import RunConfig

    messages = [
        str(e)
        for e in check(RunConfig(dataset="tcga_brca", data_dir="unused", algorithm="fedavg_cox", **settings))
    ]
    assert [m for m in messages if said in m and "\n" not in m], messages
    assert not check(RunConfig(dataset="tcga_brca", data_dir="unused", algorithm="fedavg_cox"))  # the control


@pytest.mark.parametrize("seed", range(4))
def test_the_federated_c_index_lies_within_its_bound_of_the_pooled_one(seed):
    """Tied times and scores (whole days, rounded scores) across three sites: C_fed within ± bound of
    lifelines on the pooled scores; with coarse time bins the bound grows but still holds."""
    from fedxrisk.stats.federated_cindex import federated_cindex

    rng = np.random.default_rng(seed)
    sites = []
    for n in (40, 25, 12):
        s = rng.normal(size=n).round(1)
        sites.append((rng.integers(0, 60, n).astype(float), rng.integers(0, 2, n), s))
    t, e, s = (np.concatenate(part) for part in zip(*sites))
    exact = concordance_index(t, -s, e)
    for bins in (256, 8):
        fed = federated_cindex(sites, time_bins=bins)
        assert abs(fed.c_index - exact) <= fed.bound + 1e-12 and fed.bound > 0


def test_the_federated_c_index_is_exact_when_no_bin_holds_two_patients():
    from fedxrisk.stats.federated_cindex import federated_cindex

    rng = np.random.default_rng(5)
    t = rng.permutation(60).astype(float) * 10 + 5  # distinct times, 10 apart: one per time bin of 600/60
    s = (rng.permutation(60) - 30) * 0.25  # distinct scores, 0.25 apart: one per score bin of 32/4095
    e = rng.integers(0, 2, 60)
    sites = [(t[:30], e[:30], s[:30]), (t[30:], e[30:], s[30:])]
    fed = federated_cindex(sites, time_bins=60)
    assert fed.bound == 0 and fed.c_index == pytest.approx(concordance_index(t, -s, e), abs=1e-12)


def test_the_studys_bootstrap_draws_are_the_reports_resamples():
    """benchmarks/survival/survival.py averages bootstrap_draws over seeds: one model's draws give exactly
    cindex_report's pooled and mean-over-sites intervals (the same resamples of the same patients)."""
    from fedxrisk.stats.survival import bootstrap_draws

    rng = np.random.default_rng(2)
    t, e, s, site = rng.uniform(1, 50, 90), rng.integers(0, 2, 90), rng.normal(size=90), np.arange(90) % 3
    pooled, mean_sites = bootstrap_draws(t, e, s, site, draws=200, seed=0)
    report = cindex_report(t, e, s, site, draws=200, seed=0)
    assert [report["pooled"]["low"], report["pooled"]["high"]] == list(np.quantile(pooled, [0.025, 0.975]))
    got = [report["mean_over_sites"]["low"], report["mean_over_sites"]["high"]]
    assert got == pytest.approx(list(np.quantile(mean_sites, [0.025, 0.975])), abs=1e-12)


@pytest.mark.slow
def test_tune_maximises_the_validation_c_index(tcga, tmp_path):
    root, _ = tcga
    out = tmp_path / "tune"
    args = ["tune", "--dataset", "tcga_brca", "--data-dir", str(root), "-a", "fedavg_cox", "--rounds", "2",
            "--trials", "2", "--set", "data.partition=source", "--clients", "6", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    best = json.loads((out / "best.json").read_text())
    trial = json.loads((out / best["folder"] / "summary.json").read_text())
    assert best["monitor"] == "val_cindex" and trial["selected"]["monitor"] == "val_cindex"
    assert best["value"] == pytest.approx(trial["selected"]["value"])


@pytest.mark.slow  # two CLI runs with the accountant
def test_a_survival_run_under_client_dp_trains_finite_reports_epsilon_and_draws_secret_noise(tcga, tmp_path):
    """Client-level DP with selection = last (the C-index validation release is not private): the
    run finishes with finite weights and an ε, and two runs of one config add different noise."""
    import torch

    root, _ = tcga
    models = []
    for name in ("a", "b"):
        args = ["run", "--dataset", "tcga_brca", "--data-dir", str(root), "-a", "fedavg_cox", "--rounds", "2",
                "--set", "data.partition=source", "--clients", "6", "--set", "privacy.level='client'",
                "--set", "privacy.clip=1", "--set", "privacy.noise_multiplier=1", "--out", str(tmp_path / name), "-q"]  # fmt: skip
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["privacy"]["epsilon"] > 0 and "test_cindex" in summary
        state = torch.load(tmp_path / name / "model.pt", weights_only=True)["params"]
        assert all(torch.isfinite(t).all() for t in state.values())
        models.append(state)
    assert any(not torch.equal(models[0][k], models[1][k]) for k in models[0])

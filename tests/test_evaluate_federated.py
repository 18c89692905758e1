"""``fedxrisk evaluate`` on a multi-site file: per-site and pooled AUROC [CI] computed pooled and
federated (issue 32), and the per-site numbers equal DeLong on that site alone."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import fedxrisk
from fedxrisk.evaluation import label_metrics
from fedxrisk.evaluation.federated import label_sites
from fedxrisk.experiment import RunConfig, run_experiment
from fedxrisk.stats import delong, delong_paired, logit_edges

TINY = dict(
    rounds=2, stages=1, eval_every=2, tensorboard=False, checkpoint_every=0, model="linear", batch_size=16
)
SITES = ("north", "south", "west", "east")


def write_sites(path, rows: int = 320, seed: int = 0) -> None:
    """data.csv: 3 features, a label that depends on them, four sites of different sizes."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    label = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(size=rows) > 0.3).astype(int)
    site = rng.choice(4, size=rows, p=[0.4, 0.3, 0.2, 0.1])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["f0", "f1", "f2", "label", "source"])
        w.writerows([[*map(float, r), int(t), SITES[s]] for r, t, s in zip(x, label, site)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs on the same sites and split: CODASCA and cross-entropy FedAvg (localsgdm)."""
    root = tmp_path_factory.mktemp("fedeval")
    (root / "data").mkdir()
    write_sites(root / "data" / "data.csv")
    for algorithm in ("codasca", "localsgdm"):
        cfg = RunConfig(dataset="tabular", data_dir=str(root / "data"), imratio=None, partition="source",
                        clients=4, algorithm=algorithm, lr=0.5, validation=0.2, **TINY)  # fmt: skip
        run_experiment(cfg, root / algorithm)
    return root


def test_pooled_and_federated_side_by_side(runs, tmp_path):
    result = fedxrisk.evaluate(runs / "codasca", bootstrap=20, out=tmp_path)
    fed = result["federated"]["labels"]["score"]
    overall = result["overall"]["score"]
    assert fed["exact"]["auroc"] == pytest.approx(overall["auroc"], abs=1e-12)
    assert [fed["exact"]["low"], fed["exact"]["high"]] == pytest.approx(overall["auroc_ci"], abs=1e-12)
    bound = fed["federated"]
    assert abs(fed["difference"]["auroc"]) <= bound["auroc_bound"] + 1e-12
    assert abs(fed["difference"]["low"]) <= bound["ci_bound"] + 1e-12
    assert abs(fed["difference"]["high"]) <= bound["ci_bound"] + 1e-12
    assert (fed["positives"], fed["negatives"]) == (overall["positives"], overall["negatives"])
    # per site: the site's own DeLong, equal to evaluating that site alone
    assert list(fed["sites"]) == list(result["groups"])
    for name, site in fed["sites"].items():
        alone = result["groups"][name]["score"]
        assert site["auroc"] == pytest.approx(alone["auroc"], abs=1e-12)
        assert [site["low"], site["high"]] == pytest.approx(alone["auroc_ci"], abs=1e-12)
    text = (tmp_path / "evaluation.md").read_text()
    assert "## Pooled and federated" in text and "| **pooled** |" in text


def test_per_site_numbers_equal_label_metrics_on_the_site_alone():
    rng = np.random.default_rng(4)
    groups = []
    for n in (40, 25, 9):
        y = (rng.random(n) < 0.4).astype(float)
        groups.append((f"site {n}", y, [rng.normal(size=n) + y]))
    out = label_sites(groups, logit_edges())
    for name, y, (s,) in groups:
        m = label_metrics(y, s, 0, [0])
        assert [out["sites"][name]["low"], out["sites"][name]["high"]] == pytest.approx(
            m["auroc_ci"], abs=1e-12
        )


def test_coarse_bins_differ_from_exact_within_the_bound():
    """With 10 bins the federated numbers move, by no more than the printed bound; the paired
    test's exact p lies in the printed bracket."""
    rng = np.random.default_rng(5)
    groups = []
    for n in (60, 50, 30, 4):
        y = (rng.random(n) < 0.35).astype(float)
        y[rng.random(n) < 0.05] = np.nan  # unknown labels are left out, as evaluate does
        s1 = rng.normal(size=n) + y
        groups.append((f"site {n}", y, [s1, 0.5 * s1 + rng.normal(size=n)]))
    out = label_sites(groups, logit_edges(10, 2.0))
    known = [~np.isnan(y) for _, y, _ in groups]
    y = np.concatenate([g[1][k] for g, k in zip(groups, known)]).astype(bool)
    s1, s2 = (np.concatenate([g[2][i][k] for g, k in zip(groups, known)]) for i in range(2))
    exact = delong(y, s1)
    assert out["exact"]["auroc"] == exact.auroc
    assert 0 < abs(out["difference"]["auroc"]) <= out["federated"]["auroc_bound"]
    p = out["paired"]
    assert p["exact"]["p_value"] == pytest.approx(delong_paired(y, s1, s2).p_value, abs=1e-15)
    assert p["federated"]["p_low"] <= p["exact"]["p_value"] <= p["federated"]["p_high"]
    assert p["federated"]["p_value"] != p["exact"]["p_value"]


def test_dp_release_is_reported_or_refused_in_one_line(runs, tmp_path):
    pytest.importorskip("dp_accounting")
    small = fedxrisk.evaluate(runs / "codasca", bootstrap=0, dp_epsilon=1.0, out=tmp_path / "a")
    refused = small["federated"]["labels"]["score"]["private"]["refused"]
    # the noise is secret, so which of the refusals is drawn varies: each is one line, with no count
    assert (
        any(why in refused for why in ("more patients", "swamps", "no usable class")) and "\n" not in refused
    )
    n = small["overall"]["score"]["positives"] + small["overall"]["score"]["negatives"]
    import re

    from fedxrisk.stats.dp_eval import DP_BINS

    # a count is never stated; the "N× more patients" factor (post-processing of the noisy release,
    # a ratio, not a count) can fall in that range by chance under secret noise: left out
    shown = re.sub(r"\d+(?:\.\d+)?×", "", refused.replace(f"{DP_BINS} bins", ""))
    numbers = re.findall(r"\d+(?:\.\d+)?", shown)
    assert not [v for v in map(float, numbers) if n / 2 <= v <= 2 * n], refused
    assert "Differentially private release (ε = 1" in (tmp_path / "a" / "evaluation.md").read_text()
    loose = fedxrisk.evaluate(runs / "codasca", bootstrap=0, dp_epsilon=1e4, out=tmp_path / "b")
    private, exact = loose["federated"]["labels"]["score"]["private"], loose["overall"]["score"]["auroc"]
    assert abs(private["auroc"] - exact) <= private["auroc_bound"] + 5 * private["noise_se"] + 1e-9
    assert private["low"] <= private["auroc"] <= private["high"]
    from click.testing import CliRunner

    from fedxrisk.cli import main

    bad = CliRunner().invoke(
        main, ["evaluate", str(runs / "codasca"), "--dp-epsilon", "-1", "--out", str(tmp_path / "c")]
    )
    assert bad.exit_code == 2 and "--dp-epsilon must be a finite number > 0" in bad.output


def _numbers(tree) -> list[float]:
    """Every number in a JSON tree (the attacker's candidate seeds)."""
    if isinstance(tree, dict):
        return [v for x in tree.values() for v in _numbers(x)]
    if isinstance(tree, list):
        return [v for x in tree for v in _numbers(x)]
    return [float(tree)] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


def test_dp_release_noise_is_secret_two_runs_differ_and_no_seed_in_the_file_regenerates_it(runs, tmp_path):
    """Issue 40 item 3, as an attacker: the noise of ``evaluate --dp-epsilon`` regenerated from any
    integer evaluation.json holds (the old way: ``default_rng([seed, 32])``; or a reproducible
    NoiseSource) and subtracted from the released class counts never gives the true counts; two
    evaluations of one model release different numbers."""
    import json

    from fedxrisk.engines.privacy.noise import NoiseSource
    from fedxrisk.stats.dp_eval import DP_BINS

    pytest.importorskip("dp_accounting")
    first = fedxrisk.evaluate(runs / "codasca", bootstrap=0, dp_epsilon=1e4, out=tmp_path / "a")
    second = fedxrisk.evaluate(runs / "codasca", bootstrap=0, dp_epsilon=1e4, out=tmp_path / "b")
    a, b = (r["federated"]["labels"]["score"]["private"] for r in (first, second))
    assert a["auroc"] != b["auroc"] and a["positives"] != b["positives"]
    pos, neg = first["overall"]["score"]["positives"], first["overall"]["score"]["negatives"]
    written = json.loads((tmp_path / "a" / "evaluation.json").read_text())
    seeds = {int(v) for v in _numbers(written) if v == int(v) and 0 <= v < 2**32}
    assert 0 in seeds  # the bootstrap seed is in the file
    cells = (2, DP_BINS + 1)
    for seed in seeds:
        for draws in (
            np.random.default_rng([seed, 32]).standard_normal(cells[0] * cells[1]),
            NoiseSource.reproducible(seed).standard_normal(cells[0] * cells[1]),
        ):
            noise = a["sigma"] * draws.reshape(cells)[:, :-1].sum(1)
            guess = (a["negatives"] - noise[0], a["positives"] - noise[1])
            assert not (abs(guess[0] - neg) < 1e-6 and abs(guess[1] - pos) < 1e-6), seed

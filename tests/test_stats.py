"""DeLong's variance (fast, from midranks) against its definition; the vectorized bootstrap against
scikit-learn-based metrics; reproducibility; the interval's coverage on binormal scores."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm, rankdata
from sklearn.metrics import roc_auc_score

from fedxrisk.metrics import average_precision, partial_auroc
from fedxrisk.stats import bootstrap_intervals, delong, midranks, weighted_ap, weighted_partial_auroc
from fedxrisk.stats.bootstrap import class_streams, stratified_counts


def _brute_force_variance(pos: np.ndarray, neg: np.ndarray) -> tuple[float, float]:
    """AUROC and S10/m + S01/n from ψ(X_i, Y_j) over all m·n pairs (DeLong et al. 1988, eqs. 2-4)."""
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return psi.mean(), v10.var(ddof=1) / len(pos) + v01.var(ddof=1) / len(neg)


@pytest.mark.parametrize("case", range(12))
def test_fast_delong_variance_equals_structural_components_by_definition(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(6, 80))
    y = rng.random(n) < rng.uniform(0.2, 0.8)
    y[:2], y[2:4] = True, False  # at least two of each class
    levels = int(rng.integers(2, 12)) if case % 2 == 0 else 10**6  # even cases: many ties
    scores = rng.integers(0, levels, size=n).astype(float) + (y * rng.uniform(0, 3))
    if case % 3 == 0:
        scores = np.round(scores)  # ties across the classes too
    auc, variance = _brute_force_variance(scores[y], scores[~y])
    fast = delong(y, scores)
    assert fast.variance == pytest.approx(variance, rel=1e-12, abs=1e-15)
    assert fast.auroc == pytest.approx(auc, rel=1e-12)
    assert fast.auroc == pytest.approx(roc_auc_score(y, scores), rel=1e-12)


def test_midranks_are_average_ranks():
    x = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 1.0, -np.inf, np.inf])
    assert np.array_equal(midranks(x), rankdata(x, method="average"))


def test_delong_is_nan_without_both_classes():
    assert np.isnan(delong(np.ones(5), np.arange(5.0)).auroc)
    single = delong(np.array([1, 0, 0]), np.array([2.0, 1.0, 0.0]))  # one positive: no variance
    assert single.auroc == 1.0 and np.isnan(single.variance)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_metrics_equal_metrics_on_the_resampled_data(seed):
    rng = np.random.default_rng(seed)
    y = rng.random(70) < 0.3
    scores = rng.integers(0, 9, size=70) + y * 1.5  # ties within and across classes
    for counts in stratified_counts(y, 5, class_streams(seed)):
        idx = np.repeat(np.arange(70), counts)
        ys, ss = y[idx].astype(float), scores[idx]
        assert weighted_ap(y, scores, counts[None])[0] == pytest.approx(average_precision(ys, ss), abs=1e-12)
        for fpr in (0.1, 0.3, 1.0):
            got = weighted_partial_auroc(y, scores, counts[None], fpr)[0]
            assert got == pytest.approx(partial_auroc(ys, ss, fpr), abs=1e-12)


def test_bootstrap_keeps_class_counts_and_is_reproducible():
    rng = np.random.default_rng(3)
    y = rng.random(200) < 0.2
    scores = rng.normal(size=200) + y
    counts = stratified_counts(y, 7, class_streams(0))
    assert (counts[:, y].sum(1) == y.sum()).all() and (counts[:, ~y].sum(1) == (~y).sum()).all()
    metrics = {"ap": weighted_ap, "pauc": lambda y, s, c: weighted_partial_auroc(y, s, c, 0.3)}
    a = bootstrap_intervals(y, scores, metrics, 300, seed=5)
    b = bootstrap_intervals(y, scores, metrics, 300, seed=5, chunk=7)  # chunking does not matter
    c = bootstrap_intervals(y, scores, metrics, 300, seed=6)
    assert a == b and a != c
    assert a["ap"][0] < average_precision(y.astype(float), scores) < a["ap"][1]


def test_delong_interval_covers_true_auroc_at_nominal_rate():
    """Binormal scores: positives N(μ, 1), negatives N(0, 1), true AUROC Φ(μ/√2) = 0.8.

    400 seeded draws with m = 60, n = 90. If the true coverage were 0.95 the count of
    covering intervals is Binomial(400, 0.95): SD 4.4, so ±4 SD is [0.906, 0.994];
    DeLong's Wald interval is known to under-cover slightly at small sizes (the
    benchmark benchmarks/evaluation/delong_coverage.py measures it), hence the band [0.91, 0.99].
    A variance off by a factor 2 either way gives ≈ 0.83 or ≈ 0.99+ and fails.
    """
    mu = np.sqrt(2) * norm.ppf(0.8)
    rng = np.random.default_rng(2026)
    y = np.r_[np.ones(60, bool), np.zeros(90, bool)]
    covered = 0
    for _ in range(400):
        scores = np.r_[rng.normal(mu, 1, 60), rng.normal(0, 1, 90)]
        d = delong(y, scores)
        covered += d.low <= 0.8 <= d.high
    assert 0.91 <= covered / 400 <= 0.99

"""Metrics from summed per-class score histograms (issue 22 item 1) against the exact metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedxrisk.metrics import auroc, average_precision, partial_auroc
from fedxrisk.stats.histogram import (
    histogram_ap,
    histogram_auroc,
    histogram_bounds,
    histogram_pauc,
    logit_edges,
    score_histogram,
)


def _exact_auroc_integer(y: np.ndarray, s: np.ndarray) -> float:
    """Mann-Whitney AUROC counted pair by pair in integers, then one division."""
    pos, neg = s[y], s[~y]
    twice = int(2 * (pos[:, None] > neg[None, :]).sum() + (pos[:, None] == neg[None, :]).sum())
    return twice / (2 * len(pos) * len(neg))


def _realistic(kind: str, rng: np.random.Generator, n: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """Logits as trained models give them: imbalanced, overlapping, some far beyond ±8."""
    y = rng.random(n) < {"binormal": 0.1, "ce_saturated": 0.05, "auc_loss": 0.2, "rare": 0.01}[kind]
    if kind == "binormal":
        s = rng.normal(0, 1, n) + 1.5 * y
    elif kind == "ce_saturated":  # CE pushes negatives far down, positives spread widely
        s = np.where(y, rng.normal(1, 4, n), rng.normal(-9, 3, n))
    elif kind == "auc_loss":  # sigmoid-score objectives: logits in a narrow range, float32
        s = (rng.normal(0, 0.8, n) + 0.9 * y).astype(np.float32).astype(np.float64)
    else:
        s = rng.standard_t(3, n) + 2 * y
    return y, s


@pytest.mark.parametrize("kind", ["binormal", "ce_saturated", "auc_loss", "rare"])
def test_4096_bins_match_exact_metrics_within_bound_and_1e3(kind):
    y, s = _realistic(kind, np.random.default_rng(7))
    counts = score_histogram(s, y)
    bound = histogram_bounds(counts, 0.3)
    yf = y.astype(float)
    err_auc = abs(histogram_auroc(counts) - auroc(yf, s))
    err_ap = abs(histogram_ap(counts) - average_precision(yf, s))
    err_pauc = abs(histogram_pauc(counts, 0.3) - partial_auroc(yf, s, 0.3))
    assert err_auc <= bound["auroc"] + 1e-12 and err_auc <= 1e-3
    assert err_ap <= bound["ap"] + 1e-12
    assert err_pauc <= bound["pauc"] + 1e-12
    # the worst case itself: ≈ 1e-3 when logits crowd into a narrow range (auc_loss: 0.00101)
    assert bound["auroc"] <= 2e-3
    assert (
        err_ap <= 2e-3 and err_pauc <= 1e-3
    )  # AP is the least precise (≈ 1e-3, benchmarks/evaluation/histogram_error.py)


@pytest.mark.parametrize("seed", range(6))
def test_exact_when_every_distinct_score_has_its_own_bin(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    y = rng.random(n) < 0.3
    y[:2], y[2:4] = True, False
    s = rng.integers(-40, 40, n) / 4.0  # ties within and across classes, grid 0.25
    edges = np.arange(-10.125, 10.2, 0.25)  # one bin per grid value
    counts = score_histogram(s, y, edges=edges)
    assert histogram_auroc(counts) == _exact_auroc_integer(y, s)  # bit for bit
    yf = y.astype(float)
    assert histogram_ap(counts) == pytest.approx(average_precision(yf, s), abs=1e-12)
    for fpr in (0.1, 0.3, 1.0):
        assert histogram_pauc(counts, fpr) == pytest.approx(partial_auroc(yf, s, fpr), abs=1e-12)
    assert histogram_bounds(counts)["auroc"] == pytest.approx(
        ((s[y][:, None] == s[~y][None, :]).sum()) / (2 * y.sum() * (~y).sum())
    )  # the bound counts only the genuine ties here


def test_bounds_hold_on_coarse_bins_where_errors_are_large():
    rng = np.random.default_rng(3)
    for trial in range(20):
        y, s = _realistic(["binormal", "ce_saturated", "auc_loss", "rare"][trial % 4], rng, 2000)
        if y.sum() < 2:
            continue
        counts = score_histogram(s, y, bins=int(rng.integers(3, 40)), limit=float(rng.uniform(1, 10)))
        b, yf = histogram_bounds(counts, 0.2), y.astype(float)
        assert abs(histogram_auroc(counts) - auroc(yf, s)) <= b["auroc"] + 1e-12
        assert abs(histogram_ap(counts) - average_precision(yf, s)) <= b["ap"] + 1e-12
        assert abs(histogram_pauc(counts, 0.2) - partial_auroc(yf, s, 0.2)) <= b["pauc"] + 1e-12


def test_site_histograms_sum_to_the_pooled_histogram():
    y, s = _realistic("binormal", np.random.default_rng(1), 5000)
    sites = np.array_split(np.random.default_rng(2).permutation(5000), 4)
    summed = sum(score_histogram(s[i], y[i]) for i in sites)
    pooled = score_histogram(s, y)
    assert np.array_equal(summed, pooled) and summed.dtype == np.int64
    assert histogram_auroc(summed) == histogram_auroc(pooled)


def test_bins_layout_infinities_and_nan():
    assert len(logit_edges(4096)) == 4095 and logit_edges(6, 1.0).tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0]
    counts = score_histogram(
        np.array([-np.inf, -1.0, 0.0, 0.2, 99.0]), np.array([0, 0, 1, 1, 1]), bins=6, limit=1.0
    )
    assert counts.shape == (2, 7)
    assert counts[0].tolist() == [1, 1, 0, 0, 0, 0, 0] and counts[1].tolist() == [0, 0, 0, 2, 0, 1, 0]
    assert histogram_auroc(counts) == 1.0
    with_nan = score_histogram(np.array([0.0, np.nan, 1.0]), np.array([0, 1, 1]))
    assert with_nan[1, -1] == 1
    assert math.isnan(histogram_auroc(with_nan)) and math.isnan(histogram_ap(with_nan))
    one_class = score_histogram(np.arange(4.0), np.ones(4))
    assert math.isnan(histogram_auroc(one_class)) and math.isnan(histogram_bounds(one_class)["auroc"])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="3 scores but 2 labels"):
        score_histogram(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="labels must be 0/1"):
        score_histogram(np.zeros(2), np.array([0, 2]))
    with pytest.raises(ValueError, match="increasing"):
        score_histogram(np.zeros(2), np.zeros(2), edges=np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        histogram_auroc(np.zeros(5))
    with pytest.raises(ValueError, match="max_fpr"):
        histogram_pauc(score_histogram(np.arange(4.0), np.array([0, 1, 0, 1])), 0.0)

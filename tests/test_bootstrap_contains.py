"""Issue 25: every bootstrap interval contains the estimate it is printed with, degenerate cases included."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedxrisk.evaluation import label_metrics
from fedxrisk.stats import bootstrap_intervals, percentile_interval, weighted_ap, weighted_partial_auroc
from fedxrisk.stats.bootstrap import class_streams, stratified_counts

METRICS = {"ap": weighted_ap, "pauc30": lambda y, s, c: weighted_partial_auroc(y, s, c, 0.3)}


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    y40 = np.r_[np.ones(8, bool), np.zeros(32, bool)]
    return {
        "all tied": (y40, np.zeros(40)),
        "one positive": (np.r_[True, np.zeros(30, bool)], rng.normal(size=31)),
        "one positive on top": (np.r_[True, np.zeros(30, bool)], np.r_[5.0, rng.normal(size=30)]),
        "one negative": (np.r_[np.ones(30, bool), False], rng.normal(size=31)),
        "perfect separation": (y40, np.r_[rng.normal(5, 1, 8), rng.normal(0, 1, 32)]),
        "perfectly inverted": (y40, np.r_[rng.normal(-5, 1, 8), rng.normal(0, 1, 32)]),
        "tiny n": (np.array([True, False]), np.array([0.2, 0.7])),
        "tiny n tied": (np.array([True, True, False]), np.array([1.0, 0.0, 1.0])),
        "two tie levels": (y40, np.r_[np.ones(5), np.zeros(3), np.ones(4), np.zeros(28)]),
        "few positives": (np.r_[np.ones(3, bool), np.zeros(200, bool)], rng.normal(size=203)),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_every_interval_contains_its_estimate(name):
    y, scores = _cases()[name]
    boot = bootstrap_intervals(y, scores, METRICS, 400, seed=1)
    ones = np.ones((1, len(y)), dtype=np.int32)
    for key, fn in METRICS.items():
        est = fn(y, scores, ones)[0]
        lo, hi = boot[key]
        assert lo <= est <= hi, (key, est, lo, hi)
    # as `fedxrisk evaluate` prints them: scikit-learn point estimates beside the intervals
    row = label_metrics(y.astype(float), scores, 400, [1, 0, 0])
    assert row["ap_ci"][0] <= row["ap"] <= row["ap_ci"][1]
    assert row["pauc30_ci"][0] <= row["pauc30"] <= row["pauc30_ci"][1]
    if not math.isnan(row["auroc_ci"][0]):
        assert row["auroc_ci"][0] <= row["auroc"] <= row["auroc_ci"][1]


def test_plain_percentile_would_exclude_the_estimate_here():
    """The rule matters: positives ranked last, AP's resamples all lie above the estimate."""
    y, scores = _cases()["perfectly inverted"]
    values = weighted_ap(y, scores, stratified_counts(y, 400, class_streams(1)))
    est = weighted_ap(y, scores, np.ones((1, len(y)), dtype=np.int32))[0]
    lo, hi = np.percentile(values, [2.5, 97.5])
    widened = percentile_interval(values, est)
    assert est < lo and widened == (est, hi)


def test_percentile_interval_widens_only_when_needed():
    values = np.arange(101.0)
    assert percentile_interval(values, 50.0) == pytest.approx((2.5, 97.5))
    assert percentile_interval(values, 1.0) == pytest.approx((1.0, 97.5))
    assert percentile_interval(np.full(10, 0.3097), 0.3096) == (0.3096, 0.3097)


def test_given_estimates_are_the_ones_contained():
    y, scores = _cases()["perfectly inverted"]
    plain = bootstrap_intervals(y, scores, METRICS, 200, seed=4)
    shifted = plain["ap"][0] - 1e-9  # as if the printed value differed in its last digits
    given = bootstrap_intervals(y, scores, METRICS, 200, seed=4, estimates={"ap": shifted})
    assert given["ap"] == (shifted, plain["ap"][1]) and given["pauc30"] == plain["pauc30"]

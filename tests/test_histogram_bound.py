"""The binning error bound reported with every histogram metric (``val_*_bound``) holds on adversarial
scores: logits crowded into a few bins, ties across classes, everything in one bin, beyond ±16."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedxrisk.engines.validation import BOUND_KEYS, VAL_KEYS, histogram_validation, score_histograms
from fedxrisk.metrics import PAUC_FPRS, auroc, average_precision, partial_auroc


def _exact(y: np.ndarray, s: np.ndarray) -> dict[str, float]:
    out = {"val_auroc": auroc(y, s), "val_ap": average_precision(y, s)}
    return out | {f"val_{name}_norm": partial_auroc(y, s, fpr) for name, fpr in PAUC_FPRS.items()}


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    y = (rng.random(400) < 0.2).astype(float)
    width = 16 / 4094  # one inner bin is 2·16/4094 logits wide
    return {
        # a separable model whose logits all sit inside one bin: exact 1.0, histogram ½
        "one_bin_separable": (y, 0.1 + 1e-4 * width * (y + rng.random(400) * 0.5)),
        # the same inside the open end bin beyond +16
        "beyond_limit": (y, 30.0 + 5 * y + rng.random(400)),
        # inverted ranking inside one bin
        "one_bin_inverted": (y, 0.1 + 1e-4 * width * (1 - y)),
        # all scores tied, both classes
        "all_tied": (y, np.full(400, 0.25)),
        # ties across classes spread over three values
        "three_ties": (y, rng.integers(0, 3, 400).astype(float) + 0.5 * y * (rng.random(400) < 0.3)),
        # logits crowded within 0.05 (≈ 6 bins), informative
        "crowded": (y, 0.05 * rng.random(400) + 0.02 * y),
        # crowded near a bin edge, half of the positives just above it
        "edge": (y, np.where(y > 0, 0.0 + 1e-9 * rng.random(400), -1e-9 * rng.random(400))),
        # one positive, one negative, same bin, positive higher
        "two_samples": (np.array([0.0, 1.0]), np.array([0.001, 0.002])),
        # heavy tails with a few huge values on both sides
        "tails": (y, rng.standard_t(1, 400) + y),
    }


@pytest.mark.parametrize("case", sorted(_cases()))
def test_exact_metrics_lie_within_the_reported_bound(case):
    y, s = _cases()[case]
    hist = histogram_validation(score_histograms(y, s, 1))
    exact = _exact(y, s)
    for key, bound in zip(VAL_KEYS, BOUND_KEYS):
        assert hist[bound] >= 0
        assert abs(hist[key] - exact[key]) <= hist[bound] + 1e-12, (
            case,
            key,
            hist[key],
            exact[key],
            hist[bound],
        )


def test_the_auroc_bound_is_attained_when_every_pair_shares_a_bin():
    """Separable scores in one bin: exact AUROC 1, histogram ½, bound ½·Σ P_b N_b / (P N) = ½."""
    y, s = _cases()["one_bin_separable"]
    hist = histogram_validation(score_histograms(y, s, 1))
    assert hist["val_auroc"] == 0.5 and hist["val_auroc_bound"] == 0.5 and auroc(y, s) == 1.0


def test_bound_is_half_the_share_of_pairs_sharing_a_bin():
    y = np.array([0, 0, 1, 1, 0, 1], float)
    s = np.array([-20.0, 0.001, 0.002, 5.0, 5.001, 40.0])  # bins: {−20}, {0.001, 0.002}, {5, 5.001}, {40}
    counts = score_histograms(y, s, 1)
    shared = 1 * 1 + 1 * 1  # (0.001 neg, 0.002 pos) and (5.0 pos, 5.001 neg)
    assert histogram_validation(counts)["val_auroc_bound"] == pytest.approx(shared / (2 * 3 * 3), abs=0)


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_random_coarse_histograms_never_exceed_the_bound():
    """Many random draws with the fixed bins and scores on a coarse grid (many ties across classes)."""
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(200):
        n = int(rng.integers(2, 60))
        y = (rng.random(n) < rng.uniform(0.05, 0.95)).astype(float)
        if y.min() == y.max():
            y[0] = 1 - y[0]
        s = np.round(rng.normal(0, 0.02, n) + 0.01 * y, int(rng.integers(2, 6)))
        hist, exact = histogram_validation(score_histograms(y, s, 1)), _exact(y, s)
        for key, bound in zip(VAL_KEYS, BOUND_KEYS):
            assert abs(hist[key] - exact[key]) <= hist[bound] + 1e-12, (key, y.tolist(), s.tolist())
            worst = max(worst, abs(hist[key] - exact[key]))
    assert worst > 0.01  # the draws do produce real binning errors


def test_one_class_and_multi_label():
    one = histogram_validation(score_histograms(np.zeros(5), np.arange(5.0), 1))
    assert all(math.isnan(one[k]) for k in (*VAL_KEYS, *BOUND_KEYS))
    y = np.array([[0, 1], [1, 0], [0, 1], [1, 1]], float)
    s = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, 0.0], [2.0, 0.0]])  # label 1: all tied
    out = histogram_validation(score_histograms(y, s, 2))
    assert out["val_auroc"] == pytest.approx((1.0 + 0.5) / 2)
    assert out["val_auroc_bound"] == pytest.approx((0.0 + 0.5) / 2)

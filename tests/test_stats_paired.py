"""Paired comparisons of two models on one test set: DeLong's test against its definition written
pair by pair, and the paired bootstrap for AP and pAUC differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from fedxrisk.metrics import average_precision, partial_auroc
from fedxrisk.stats import (
    compare_models,
    delong,
    delong_paired,
    paired_bootstrap,
    weighted_ap,
    weighted_partial_auroc,
)


def _brute_force_paired(y: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> dict[str, float]:
    """DeLong, DeLong & Clarke-Pearson (1988) eqs. (2)-(5) with explicit loops over all m·n pairs."""
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    m, n = len(pos), len(neg)

    def psi(a: float, b: float) -> float:
        return 1.0 if a > b else 0.5 if a == b else 0.0

    v10 = [[sum(psi(s[i], s[j]) for j in neg) / n for i in pos] for s in (s1, s2)]
    v01 = [[sum(psi(s[i], s[j]) for i in pos) / m for j in neg] for s in (s1, s2)]
    theta = [sum(v) / m for v in v10]

    def cov(a: list[float], b: list[float], ta: float, tb: float) -> float:
        return sum((x - ta) * (z - tb) for x, z in zip(a, b)) / (len(a) - 1)

    s = [[cov(v10[r], v10[c], theta[r], theta[c]) / m + cov(v01[r], v01[c], theta[r], theta[c]) / n
          for c in range(2)] for r in range(2)]  # fmt: skip
    var = s[0][0] + s[1][1] - 2 * s[0][1]
    z = (theta[0] - theta[1]) / math.sqrt(var)
    return {"auroc1": theta[0], "auroc2": theta[1], "var": var, "z": z, "p": 2 * norm.sf(abs(z))}


def _case(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random test set with ties within and across classes; model 2 correlated with model 1."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 90))
    y = rng.random(n) < rng.uniform(0.15, 0.7)
    y[:2], y[2:4] = True, False
    levels = int(rng.integers(3, 15))
    s1 = rng.integers(0, levels, size=n) + y * rng.uniform(0.5, 3)
    s2 = np.round(0.6 * s1 + rng.normal(0, 1.5, n))  # integer-valued: many ties
    if seed % 2:
        s1 = np.round(s1)
    return y, s1, s2


@pytest.mark.parametrize("seed", range(12))
def test_paired_delong_equals_its_definition_pair_by_pair(seed):
    y, s1, s2 = _case(seed)
    want = _brute_force_paired(y, s1, s2)
    got = delong_paired(y, s1, s2)
    assert abs(got.auroc1 - want["auroc1"]) < 1e-10 and abs(got.auroc2 - want["auroc2"]) < 1e-10
    assert abs(got.difference - (want["auroc1"] - want["auroc2"])) < 1e-10
    assert abs(got.se**2 - want["var"]) < 1e-10
    assert abs(got.z - want["z"]) < 1e-10 * max(1.0, abs(want["z"]))
    assert abs(got.p_value - want["p"]) < 1e-10
    half = norm.ppf(0.975) * math.sqrt(want["var"])
    assert abs(got.low - (got.difference - half)) < 1e-10 and abs(got.high - (got.difference + half)) < 1e-10
    # each model alone: the single-curve DeLong (already checked against pROC's var())
    assert got.auroc1 == pytest.approx(delong(y, s1).auroc, abs=1e-15)
    assert got.se**2 == pytest.approx(delong(y, s1).variance + delong(y, s2).variance
                                      - 2 * got.correlation * delong(y, s1).se * delong(y, s2).se, abs=1e-14)  # fmt: skip


# pROC's worked example (roc.test on its aSAH data) is checked by benchmarks/evaluation/proc_check.py, which reads
# the data from R itself: the data ship with pROC under the GPL, so they are not copied into this repository.


def test_identical_models_give_zero_difference_and_p_one():
    y, s1, _ = _case(3)
    t = delong_paired(y, s1, s1.copy())
    assert (t.difference, t.se, t.z, t.p_value, t.low, t.high) == (0.0, 0.0, 0.0, 1.0, 0.0, 0.0)


def test_paired_delong_degenerate_inputs():
    y = np.array([1, 1, 0, 0, 0], bool)
    perfect, constant = np.array([5.0, 4, 3, 2, 1]), np.zeros(5)
    t = delong_paired(y, perfect, constant)  # both variances 0, difference 0.5
    assert t.difference == 0.5 and t.z == math.inf and t.p_value == 0.0
    assert math.isnan(delong_paired(np.ones(5, bool), perfect, constant).auroc1)
    one_pos = delong_paired(np.array([1, 0, 0], bool), np.array([2.0, 1, 0]), np.zeros(3))
    assert one_pos.difference == 0.5 and math.isnan(one_pos.p_value)
    with pytest.raises(ValueError, match="one shape"):
        delong_paired(y, perfect, constant[:4])


def _metrics():
    return {"ap": weighted_ap, "pauc30": lambda y, s, c: weighted_partial_auroc(y, s, c, 0.3)}


def test_paired_bootstrap_identical_models_difference_zero_p_one():
    y, s1, _ = _case(5)
    out = paired_bootstrap(y, s1, s1.copy(), _metrics(), 500, seed=0)
    for r in out.values():
        assert (r.difference, r.low, r.high, r.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_paired_bootstrap_clearly_better_model_has_small_p_and_ci_holds_estimate():
    rng = np.random.default_rng(11)
    y = rng.random(400) < 0.2
    good, poor = rng.normal(size=400) + 2.0 * y, rng.normal(size=400) + 0.3 * y
    out = paired_bootstrap(y, good, poor, _metrics(), 1000, seed=1)
    yf = y.astype(float)
    assert out["ap"].estimate1 == pytest.approx(average_precision(yf, good), abs=1e-12)
    assert out["pauc30"].estimate2 == pytest.approx(partial_auroc(yf, poor, 0.3), abs=1e-12)
    for r in out.values():
        assert r.difference == pytest.approx(r.estimate1 - r.estimate2, abs=0)
        assert r.p_value == pytest.approx(2 / 1001) and r.low <= r.difference <= r.high and r.low > 0


def test_paired_bootstrap_null_p_is_not_small_and_is_reproducible():
    rng = np.random.default_rng(12)
    y = rng.random(300) < 0.3
    base = rng.normal(size=300) + y
    a, b = base + rng.normal(0, 0.5, 300), base + rng.normal(0, 0.5, 300)  # exchangeable models
    out = paired_bootstrap(y, a, b, _metrics(), 1000, seed=2)
    again = paired_bootstrap(y, a, b, _metrics(), 1000, seed=2, chunk=37)
    assert out == again
    assert out["ap"].p_value > 0.05 and out["ap"].low < 0 < out["ap"].high
    swapped = paired_bootstrap(y, b, a, _metrics(), 1000, seed=2)  # same resamples: mirrored
    assert swapped["ap"].difference == -out["ap"].difference
    assert swapped["ap"].p_value == out["ap"].p_value


def test_compare_models_bundles_the_paired_tests():
    y, s1, s2 = _case(4)
    out = compare_models(y, s1, s2, resamples=300, seed=3, max_fpr=0.2)
    assert out["auroc"]["z"] == delong_paired(y, s1, s2).z
    want = paired_bootstrap(y, s1, s2, {"pauc": lambda y, s, c: weighted_partial_auroc(y, s, c, 0.2)}, 300, 3)
    assert out["pauc"]["p_value"] == want["pauc"].p_value and out["pauc"]["low"] == want["pauc"].low
    assert out["ap"]["difference"] == pytest.approx(
        average_precision(y.astype(float), s1) - average_precision(y.astype(float), s2), abs=1e-12
    )
    with pytest.raises(ValueError, match="max_fpr"):
        compare_models(y, s1, s2, max_fpr=0.0)

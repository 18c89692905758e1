"""Differentially private federated AUROC (fedxrisk.stats.dp_eval): σ from the accountant, the
noise is what it says, the estimate is unbiased, the interval covers, and a too-noisy release is
refused naming by what factor the network must grow (no count of patients)."""

from __future__ import annotations

import numpy as np
import pytest

from fedxrisk.engines.privacy.accountant import epsilon
from fedxrisk.stats import delong, logit_edges
from fedxrisk.stats.dp_eval import DP_BINS, DP_LIMIT, DPTooNoisy, dp_auroc, noise_sigma, privatize
from fedxrisk.stats.federated import federated_delong, histogram_moments, simulate

pytest.importorskip("dp_accounting")


def _pooled(n: int, seed: int = 0, bins: int = DP_BINS):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.4
    s = rng.normal(size=n) + 1.2 * y
    totals, _ = simulate(
        [(y[: n // 2], [s[: n // 2]]), (y[n // 2 :], [s[n // 2 :]])], logit_edges(bins, DP_LIMIT)
    )
    return y, s, totals[0]


def test_sigma_reaches_the_target_epsilon_and_no_less_noise_would():
    sigma = noise_sigma(2.0, 1e-5)
    assert epsilon(sigma, 1, 1e-5) <= 2.0 < epsilon(0.97 * sigma, 1, 1e-5)


def test_the_released_noise_has_the_stated_spread_and_no_nan_column():
    _, _, total = _pooled(2000)
    noisy = privatize(total, 3.0, np.random.default_rng(1))
    residual = (noisy - total)[:, :-1]
    assert residual.std() == pytest.approx(3.0, rel=0.1) and noisy[:, -1].tolist() == [0.0, 0.0]
    total[1, -1] = 1
    with pytest.raises(ValueError, match="NaN"):
        privatize(total, 3.0, np.random.default_rng(1))


def test_without_noise_it_is_the_federated_delong():
    _, _, total = _pooled(3000)
    r = dp_auroc(total.astype(float), 1e-9, 1e6, 1e-5, draws=5)
    f = federated_delong(total[None], histogram_moments(total[None]))
    assert r.auroc == pytest.approx(f.auroc, abs=1e-9) and r.se == pytest.approx(f.se, abs=1e-9)
    assert r.noise_se < 1e-6


def test_the_private_interval_covers_the_exact_auroc():
    """Large network, ε = 8, 32 bins: over 60 releases the interval holds the binned AUROC ≥ 90 % of
    the time and the estimate is unbiased (mean within 2 standard errors)."""
    y, s, total = _pooled(40000, bins=32)
    exact = federated_delong(total[None], histogram_moments(total[None])).auroc
    sigma, rng = noise_sigma(8.0, 1e-5), np.random.default_rng(2)
    results = [dp_auroc(privatize(total, sigma, rng), sigma, 8.0, 1e-5, draws=30, seed=i) for i in range(60)]
    hits = np.mean([r.low <= exact <= r.high for r in results])
    estimates = np.array([r.auroc for r in results])
    assert hits >= 0.9
    assert abs(estimates.mean() - exact) < 2 * estimates.std() / np.sqrt(len(estimates)) + 1e-4
    bound = federated_delong(total[None], histogram_moments(total[None])).auroc_bound
    assert abs(exact - delong(y, s).auroc) <= bound  # the binning error comes on top, within its bound


def test_a_small_network_is_refused_naming_the_size_it_needs():
    _, _, total = _pooled(3000)
    sigma = noise_sigma(1.0, 1e-5)
    with pytest.raises(DPTooNoisy, match=r"about [\d.]+× more patients, a larger ε") as refused:
        dp_auroc(privatize(total, sigma, np.random.default_rng(3)), sigma, 1.0, 1e-5, draws=50)
    assert not _counts_in(str(refused.value), 3000)  # the message names no count of patients (issue 40)


def _counts_in(message: str, n: int) -> list[float]:
    """The numbers in ``message`` an attacker could read as the count ``n`` (within a factor 2)."""
    import re

    return [v for v in map(float, re.findall(r"\d+(?:\.\d+)?", message)) if n / 2 <= v <= 2 * n]

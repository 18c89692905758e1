"""Differentially private federated AUROC: Gaussian noise on the one released sum (optional).

For one model every federated number is a function of the pooled per-class histogram
(:func:`fedxrisk.stats.federated.histogram_moments`), so one release suffices. Neighbouring
data sets differ by one patient (add or remove), who changes one cell of the histogram by 1:
L2 sensitivity 1. The Gaussian mechanism adds N(0, σ²) to every cell (on Flower each site would
add its share N(0, σ²/K) before the secure sum); σ is the smallest noise multiplier whose ε(δ)
for one release is ≤ the target, from the RDP accountant the training uses
(:func:`fedxrisk.engines.privacy.accountant.noise_for_epsilon`). Everything after is
post-processing: the binned DeLong estimates from the noisy counts as released (a negative cell
is kept: the AUROC's numerator is bilinear in the two classes' independent noises, so unbiased).

The noise is an extra error DeLong's variance does not know. A parametric bootstrap re-noises
the released histogram (``draws`` times) and takes the AUROC's standard deviation ``noise_se``;
the reported interval uses √(SE² + noise_se²). When noise_se exceeds the DeLong SE the interval
would mostly measure the noise: :func:`dp_auroc` refuses, naming by what factor the network
must grow (SE shrinks like 1/√n, the noise's effect like 1/n, so the factor is (noise_se/SE)²)
but no count of patients. The release's noise comes from the secret
:class:`~fedxrisk.engines.privacy.noise.NoiseSource` (:func:`release`), never from a seed. Coarse bins (default 128 over ±16 logits) keep the summed noise small; their
binning bound is reported as without DP. Not covered: the paired test (it needs the joint bins
of one patient under two models), per-site releases, NaN scores (refused).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedxrisk.stats.delong import wald_interval
from fedxrisk.stats.federated import _covariance, histogram_moments
from fedxrisk.stats.histogram import histogram_bounds

DP_BINS = 128
DP_LIMIT = 16.0


class DPTooNoisy(ValueError):
    """The noise would dominate the interval; the message says how many patients are needed."""


def noise_sigma(epsilon: float, delta: float) -> float:
    """σ of the Gaussian mechanism (sensitivity 1, one release) reaching (ε, δ) under the RDP accountant."""
    from fedxrisk.engines.privacy.accountant import noise_for_epsilon

    return noise_for_epsilon(epsilon, 1, delta)


def privatize(total: np.ndarray, sigma: float, source: Any) -> np.ndarray:
    """``[2, B + 1]`` pooled counts + σ·N(0, 1) per cell (the NaN column is not released: 0).

    ``source`` draws the normals (``standard_normal(count)``): the release itself takes the secret
    :class:`~fedxrisk.engines.privacy.noise.NoiseSource` (:func:`release`); a seeded NumPy generator
    only re-noises an already released histogram (the bootstrap: post-processing)."""
    total = np.asarray(total, dtype=np.float64)
    if total[:, -1].any():
        raise ValueError("a NaN score: the private evaluation releases no NaN column")
    noisy = total + sigma * np.asarray(source.standard_normal(total.size), dtype=np.float64).reshape(
        total.shape
    )
    noisy[:, -1] = 0.0
    return noisy


def release(total: np.ndarray, sigma: float, source: Any = None) -> np.ndarray:
    """The Gaussian mechanism on the pooled histogram, its noise from ``source`` (default: a fresh
    :meth:`NoiseSource.secret`, so nothing the evaluation writes regenerates it)."""
    from fedxrisk.engines.privacy.noise import NoiseSource

    return privatize(total, sigma, NoiseSource.secret() if source is None else source)


@dataclass(frozen=True)
class PrivateAUROC:
    """AUROC [CI] from the noisy pooled histogram; ``se`` DeLong's, ``noise_se`` the noise's."""

    auroc: float
    se: float
    noise_se: float
    low: float
    high: float
    epsilon: float
    delta: float
    sigma: float
    auroc_bound: float  # the binning bound of the clipped noisy counts (approximate)
    positives: float  # noisy pooled class counts (released)
    negatives: float
    level: float = 0.95


def _auroc(hist: np.ndarray) -> tuple[float, float]:
    """AUROC and DeLong SE from noisy counts as released (negative cells kept: the AUROC's
    numerator is bilinear in the two classes' counts, whose noises are independent, so it stays
    unbiased; clipping at 0 would pull the AUROC towards ½)."""
    t = hist[None]
    if not (t[0, 0, :-1].sum() >= 2 and t[0, 1, :-1].sum() >= 2):
        return math.nan, math.nan
    auc, cov = _covariance(t, histogram_moments(t))
    return float(auc[0]), math.sqrt(max(float(cov[0, 0]), 0.0))


def dp_auroc(
    noisy: np.ndarray, sigma: float, epsilon: float, delta: float, draws: int = 200, seed: int = 0,
    level: float = 0.95,
) -> PrivateAUROC:  # fmt: skip
    """Post-process a released noisy ``[2, B + 1]`` histogram; :class:`DPTooNoisy` when noise_se > SE."""
    hist = np.asarray(noisy, dtype=np.float64)
    auc, se = _auroc(hist)
    if math.isnan(auc) or math.isnan(se):
        raise DPTooNoisy(
            f"the noisy histogram leaves no usable class (σ = {sigma:.3g} per bin at ε = {epsilon:g})"
        )
    rng = np.random.default_rng(seed)
    again = [_auroc(privatize(hist, sigma, rng))[0] for _ in range(draws)]  # re-noised: the noise's spread
    noise_se = float(np.nanstd(again))
    if se == 0:  # the messages name no count of patients (issue 40): only ratios of released numbers
        raise DPTooNoisy(
            f"at ε = {epsilon:g} (σ = {sigma:.3g} per bin, {hist.shape[1] - 1} bins) the noise swamps the "
            f"histogram (noise moves the AUROC by ±{noise_se:.3f}); a larger ε or fewer bins"
        )
    if noise_se > se:
        factor = (noise_se / se) ** 2
        raise DPTooNoisy(
            f"at ε = {epsilon:g} (σ = {sigma:.3g} per bin, {hist.shape[1] - 1} bins) the noise moves the AUROC by "
            f"±{noise_se:.3f}, more than its DeLong SE {se:.3f}: the interval would be meaningless; "
            f"about {factor:.1f}× more patients, a larger ε or fewer bins"
        )
    total_var = se**2 + noise_se**2
    low, high = wald_interval(auc, total_var, level)
    pos, neg = float(hist[1, :-1].sum()), float(hist[0, :-1].sum())
    bound = histogram_bounds(np.clip(hist, 0.0, None))["auroc"]  # of the clipped counts: approximate
    return PrivateAUROC(auc, se, noise_se, low, high, epsilon, delta, sigma, bound, pos, neg, level)

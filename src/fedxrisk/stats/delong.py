"""DeLong's variance of the empirical AUROC, computed fast from midranks.

DeLong, DeLong & Clarke-Pearson (Biometrics 1988) write the Mann-Whitney AUROC
of m positive scores X and n negative scores Y through *structural components*

    V10(X_i) = (1/n) Σ_j ψ(X_i, Y_j),   V01(Y_j) = (1/m) Σ_i ψ(X_i, Y_j),
    ψ(x, y) = 1 if x > y, 1/2 if x = y, 0 otherwise,

so that AUROC = mean V10 = mean V01 and Var(AUROC) ≈ S10/m + S01/n with S10, S01
the sample variances (divisor m−1, n−1) of the components. Sun & Xu (IEEE SPL
2014, "Fast implementation of DeLong's algorithm") obtain all components in
O((m+n) log(m+n)) from midranks: with T_Z the midranks in the pooled sample,
T_X within the positives and T_Y within the negatives,

    V10_i = (T_Z(X_i) − T_X(X_i)) / n,   V01_j = 1 − (T_Z(Y_j) − T_Y(Y_j)) / m.

(A positive's pooled midrank minus its rank among positives counts the negatives
below it, ties counting one half.)

Two models scored on the same test set (paired): DeLong et al.'s eq. (5) give the
covariance of their AUROCs as S10_{12}/m + S01_{12}/n with S10_{12}, S01_{12} the
sample covariances of the two models' components, so the difference θ1 − θ2 has
variance Var1 + Var2 − 2·Cov12, and z = (θ1 − θ2)/SE is compared with N(0, 1).
This is the test R's pROC runs as ``roc.test(r1, r2, method = "delong", paired = TRUE)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` with tied values sharing the mean of their ranks (Sun & Xu, Alg. 1)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])  # first index of each tie group
    ends = np.r_[starts[1:], len(x)]  # one past the last
    group_rank = (starts + 1 + ends) / 2.0  # mean of ranks start+1 … end
    out = np.empty(len(x))
    out[order] = np.repeat(group_rank, ends - starts)
    return out


def structural_components(positives: np.ndarray, negatives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(V10 over positives, V01 over negatives) from midranks, as in the module docstring."""
    m, n = len(positives), len(negatives)
    pooled = midranks(np.concatenate([positives, negatives]))
    v10 = (pooled[:m] - midranks(positives)) / n
    v01 = 1.0 - (pooled[m:] - midranks(negatives)) / m
    return v10, v01


@dataclass(frozen=True)
class DeLong:
    """Empirical AUROC, its DeLong variance, and the Wald interval at ``level`` (clipped to [0, 1])."""

    auroc: float
    variance: float
    low: float
    high: float
    level: float = 0.95

    @property
    def se(self) -> float:
        return math.sqrt(self.variance) if not math.isnan(self.variance) else math.nan


def delong(y: np.ndarray, scores: np.ndarray, level: float = 0.95) -> DeLong:
    """AUROC of ``scores`` against binary ``y`` with DeLong's variance and a ``level`` interval.

    NaN everywhere when a class is missing; the variance needs ≥ 2 of each class.
    """
    y = np.asarray(y).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    m, n = int(y.sum()), int((~y).sum())
    if m == 0 or n == 0 or np.isnan(scores).any():
        return DeLong(math.nan, math.nan, math.nan, math.nan, level)
    v10, v01 = structural_components(scores[y], scores[~y])
    auc = float(v10.mean())
    if m < 2 or n < 2:
        return DeLong(auc, math.nan, math.nan, math.nan, level)
    variance = float(v10.var(ddof=1) / m + v01.var(ddof=1) / n)
    return DeLong(auc, variance, *wald_interval(auc, variance, level), level)


def wald_interval(auroc: float, variance: float, level: float = 0.95) -> tuple[float, float]:
    """auroc ± z_{(1+level)/2}·√variance, clipped to [0, 1]."""
    from scipy.stats import norm  # on first use: scipy.stats is slow to import

    if math.isnan(variance) or math.isnan(auroc):
        return math.nan, math.nan
    half = float(norm.ppf(0.5 + level / 2)) * math.sqrt(variance)
    return max(0.0, auroc - half), min(1.0, auroc + half)


@dataclass(frozen=True)
class PairedDeLong:
    """DeLong's test of θ1 = θ2 for two AUROCs on the same samples; ``difference`` = θ1 − θ2.

    ``low``/``high``: the Wald interval of the difference at ``level`` (not clipped).
    Identical models (zero variance, zero difference): z = 0, p = 1; a nonzero difference
    with zero variance: z = ±inf, p = 0.
    """

    auroc1: float
    auroc2: float
    difference: float
    se: float
    z: float
    p_value: float
    low: float
    high: float
    correlation: float
    level: float = 0.95


def delong_paired(
    y: np.ndarray, scores1: np.ndarray, scores2: np.ndarray, level: float = 0.95
) -> PairedDeLong:
    """Paired DeLong test of two models' AUROCs on the same binary ``y`` (two-sided).

    NaN fields when a class has fewer than 2 samples or a score is NaN (AUROCs kept when defined).
    """
    from scipy.stats import norm  # on first use: scipy.stats is slow to import

    y = np.asarray(y).astype(bool)
    s1, s2 = np.asarray(scores1, dtype=np.float64), np.asarray(scores2, dtype=np.float64)
    if s1.shape != y.shape or s2.shape != y.shape:
        raise ValueError(f"labels {y.shape} and scores {s1.shape}, {s2.shape} must have one shape")
    m, n = int(y.sum()), int((~y).sum())
    nan = math.nan
    if m == 0 or n == 0 or np.isnan(s1).any() or np.isnan(s2).any():
        return PairedDeLong(nan, nan, nan, nan, nan, nan, nan, nan, nan, level)
    (a10, a01), (b10, b01) = structural_components(s1[y], s1[~y]), structural_components(s2[y], s2[~y])
    auc1, auc2 = float(a10.mean()), float(b10.mean())
    diff = auc1 - auc2
    if m < 2 or n < 2:
        return PairedDeLong(auc1, auc2, diff, nan, nan, nan, nan, nan, nan, level)
    s10, s01 = np.cov(np.vstack([a10, b10])), np.cov(np.vstack([a01, b01]))  # divisor m−1, n−1
    cov = s10 / m + s01 / n
    variance = max(float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]), 0.0)
    denom = math.sqrt(cov[0, 0] * cov[1, 1])
    corr = float(cov[0, 1] / denom) if denom > 0 else nan
    se = math.sqrt(variance)
    if se > 0:
        z = diff / se
    else:
        z = 0.0 if diff == 0 else math.copysign(math.inf, diff)
    p = float(2 * norm.sf(abs(z)))
    half = float(norm.ppf(0.5 + level / 2)) * se
    return PairedDeLong(auc1, auc2, diff, se, z, p, diff - half, diff + half, corr, level)

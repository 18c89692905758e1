"""Federated DeLong: the pooled AUROC, its variance and the paired test from two secure sums.

No site reveals a score. With the notation of :mod:`fedxrisk.stats.delong` (m = P positives,
n = N negatives over all sites, ψ(x, y) = 1, ½, 0 for x >, =, < y):

**Round 1** — every site counts its scores, per class, in the fixed bins of
:func:`~fedxrisk.stats.histogram.score_histogram`; a secure sum gives the pooled counts
p_k (positives) and n_k (negatives) of each bin k (one histogram per model).

**Round 2** — each site knows the pooled histogram, so it computes its own patients'
DeLong placement values (structural components, DeLong et al. 1988, eq. 2) against the
pooled opposite class, with every score replaced by its bin (a tie within a bin counts ½):

    V10(x ∈ bin k) = (Σ_{j<k} n_j + n_k/2) / N,    V01(y ∈ bin k) = (Σ_{j>k} p_j + p_k/2) / P,

and releases, through a second secure sum, only its shares of the pooled means
Σ V10/P, Σ V10²/P, Σ V01/N, Σ V01²/N and, for two models a, b on the same patients, the
cross-moments Σ V10ᵃV10ᵇ/P, Σ V01ᵃV01ᵇ/N (every share lies in [0, 1]). From the totals:

    AUROC = mean V10,   S10 = P/(P−1)·(mean V10² − AUROC²),   Var = S10/P + S01/N,

the covariance of two models likewise (DeLong's eq. 5), hence the paired test
z = (θa − θb)/SE(θa − θb). Every number equals the exact DeLong of the data with each
score replaced by its bin index: exact (to rounding) when no bin holds two *different*
scores, e.g. scores on bin centres.

**Binning bounds**, from the pooled histogram alone (the server can print them):

- AUROC: a pair sharing a bin moves from ψ ∈ {0, ½, 1} to ½, so |error| ≤ Σ_k p_k n_k/(2PN)
  (:func:`~fedxrisk.stats.histogram.histogram_bounds`).
- SE: the exact component of a positive in bin k differs from the binned one by at most
  e_k = n_k/(2N) (a negative's: p_k/(2P)); SE is a weighted Euclidean norm of the centred
  components, and centring does not lengthen a vector, so by the triangle inequality
  |SE − SE_bin| ≤ √(Σ_k p_k e_k²/(P(P−1)) + Σ_k n_k f_k²/(N(N−1))), f_k = p_k/(2P).
- Paired test: the difference's errors are bounded by the sum of the two models' bounds
  (triangle inequality again); z and p are bracketed by the worst cases of both.
- CI ends: |error| ≤ AUROC bound + z_{(1+level)/2}·SE bound.

For one model the moments are a function of the pooled histogram (:func:`histogram_moments`);
round 2 is needed for the paired test's cross-moments.

Per-site AUROC with its CI needs no federation: a site computes :func:`~fedxrisk.stats.delong`
on its own scores (exact) and releases it only if asked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedxrisk.stats.delong import wald_interval
from fedxrisk.stats.histogram import (
    histogram_ap,
    histogram_bounds,
    histogram_pauc,
    logit_edges,
    score_histogram,
)

# Evaluation bins: 65,536 over ±128 logits (0.0039 wide). Wider than validation's ±16: CE FedAvg's
# logits reach ±100, and beyond ±limit every score shares an end bin (a large AUROC bound); a one-off
# evaluation can afford the longer vector (2 × 65,537 counts per model).
EVAL_BINS = 2**16
EVAL_LIMIT = 128.0


def bin_index(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each score's bin (as :func:`~fedxrisk.stats.histogram.score_histogram` counts it); NaN → B."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    nan = np.isnan(scores)
    return np.where(nan, len(edges) + 1, np.searchsorted(edges, np.where(nan, 0.0, scores), side="right"))


def site_histograms(y: np.ndarray, scores: Sequence[np.ndarray], edges: np.ndarray) -> np.ndarray:
    """Round 1, one site: ``[M, 2, B + 1]`` int64 per-class counts of each of M models' scores."""
    return np.stack([score_histogram(s, y, edges=edges) for s in scores])


def _placements(total: np.ndarray, index: np.ndarray, positive: bool) -> np.ndarray:
    """Binned placement values of samples in bins ``index`` against the pooled ``total`` [2, B + 1]."""
    neg, pos = total[0, :-1].astype(np.float64), total[1, :-1].astype(np.float64)
    if positive:  # fraction of negatives below, ½ per tie in the bin
        table = (np.cumsum(neg) - neg + neg / 2) / neg.sum()
    else:  # fraction of positives above, ½ per tie in the bin
        table = (pos.sum() - np.cumsum(pos) + pos / 2) / pos.sum()
    return table[index]


def placement_shares(
    totals: np.ndarray, y: np.ndarray, scores: Sequence[np.ndarray], edges: np.ndarray
) -> np.ndarray:
    """Round 2, one site: its shares of the pooled moments, a float64 vector in [0, 1]
    (:func:`moments_layout`), from the pooled ``totals`` ``[M, 2, B + 1]`` of round 1.

    A site with no sample of a class adds zeros; with a NaN score anywhere (pooled NaN column)
    or a class missing everywhere, all shares are zero (the results are NaN)."""
    y = np.asarray(y).astype(bool).ravel()
    M = len(scores)
    out = np.zeros(2 * (M + M * M))
    if not _usable(totals):
        return out
    P, N = float(totals[0, 1, :-1].sum()), float(totals[0, 0, :-1].sum())
    blocks = []
    for cls, count in ((True, P), (False, N)):
        v = np.stack(
            [_placements(totals[a], bin_index(s, edges)[y == cls], cls) for a, s in enumerate(scores)]
        )
        blocks += [v.sum(axis=1) / count, (v @ v.T).ravel() / count]
    return np.concatenate(blocks)


def histogram_moments(totals: np.ndarray) -> np.ndarray:
    """The pooled moments of **one** model from its pooled histogram alone: a binned placement value
    depends only on its bin, so Σ V10 = Σ_k p_k·V10(k), Σ V10² = Σ_k p_k·V10(k)² (likewise V01).
    Round 2 is needed only for two models' cross-moments (the joint bins of one patient)."""
    totals = np.asarray(totals)
    if len(totals) != 1:
        raise ValueError(f"the moments follow from the histogram for one model, got {len(totals)}")
    if not _usable(totals):
        return np.zeros(4)
    t = totals[0]
    neg, pos = t[0, :-1].astype(np.float64), t[1, :-1].astype(np.float64)
    bins = np.arange(len(neg))
    v10, v01 = _placements(t, bins, True), _placements(t, bins, False)
    P, N = pos.sum(), neg.sum()
    return np.array([pos @ v10 / P, pos @ v10**2 / P, neg @ v01 / N, neg @ v01**2 / N])


def moments_layout(models: int) -> list[tuple[str, int]]:
    """The names and sizes of :func:`placement_shares`' blocks, in order."""
    return [("mean_v10", models), ("cross_v10", models**2), ("mean_v01", models), ("cross_v01", models**2)]


def _usable(totals: np.ndarray) -> bool:
    t = np.asarray(totals)
    return not t[:, :, -1].any() and bool(
        (t[:, 0, :-1].sum(axis=1) > 0).all() and (t[:, 1, :-1].sum(axis=1) > 0).all()
    )


def _split_moments(moments: np.ndarray, models: int) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for name, size in moments_layout(models):
        out[name] = np.asarray(moments[at : at + size], dtype=np.float64)
        at += size
    out["cross_v10"] = out["cross_v10"].reshape(models, models)
    out["cross_v01"] = out["cross_v01"].reshape(models, models)
    return out


def _covariance(totals: np.ndarray, moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(AUROCs [M], DeLong covariance [M, M] = S10/P + S01/N) from the pooled moments."""
    M = len(totals)
    mo = _split_moments(moments, M)
    P, N = float(totals[0, 1, :-1].sum()), float(totals[0, 0, :-1].sum())
    a10, a01 = mo["mean_v10"], mo["mean_v01"]
    if P < 2 or N < 2:
        return a10, np.full((M, M), math.nan)
    s10 = P / (P - 1) * (mo["cross_v10"] - np.outer(a10, a10))
    s01 = N / (N - 1) * (mo["cross_v01"] - np.outer(a01, a01))
    return a10, s10 / P + s01 / N


def se_bound(total: np.ndarray) -> float:
    """Worst-case binning error of DeLong's SE from the pooled ``[2, B + 1]`` histogram (module docstring)."""
    neg, pos = total[0, :-1].astype(np.float64), total[1, :-1].astype(np.float64)
    P, N = pos.sum(), neg.sum()
    if P < 2 or N < 2 or total[:, -1].any():
        return math.nan
    e, f = neg / (2 * N), pos / (2 * P)
    return math.sqrt(float(np.sum(pos * e**2)) / (P * (P - 1)) + float(np.sum(neg * f**2)) / (N * (N - 1)))


@dataclass(frozen=True)
class FederatedAUROC:
    """Pooled AUROC [DeLong ``level`` CI] from secure sums, with AP, pAUC and every binning bound."""

    auroc: float
    variance: float
    low: float
    high: float
    auroc_bound: float  # |exact AUROC − auroc| ≤ this
    se_bound: float  # |exact SE − se| ≤ this
    ci_bound: float  # each end of the exact CI lies within ± this of low/high
    ap: float
    ap_bound: float
    pauc: float
    pauc_bound: float
    max_fpr: float
    positives: int
    negatives: int
    level: float = 0.95

    @property
    def se(self) -> float:
        return math.sqrt(self.variance) if self.variance >= 0 else math.nan


def federated_delong(
    total: np.ndarray, moments: np.ndarray, model: int = 0, level: float = 0.95, max_fpr: float = 0.3
) -> FederatedAUROC:
    """Model ``model``'s pooled AUROC from the pooled histograms ``[M, 2, B + 1]`` and pooled moments."""
    from scipy.stats import norm  # on first use: scipy.stats is slow to import

    totals = np.asarray(total)
    t = totals[model]
    P, N = int(t[1, :-1].sum()), int(t[0, :-1].sum())
    bounds = histogram_bounds(t, max_fpr)
    ap, pauc = histogram_ap(t), histogram_pauc(t, max_fpr)
    nan = math.nan
    if not _usable(totals):
        return FederatedAUROC(
            nan, nan, nan, nan, nan, nan, nan, ap, bounds["ap"], pauc, bounds["pauc"], max_fpr, P, N, level
        )
    auc, cov = _covariance(totals, moments)
    a, var = (
        float(auc[model]),
        max(float(cov[model, model]), 0.0) if not math.isnan(cov[model, model]) else nan,
    )
    low, high = wald_interval(a, var, level)
    sb = se_bound(t)
    ci = bounds["auroc"] + float(norm.ppf(0.5 + level / 2)) * sb
    return FederatedAUROC(
        a,
        var,
        low,
        high,
        bounds["auroc"],
        sb,
        ci,
        ap,
        bounds["ap"],
        pauc,
        bounds["pauc"],
        max_fpr,
        P,
        N,
        level,
    )


@dataclass(frozen=True)
class FederatedPaired:
    """Paired DeLong test θa − θb from secure sums; ``p_low``/``p_high`` bracket the exact p-value."""

    auroc1: float
    auroc2: float
    difference: float
    se: float
    z: float
    p_value: float
    low: float
    high: float
    difference_bound: float
    se_bound: float
    p_low: float
    p_high: float
    level: float = 0.95


def federated_paired(total: np.ndarray, moments: np.ndarray, level: float = 0.95) -> FederatedPaired:
    """DeLong's paired test of models 0 and 1 (same patients) from pooled ``[2, 2, B + 1]`` histograms and moments."""
    from scipy.stats import norm  # on first use: scipy.stats is slow to import

    totals = np.asarray(total)
    if len(totals) != 2:
        raise ValueError(f"the paired test needs 2 models' histograms, got {len(totals)}")
    nan = math.nan
    if not _usable(totals):
        return FederatedPaired(*([nan] * 12), level)
    auc, cov = _covariance(totals, moments)
    diff = float(auc[0] - auc[1])
    db = histogram_bounds(totals[0])["auroc"] + histogram_bounds(totals[1])["auroc"]
    if math.isnan(cov[0, 0]):
        return FederatedPaired(float(auc[0]), float(auc[1]), diff, *([nan] * 5), db, *([nan] * 3), level)
    se = math.sqrt(max(float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]), 0.0))
    sb = se_bound(totals[0]) + se_bound(totals[1])
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    p = float(2 * norm.sf(abs(z)))
    half = float(norm.ppf(0.5 + level / 2)) * se
    z_small = max(abs(diff) - db, 0.0) / (se + sb) if se + sb > 0 else 0.0
    z_big = (abs(diff) + db) / (se - sb) if se > sb else math.inf
    p_low, p_high = float(2 * norm.sf(z_big)), float(2 * norm.sf(z_small))
    return FederatedPaired(
        float(auc[0]), float(auc[1]), diff, se, z, p, diff - half, diff + half, db, sb, p_low, p_high, level
    )


def simulate(
    sites: Sequence[tuple[np.ndarray, Sequence[np.ndarray]]], edges: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Both rounds in one process: ``sites`` = (labels, [scores of each model]) per site →
    (pooled histograms ``[M, 2, B + 1]``, pooled moments), the two sums a secure aggregator releases."""
    edges = logit_edges(EVAL_BINS, EVAL_LIMIT) if edges is None else np.asarray(edges, dtype=np.float64)
    totals = sum(site_histograms(y, s, edges) for y, s in sites)
    moments = sum(placement_shares(totals, y, s, edges) for y, s in sites)
    return np.asarray(totals), np.asarray(moments)

"""Harrell's concordance index (C-index) of risk scores for censored survival times, and its variance.

A pair (i, j) is *comparable* when i is seen to fail first: i had an event
(E_i = 1) and T_i < T_j, or T_i = T_j with j censored (E_j = 0) — an event at
time t precedes a censoring at t. Two events at the same time, and pairs whose
earlier time is censored, are not comparable. A comparable pair is *concordant*
when the risk score says so, η_i > η_j, and counts ½ when η_i = η_j:

    C = Σ_{i,j} M_ij · ψ(η_i, η_j) / Σ_{i,j} M_ij,   ψ(a, b) = 1[a > b] + ½·1[a = b],

with M_ij = 1 when (i, j) is comparable (Harrell, Lee & Mark, Stat. Med. 1996).
This is ``lifelines.utils.concordance_index(T, -η, E)`` (lifelines takes predicted
survival times, so a risk score enters negated).

Variance: C is a ratio of two U-statistics, A/B, over the pairs of subjects. With
the per-subject sums ψ_k = Σ_j (K_kj + K_jk) and π_k = Σ_j (M_kj + M_jk) (K = M·ψ)
the first-order (Hoeffding) projection and the delta method give

    Var(C) ≈ n/(n − 1) · Σ_k (ψ_k − C·π_k)² / B²,

the U-statistic variance that Noether (1967) and Pencina & D'Agostino (Stat. Med.
2004) derive for the C-index; for uncensored data without ties it is DeLong's
variance of the AUROC-like statistic. The Wald interval at ``level`` is clipped to [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _survival_arrays(times, events, scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = np.asarray(times, dtype=np.float64).ravel()
    e = np.asarray(events).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if not (len(t) == len(e) == len(s)):
        raise ValueError(f"times, events and scores differ in length ({len(t)}, {len(e)}, {len(s)})")
    if not np.isin(e, (0, 1)).all():
        raise ValueError("events must be 0 (censored) or 1 (event observed)")
    if not (np.isfinite(t).all() and np.isfinite(s).all()):
        raise ValueError("times and scores must be finite")
    return t, e.astype(bool), s


def comparable_pairs(times, events) -> np.ndarray:
    """``M[i, j]`` = 1 when subject i is seen to fail before subject j (the module's rule)."""
    t, e, _ = _survival_arrays(times, events, np.zeros(len(np.asarray(times).ravel())))
    earlier = t[:, None] < t[None, :]
    same_time_censored_j = (t[:, None] == t[None, :]) & ~e[None, :]
    return (e[:, None] & (earlier | same_time_censored_j)).astype(np.float64)


@dataclass(frozen=True)
class Concordance:
    """Harrell's C, its U-statistic variance, the Wald interval, and the pair counts."""

    c_index: float
    variance: float
    low: float
    high: float
    comparable: int  # comparable pairs
    concordant: float  # concordant pairs, ties counting ½

    @property
    def se(self) -> float:
        return math.sqrt(max(self.variance, 0.0))


def concordance(times, events, scores, level: float = 0.95) -> Concordance:
    """Harrell's C-index of risk ``scores`` (higher = earlier failure) with its variance and CI.

    O(n²) memory and time (n = a few thousand subjects is fine). Raises ValueError
    when no pair is comparable (no events, or only simultaneous events).
    """
    from scipy.stats import norm  # on first use: scipy.stats is slow to import

    t, e, s = _survival_arrays(times, events, scores)
    m = comparable_pairs(t, e)
    b = m.sum()
    if b == 0:
        raise ValueError("no comparable pair: the C-index needs an event before another subject's time")
    k = m * ((s[:, None] > s[None, :]) + 0.5 * (s[:, None] == s[None, :]))
    a = k.sum()
    c = a / b
    n = len(t)
    psi = k.sum(1) + k.sum(0)
    pi = m.sum(1) + m.sum(0)
    variance = n / (n - 1) * float(((psi - c * pi) ** 2).sum()) / b**2 if n > 1 else math.nan
    half = norm.ppf(0.5 + level / 2) * math.sqrt(max(variance, 0.0))
    return Concordance(float(c), variance, max(0.0, c - half), min(1.0, c + half), int(b), float(a))


def c_index(times, events, scores) -> float:
    """Harrell's C-index alone (see :func:`concordance`)."""
    return concordance(times, events, scores).c_index


def per_site_concordance(times, events, scores, sites, level: float = 0.95) -> dict[int, Concordance | None]:
    """{site id: its own C-index with CI}, None for a site without a comparable pair."""
    t, e, s = _survival_arrays(times, events, scores)
    sites = np.asarray(sites).ravel()
    out: dict[int, Concordance | None] = {}
    for site in np.unique(sites):
        mask = sites == site
        try:
            out[int(site)] = concordance(t[mask], e[mask], s[mask], level)
        except ValueError:
            out[int(site)] = None
    return out

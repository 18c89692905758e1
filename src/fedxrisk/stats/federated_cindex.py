"""A federated Harrell's C-index: no site reveals a patient's risk score or time, only binned counts.

Two secure sums, as the federated AUROC of :mod:`fedxrisk.stats.federated`:

1. every site sends its ``[time bins, score bins]`` count histogram of all its patients on public
   edges (time: ``time_bins`` equal bins over [0, the largest time]; the largest time is one
   secure maximum; score: the logit bins of :func:`fedxrisk.stats.histogram.logit_edges`); the sum
   H is published;
2. every site computes from H, for each of its own events i (time bin a, score bin b), the
   patients surely comparable with i — those in a later time bin, L_i = Σ_{a' > a} H[a', ·] — and
   among them the concordant ones, C_i = Σ_{a' > a} (Σ_{b' < b} H[a', b'] + ½ H[a', b]); it sends
   the sums of C_i and L_i and of the two ambiguous counts: pairs with the same score bin among
   the sure ones (U1, counted ½ in C_i), and patients in i's own time bin (U2, left out: their
   comparability needs the exact times).

C_fed = ΣC / ΣL. The exact C (pooled scores) lies within [(ΣC − U1/2)/(ΣL + U2),
(ΣC + U1/2 + U2)/(ΣL + U2)]: ``bound`` is the larger distance from C_fed to these ends (0 when no
two patients share a time bin or a comparable pair a score bin).

Disclosure: H, the pooled count of patients per (time bin, score bin) — the multiset of every
patient's binned time and score, without its site or event flag (under secure aggregation) — the
largest time, and four sums. With fine bins and few patients most cells hold one patient, so H
reveals each patient's binned (time, score) pair (not who, not where): a pooled, site-free release,
not a private one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedxrisk.stats.histogram import logit_edges

TIME_BINS = 256
SCORE_BINS = 4096
SCORE_LIMIT = 16.0


@dataclass(frozen=True)
class FederatedC:
    """C_fed with its binning bound and the release's sizes."""

    c_index: float
    bound: float
    comparable: float  # ΣL: the surely comparable pairs
    ambiguous_time: float  # U2
    tied_score: float  # U1
    time_edges: int
    score_edges: int


def site_histogram(times, scores, time_edges: np.ndarray, score_edges: np.ndarray) -> np.ndarray:
    """A site's ``[T, S]`` int64 counts of its patients (step 1)."""
    a = np.searchsorted(time_edges, np.asarray(times, np.float64), side="right")
    b = np.searchsorted(score_edges, np.asarray(scores, np.float64), side="right")
    out = np.zeros((len(time_edges) + 1, len(score_edges) + 1), np.int64)
    np.add.at(out, (a, b), 1)
    return out


def site_sums(h: np.ndarray, times, events, scores, time_edges, score_edges) -> np.ndarray:
    """A site's (ΣC_i, ΣL_i, U1, U2) over its own events from the pooled ``h`` (step 2)."""
    ev = np.asarray(events).astype(bool)
    a = np.searchsorted(time_edges, np.asarray(times, np.float64)[ev], side="right")
    b = np.searchsorted(score_edges, np.asarray(scores, np.float64)[ev], side="right")
    later = np.cumsum(h[::-1], 0)[::-1]  # later[a'] = Σ_{x ≥ a'} h[x]
    later = np.vstack([later[1:], np.zeros((1, h.shape[1]), h.dtype)])  # Σ_{x > a'}
    below = np.cumsum(later, 1) - later  # Σ_{b' < b}
    c = below[a, b] + 0.5 * later[a, b]
    return np.array([c.sum(), later[a].sum(), later[a, b].sum(), (h[a].sum(1) - 1).sum()], np.float64)


def federated_cindex(
    sites: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    time_bins: int = TIME_BINS,
    score_bins: int = SCORE_BINS,
) -> FederatedC:
    """C_fed of ``sites`` = [(times, events, scores)] through the two sums (simulated in one process)."""
    t_max = max(float(np.max(t)) for t, _, _ in sites if len(t))  # one secure maximum
    time_edges = np.linspace(0.0, t_max, time_bins + 1)[1:-1]
    score_edges = logit_edges(score_bins, SCORE_LIMIT)
    h = sum(site_histogram(t, s, time_edges, score_edges) for t, _, s in sites)
    c, sure, u1, u2 = sum(site_sums(h, t, e, s, time_edges, score_edges) for t, e, s in sites)
    if sure == 0:
        return FederatedC(float("nan"), float("nan"), 0.0, u2, u1, len(time_edges), len(score_edges))
    est = c / sure
    low, high = (c - u1 / 2) / (sure + u2), (c + u1 / 2 + u2) / (sure + u2)
    bound = max(est - low, high - est, (c + u1 / 2) / sure - est, est - (c - u1 / 2) / sure)
    return FederatedC(
        float(est), float(bound), float(sure), float(u2), float(u1), len(time_edges), len(score_edges)
    )

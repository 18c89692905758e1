"""AUROC, AP and partial AUROC from per-class score histograms: federated validation without scores.

A site sends, per fixed bin of its scores, how many negatives and positives fall
in it (:func:`score_histogram`); the server adds the sites' arrays (a plain sum of
integers, so secure aggregation can wrap it) and computes the metrics from the
total. Every site must use the same bins.

**Bins.** Over the *logit* (what :func:`fedxrisk.metrics.predict` returns and what
the exact metrics rank), ``bins`` bins: the ``bins − 2`` inner bins split
[−limit, limit] evenly, the two end bins take everything below and above (±inf
included). The default 4096 bins over ±16 are 0.0078 logits wide. Logits rather
than sigmoid probabilities: a well-trained CE model puts many scores beyond ±8,
where evenly spaced probability bins collapse (float32's σ(17) is already 1.0),
while probability-scored objectives seldom leave [−6, 6], where these bins are
finer than 0.002 in probability. Scores that already are probabilities can pass
their own ``edges`` (e.g. ``np.linspace(0, 1, 4097)[1:-1]``). A last column counts
NaN scores (a diverged model): any NaN makes the metrics NaN, as the exact ones are.

**What the histogram computes.** Each metric is the exact metric of the data with
every score replaced by its bin's index (ties within a bin count one half for
AUROC; a bin is one threshold of the ROC and precision-recall curves). So it is
exact when no bin holds two *different* scores of opposite classes; otherwise,
with p_k, n_k the bin's positives and negatives (P, N in all), T_k, F_k the
positives and negatives in higher bins:

- AUROC: only pairs sharing a bin change, from ψ ∈ {0, ½, 1} to ½, so
  |error| ≤ Σ_k p_k·n_k / (2·P·N) — half the share of positive-negative pairs that
  share a bin.
- pAUC(FPR ≤ a), normalized: within a bin the exact ROC is some monotone path
  across the rectangle [F_k, F_k + n_k]/N × [T_k, T_k + p_k]/P, the histogram's is
  its diagonal, and they differ by at most half the rectangle's area; so
  |error| ≤ (1/a)·Σ over bins starting below FPR a of (p_k/P)·w_k·c_k, with w_k the
  bin's FPR width clipped at a and c_k = ½, or 1 for the bin that a cuts.
- AP: a positive of bin k has the exact precision (T_k + i)/(T_k + F_k + i + j) for
  some 1 ≤ i ≤ p_k, 0 ≤ j ≤ n_k (ties included: sklearn uses a tied group's end),
  between q⁻ = (T_k + 1)/(T_k + F_k + 1 + n_k) and q⁺ = (T_k + p_k)/(T_k + F_k + p_k);
  the histogram uses h_k = (T_k + p_k)/(T_k + F_k + p_k + n_k), so
  |error| ≤ Σ_k (p_k/P)·max(q⁺ − h_k, h_k − q⁻).

:func:`histogram_bounds` returns the three bounds from the summed histogram, so the
server knows its own worst case. Not covered: the bound is a worst case (the
measured error is usually far smaller, see docs/benchmarks.md); bins are fixed, so
a model whose logits all sit in a few bins (or beyond ±limit) gets a large bound,
not a finer histogram; the McClish-standardized pAUC and per-sample outputs (e.g.
bootstrap intervals, DeLong's variance) need the scores and are not available.
"""

from __future__ import annotations

import numpy as np

from fedxrisk.stats.bootstrap import weighted_ap, weighted_partial_auroc

DEFAULT_BINS = 4096
LOGIT_LIMIT = 16.0


def logit_edges(bins: int = DEFAULT_BINS, limit: float = LOGIT_LIMIT) -> np.ndarray:
    """The ``bins − 1`` inner edges: evenly over [−limit, limit]; the end bins are open."""
    if bins < 3 or not limit > 0:
        raise ValueError(f"need bins ≥ 3 and limit > 0, got bins={bins}, limit={limit}")
    return np.linspace(-limit, limit, bins - 1)


def score_histogram(
    scores: np.ndarray,
    labels: np.ndarray,
    bins: int = DEFAULT_BINS,
    limit: float = LOGIT_LIMIT,
    edges: np.ndarray | None = None,
) -> np.ndarray:
    """``[2, B + 1]`` int64 counts: row 0 negatives, row 1 positives per bin; last column NaN scores.

    Bins as in the module docstring, or ``edges`` (increasing inner edges, B = len(edges) + 1);
    a score equal to an edge goes to the bin above. Histograms with the same bins add up.
    """
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel()
    if scores.shape != labels.shape:
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must be 0/1 (or boolean)")
    edges = logit_edges(bins, limit) if edges is None else np.asarray(edges, dtype=np.float64)
    if edges.ndim != 1 or len(edges) < 1 or (np.diff(edges) <= 0).any():
        raise ValueError("edges must be a non-empty increasing 1-D array")
    n_bins = len(edges) + 1
    nan = np.isnan(scores)
    index = np.where(nan, n_bins, np.searchsorted(edges, np.where(nan, 0.0, scores), side="right"))
    positive = labels.astype(bool)
    out = np.zeros((2, n_bins + 1), dtype=np.int64)
    out[0] = np.bincount(index[~positive], minlength=n_bins + 1)
    out[1] = np.bincount(index[positive], minlength=n_bins + 1)
    return out


def _split(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(negatives, positives) per bin as int64, or None when a score is NaN or a class is missing."""
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.shape[0] != 2 or counts.shape[1] < 2:
        raise ValueError(f"counts must have shape [2, bins + 1], got {counts.shape}")
    if (counts < 0).any():
        raise ValueError("counts must be non-negative")
    if counts[:, -1].any():
        return None
    neg, pos = counts[0, :-1].astype(np.int64), counts[1, :-1].astype(np.int64)
    return (neg, pos) if neg.sum() > 0 and pos.sum() > 0 else None


def histogram_auroc(counts: np.ndarray) -> float:
    """AUROC from summed histograms, ties within a bin counting one half; NaN without both classes."""
    split = _split(counts)
    if split is None:
        return float("nan")
    neg, pos = split
    below = np.cumsum(neg) - neg  # negatives in lower bins
    twice = int(np.sum(pos * (2 * below + neg)))  # 2 × (pairs ranked right + ½ tied pairs)
    return twice / (2 * int(pos.sum()) * int(neg.sum()))


def _as_sample(neg: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, scores (the bin index) and counts of a weighted sample equal to the histogram."""
    k = np.arange(len(neg), dtype=np.float64)
    y = np.r_[np.zeros(len(neg), bool), np.ones(len(pos), bool)]
    return y, np.r_[k, k], np.r_[neg, pos][None, :]


def histogram_ap(counts: np.ndarray) -> float:
    """Average precision from summed histograms, each bin one threshold; NaN without both classes."""
    split = _split(counts)
    return float("nan") if split is None else float(weighted_ap(*_as_sample(*split))[0])


def histogram_pauc(counts: np.ndarray, max_fpr: float) -> float:
    """Normalized partial AUROC over FPR ≤ ``max_fpr`` from summed histograms (ROC linear within a bin)."""
    if not 0.0 < max_fpr <= 1.0:
        raise ValueError(f"max_fpr must lie in (0, 1], got {max_fpr}")
    split = _split(counts)
    return float("nan") if split is None else float(weighted_partial_auroc(*_as_sample(*split), max_fpr)[0])


def histogram_bounds(counts: np.ndarray, max_fpr: float = 0.3) -> dict[str, float]:
    """Worst-case binning error of each histogram metric (module docstring): keys auroc, ap, pauc."""
    split = _split(counts)
    if split is None:
        return {"auroc": float("nan"), "ap": float("nan"), "pauc": float("nan")}
    neg, pos = (a[::-1].astype(np.float64) for a in split)  # highest bin first
    P, N = pos.sum(), neg.sum()
    T, F = np.cumsum(pos) - pos, np.cumsum(neg) - neg  # in higher bins
    auroc = float(np.sum(pos * neg) / (2 * P * N))
    has = pos > 0
    t, f, p, n = T[has], F[has], pos[has], neg[has]
    h = (t + p) / (t + f + p + n)
    q_hi, q_lo = (t + p) / (t + f + p), (t + 1) / (t + f + 1 + n)
    ap = float(np.sum(p / P * np.maximum(q_hi - h, h - q_lo)))
    start, end = F / N, (F + neg) / N
    width = np.clip(np.minimum(end, max_fpr) - start, 0.0, None)
    share = np.where(end <= max_fpr, 0.5, 1.0)
    pauc = float(np.sum(pos / P * width * share) / max_fpr)
    return {"auroc": auroc, "ap": ap, "pauc": pauc}

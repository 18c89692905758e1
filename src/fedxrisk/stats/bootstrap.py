"""Stratified bootstrap intervals for AP and partial AUROC, vectorized over resamples.

A resample is a vector of counts (how often each sample was drawn). With the
scores sorted once, every resample's ROC and precision-recall points are
cumulative sums of its counts over the distinct thresholds, so B resamples cost
one ``[B, N]`` cumulative sum instead of B calls to scikit-learn. With all
counts 1 the functions equal :func:`fedxrisk.metrics.average_precision` and
:func:`fedxrisk.metrics.partial_auroc` (normalized, ``mcclish=False``).

Resampling is stratified (positives and negatives are drawn separately, keeping
m and n fixed, as pROC does) so every resample holds both classes.

**Interval rule.** The interval is the percentile interval of the resampled values
(``np.percentile``, linear interpolation), widened to contain the estimate:
[min(q_lo, θ̂), max(q_hi, θ̂)] with θ̂ the metric on the full sample. AP is biased
under resampling (duplicated samples move its value one way), so with few
positives the whole bootstrap distribution can sit beside θ̂ (issue 25 saw
0.3096, CI [0.3097, 0.3097]); a plain percentile interval then excludes the
number it is reported with. BCa would correct the bias, but its bias term
Φ⁻¹(share of resamples below θ̂) is infinite in exactly those degenerate cases
(all resamples on one side, or all tied) and its acceleration needs N jackknife
evaluations; the widening rule is defined everywhere and changes nothing when
θ̂ already lies inside.

**Paired differences.** :func:`paired_bootstrap` draws one set of resamples and
evaluates both models' scores on it, so the differences keep the pairing. Its
two-sided p-value inverts the percentile interval of the differences d*:
p = min(1, 2·min(1 + #{d* ≤ 0}, 1 + #{d* ≥ 0}) / (B + 1)) (the +1 counts the
observed sample, so p > 0; identical models give p = 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Metric = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _curves(y: np.ndarray, scores: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted true/false positive counts ``[B, T]`` at each distinct threshold, highest first."""
    order = np.argsort(-scores, kind="mergesort")
    s, pos = scores[order], y[order].astype(np.float64)
    w = counts[:, order].astype(np.float64)
    last = np.flatnonzero(np.r_[s[1:] != s[:-1], True])  # end of each group of tied scores
    tp = np.cumsum(w * pos, axis=1)[:, last]
    fp = np.cumsum(w * (1.0 - pos), axis=1)[:, last]
    return tp, fp


def weighted_ap(y: np.ndarray, scores: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Average precision Σ_k (R_k − R_{k−1}) P_k of each row of ``counts`` ``[B, N]``."""
    tp, fp = _curves(y, scores, counts)
    recall = tp / tp[:, -1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 1.0)
    gain = np.diff(recall, axis=1, prepend=0.0)
    return np.sum(gain * precision, axis=1)


def weighted_partial_auroc(
    y: np.ndarray, scores: np.ndarray, counts: np.ndarray, max_fpr: float
) -> np.ndarray:
    """Normalized partial AUROC (1/a)·∫₀^a TPR dFPR of each row of ``counts``, linear between ROC points."""
    tp, fp = _curves(y, scores, counts)
    zero = np.zeros((len(tp), 1))
    tpr = np.hstack([zero, tp / tp[:, -1:]])
    fpr = np.hstack([zero, fp / fp[:, -1:]])
    f0, f1, t0, t1 = fpr[:, :-1], fpr[:, 1:], tpr[:, :-1], tpr[:, 1:]
    a0, a1 = np.minimum(f0, max_fpr), np.minimum(f1, max_fpr)
    with np.errstate(invalid="ignore", divide="ignore"):
        t_end = np.where(f1 > f0, t0 + (t1 - t0) * (a1 - f0) / (f1 - f0), t1)
    return np.sum((a1 - a0) * (t0 + t_end) / 2, axis=1) / max_fpr


def stratified_counts(
    y: np.ndarray, resamples: int, rngs: tuple[np.random.Generator, np.random.Generator]
) -> np.ndarray:
    """``[B, N]`` draw counts: m positives drawn from the positives, n negatives from the negatives.

    ``rngs`` = (positives' stream, negatives' stream): draws in blocks of any size
    continue the same two streams, so the result does not depend on the block size.
    """
    n = len(y)
    out = np.zeros(resamples * n, dtype=np.int64)
    offsets = (np.arange(resamples) * n)[:, None]  # row r's samples at r·N … r·N + N − 1
    for members, rng in zip((np.flatnonzero(y), np.flatnonzero(~y)), rngs):
        draws = members[rng.integers(0, len(members), size=(resamples, len(members)))]
        out += np.bincount((draws + offsets).ravel(), minlength=resamples * n)  # 9× np.add.at's speed
    return out.reshape(resamples, n).astype(np.int32)


def class_streams(seed: int | Sequence[int]) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for the positives' and the negatives' draws, from ``seed``."""
    pos, neg = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(pos), np.random.default_rng(neg)


def _values(
    y: np.ndarray, scores: list[np.ndarray], metrics: dict[str, Metric], resamples: int,
    seed: int | Sequence[int], chunk: int,
) -> dict[str, list[np.ndarray]]:  # fmt: skip
    """Each metric of each score vector on the same ``resamples`` stratified resamples: ``[B]`` arrays."""
    rngs = class_streams(seed)
    chunk = chunk or max(1, 20_000_000 // len(y))
    values: dict[str, list[list[np.ndarray]]] = {k: [[] for _ in scores] for k in metrics}
    for start in range(0, resamples, chunk):
        counts = stratified_counts(y, min(chunk, resamples - start), rngs)
        for name, fn in metrics.items():
            for i, s in enumerate(scores):
                values[name][i].append(fn(y, s, counts))
    return {k: [np.concatenate(v) for v in per] for k, per in values.items()}


def _estimate(fn: Metric, y: np.ndarray, scores: np.ndarray) -> float:
    """The metric on the full sample (every count 1)."""
    return float(fn(y, scores, np.ones((1, len(y)), dtype=np.int32))[0])


def percentile_interval(values: np.ndarray, estimate: float, level: float = 0.95) -> tuple[float, float]:
    """Percentile ``level`` interval of ``values`` widened to contain ``estimate`` (module docstring)."""
    tail = (1 - level) / 2 * 100
    lo, hi = (float(q) for q in np.percentile(values, [tail, 100 - tail]))
    return min(lo, estimate), max(hi, estimate)


def bootstrap_intervals(
    y: np.ndarray,
    scores: np.ndarray,
    metrics: dict[str, Metric],
    resamples: int,
    seed: int | Sequence[int],
    level: float = 0.95,
    chunk: int = 0,
    estimates: dict[str, float] | None = None,
) -> dict[str, tuple[float, float]]:
    """Percentile ``level`` interval of each metric over ``resamples`` stratified resamples,
    widened to contain the full-sample value (module docstring).

    Same ``seed`` → same intervals, whatever ``chunk``. NaN intervals when a class is missing or a score is NaN.
    ``chunk``: resamples per vectorized block (default: about 2·10⁷ cells). ``estimates``: the
    values the intervals will be printed with (e.g. scikit-learn's, which can differ from the
    weighted metric in the last bit); by default the weighted metric on the full sample.
    """
    y = np.asarray(y).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    if resamples < 1 or y.all() or not y.any() or np.isnan(scores).any():
        return {k: (np.nan, np.nan) for k in metrics}
    values = _values(y, [scores], metrics, resamples, seed, chunk)
    est = {k: _estimate(fn, y, scores) for k, fn in metrics.items()} | (estimates or {})
    return {k: percentile_interval(v[0], est[k], level) for k, v in values.items()}


@dataclass(frozen=True)
class PairedBootstrap:
    """A metric of two models on the same samples: values, ``difference`` = estimate1 − estimate2,
    its ``level`` interval (containing it) and two-sided p-value, from ``resamples`` paired resamples."""

    estimate1: float
    estimate2: float
    difference: float
    low: float
    high: float
    p_value: float
    resamples: int
    level: float = 0.95


def paired_bootstrap(
    y: np.ndarray,
    scores1: np.ndarray,
    scores2: np.ndarray,
    metrics: dict[str, Metric],
    resamples: int = 2000,
    seed: int | Sequence[int] = 0,
    level: float = 0.95,
    chunk: int = 0,
) -> dict[str, PairedBootstrap]:
    """Paired stratified bootstrap of each metric's difference between two models (module docstring).

    ``metrics``: name → weighted metric, e.g. ``{"ap": weighted_ap}``. NaN fields when a class is
    missing or a score is NaN. Same ``seed`` → same result, whatever ``chunk``.
    """
    y = np.asarray(y).astype(bool)
    s1, s2 = np.asarray(scores1, dtype=np.float64), np.asarray(scores2, dtype=np.float64)
    if s1.shape != y.shape or s2.shape != y.shape:
        raise ValueError(f"labels {y.shape} and scores {s1.shape}, {s2.shape} must have one shape")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    nan = float("nan")
    if y.all() or not y.any() or np.isnan(s1).any() or np.isnan(s2).any():
        return {k: PairedBootstrap(nan, nan, nan, nan, nan, nan, resamples, level) for k in metrics}
    values = _values(y, [s1, s2], metrics, resamples, seed, chunk)
    out = {}
    for name, (v1, v2) in values.items():
        e1, e2 = _estimate(metrics[name], y, s1), _estimate(metrics[name], y, s2)
        d = v1 - v2
        below, above = int(np.sum(d <= 0)), int(np.sum(d >= 0))
        p = min(1.0, 2 * min(1 + below, 1 + above) / (resamples + 1))
        out[name] = PairedBootstrap(
            e1, e2, e1 - e2, *percentile_interval(d, e1 - e2, level), p, resamples, level
        )
    return out

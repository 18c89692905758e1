"""Federated validation: the global model on the clients' validation data, every evaluation.

The simulation engines (loop, vmap, compile) hold every client's validation data in one
process and compute the metrics **exactly** from the scores (:func:`exact_validation`).
The distributed engine sends no per-sample score between ranks: each rank counts its
clients' validation scores in fixed per-class histograms (:func:`fedxrisk.stats.score_histogram`,
4096 logit bins over ±16), one ``all_reduce(SUM)`` of integers adds them (a sum, so secure
aggregation could wrap it), and every rank computes the same metrics from the total
(:func:`histogram_validation`); the binning error is bounded by
:func:`fedxrisk.stats.histogram_bounds` (AUROC: half the share of positive-negative pairs
sharing a bin), computed from the same summed counts and logged with every value
(``val_*_bound``; 0 on the exact engines). The Flower server sums the sites' histograms
(:func:`score_histograms`) the same way. Multi-label data: the mean over labels of each
label's metric.

Under DP a run that chooses on validation releases the summed histograms through the Gaussian
mechanism (:mod:`fedxrisk.engines.privacy.validation`); :func:`released_validation` is the one
function from summed counts to ``val_*`` for every engine and Flower's server, so in the test mode
they all report the same numbers and select the same model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedxrisk.data.federated import FederatedData
from fedxrisk.engines.privacy.validation import (
    ValidationRelease,
    auroc_noise_sd,
    coarsen,
    finish,
    noise,
    site_mass,
)
from fedxrisk.metrics import PAUC_FPRS, auroc, average_precision, cindex, is_survival, partial_auroc, predict
from fedxrisk.problem import Problem
from fedxrisk.stats.histogram import (
    histogram_ap,
    histogram_auroc,
    histogram_bounds,
    histogram_pauc,
    score_histogram,
)
from fedxrisk.tree import Tree

VAL_KEYS = ("val_auroc", "val_ap", *(f"val_{name}_norm" for name in PAUC_FPRS))
# the largest error binning can cause in each val_* value: 0 when computed exactly from the scores
BOUND_KEYS = tuple(f"{key}_bound" for key in VAL_KEYS)
_ALL_KEYS = (*VAL_KEYS, *BOUND_KEYS)


def _columns(y: np.ndarray) -> np.ndarray:
    return y.reshape(len(y), -1)


def _mean(values: list[float]) -> float:
    valid = [v for v in values if not math.isnan(v)]
    return float(np.mean(valid)) if valid else math.nan


def validation_scores(
    problem: Problem, params: Tree, buffers: Tree, data: FederatedData, clients: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and logits ``[N, L]`` of the validation data of ``clients`` (all when None)."""
    assert data.val_shards is not None and data.data.x_val is not None and data.data.y_val is not None
    ks = range(len(data.val_shards)) if clients is None else clients
    rows = torch.from_numpy(np.concatenate([data.val_shards[k] for k in ks]).astype(np.int64))
    scores = predict(problem, params, buffers, data.data.x_val[rows]) if len(rows) else np.zeros(0)
    y = data.data.y_val[rows].numpy()
    return _columns(y), scores.reshape(len(y), -1)


def exact_validation(problem: Problem, params: Tree, buffers: Tree, data: FederatedData) -> dict[str, float]:
    """``val_*`` metrics from the scores of every client's validation data (per label, then averaged);
    survival data: ``val_cindex``, Harrell's C of the pooled validation patients' risk scores."""
    y, s = validation_scores(problem, params, buffers, data)
    if is_survival(data.data):
        rows = np.concatenate(list(data.val_shards))  # type: ignore[arg-type]
        return {"val_cindex": cindex(data.data.groups_val["time"][rows], y.ravel(), s.ravel())}
    cols = range(y.shape[1])
    out = {"val_auroc": _mean([auroc(y[:, j], s[:, j]) for j in cols])}
    out["val_ap"] = _mean([average_precision(y[:, j], s[:, j]) for j in cols])
    for name, fpr in PAUC_FPRS.items():
        out[f"val_{name}_norm"] = _mean([partial_auroc(y[:, j], s[:, j], fpr) for j in cols])
    return out | {
        bound: 0.0 if not math.isnan(out[key]) else math.nan for key, bound in zip(VAL_KEYS, BOUND_KEYS)
    }


def score_histograms(y: np.ndarray, s: np.ndarray, labels: int) -> np.ndarray:
    """``[L, 2, B + 1]`` int64 per-class counts of labels ``y`` and logits ``s`` (``[N, L]`` or ``[N]``)
    in the fixed bins of :func:`~fedxrisk.stats.score_histogram`: what a site (a rank) sends."""
    y, s = _columns(np.asarray(y)), np.asarray(s).reshape(len(y), -1)
    if s.shape[1] != labels:  # no validation sample here
        s, y = np.zeros((0, labels)), np.zeros((0, labels))
    return np.stack([score_histogram(s[:, j], y[:, j]) for j in range(labels)])


def validation_histogram(
    problem: Problem, params: Tree, buffers: Tree, data: FederatedData, clients: Sequence[int]
) -> np.ndarray:
    """``[L, 2, B + 1]`` int64 per-class score counts of the validation data of ``clients``."""
    y, s = validation_scores(problem, params, buffers, data, clients)
    labels = data.data.y_val.reshape(len(data.data.y_val), -1).shape[1]  # type: ignore[union-attr]
    return score_histograms(y, s, labels)


def histogram_validation(counts: np.ndarray) -> dict[str, float]:
    """``val_*`` metrics from summed ``[L, 2, B + 1]`` histograms (McClish pAUC needs scores: not given),
    each with its ``*_bound``: the worst-case binning error :func:`~fedxrisk.stats.histogram_bounds`
    computes from the same counts (the exact value lies within ± bound; multi-label: the mean of the
    labels' bounds, which bounds the error of the mean)."""
    counts = np.asarray(counts)
    out = {"val_auroc": _mean([histogram_auroc(c) for c in counts])}
    out["val_ap"] = _mean([histogram_ap(c) for c in counts])
    for name, fpr in PAUC_FPRS.items():
        out[f"val_{name}_norm"] = _mean([histogram_pauc(c, fpr) for c in counts])
    bounds = {fpr: [histogram_bounds(c, fpr) for c in counts] for fpr in {0.3, *PAUC_FPRS.values()}}
    out["val_auroc_bound"] = _mean([b["auroc"] for b in bounds[0.3]])
    out["val_ap_bound"] = _mean([b["ap"] for b in bounds[0.3]])
    for name, fpr in PAUC_FPRS.items():
        out[f"val_{name}_norm_bound"] = _mean([b["pauc"] for b in bounds[fpr]])
    return out


def released_validation(
    counts: np.ndarray, release: ValidationRelease | None, round_: int
) -> dict[str, float]:
    """``val_*`` (and ``*_bound``) from summed ``[L, 2, B + 1]`` histograms; with ``release`` (DP)
    from their Gaussian release for evaluation ``round_`` (coarser bins, noise, clipped at 0)."""
    if release is None:
        return histogram_validation(counts)
    coarse = coarsen(counts, release.dp.bins)
    z = noise(release.dp, release.source, round_, coarse.shape, release.sites)
    return noised_validation(finish(coarse + z), release)


def noised_validation(released: np.ndarray, release: ValidationRelease) -> dict[str, float]:
    """``val_*`` of a released (noised, clipped, rounded) histogram and ``val_auroc_noise_sd``, the
    noise's SD on val_auroc (:func:`~fedxrisk.engines.privacy.validation.auroc_noise_sd`)."""
    return histogram_validation(released) | {"val_auroc_noise_sd": auroc_noise_sd(released, release.dp)}


def _private(sim: Any, problem: Problem, data: FederatedData, release: ValidationRelease) -> dict[str, float]:
    """The DP release on a simulation: each client's histogram (client level: scaled to the fixed
    mass), summed; distributed: rank 0 adds the noise before one float64 ``all_reduce``."""
    params, buffers = sim.global_model()
    own = [validation_histogram(problem, params, buffers, data, [k]) for k in sim.clients]
    if release.dp.level == "client":
        own = [site_mass(c) for c in own]
    group = getattr(sim, "group", None)
    if group is None:
        return released_validation(np.sum(own, axis=0), release, sim.round)
    coarse = coarsen(np.sum(own, axis=0), release.dp.bins)  # the same steps, the sum across ranks
    if group.rank == 0:
        coarse = coarse + noise(release.dp, release.source, sim.round, coarse.shape, release.sites)
    buf = torch.from_numpy(coarse).to(group.device)
    group.all_reduce(buf, "validation histograms (all_reduce)")
    return noised_validation(finish(buf.cpu().numpy()), release)


def federated_validation(
    sim: Any, problem: Problem, data: FederatedData, release: ValidationRelease | None = None
) -> dict[str, float]:
    """The ``val_*`` metrics of ``sim``'s global model (NaN without validation data).

    Distributed engine: collective (every rank calls it at the same round) and returns the same
    numbers on every rank, from summed histograms; a federation (Flower) whose sites hold the
    validation data hands the sum of their histograms (``sim.validation_counts()``, None: none;
    ``sim.validation_noised``: the sum already carries the release's noise, added by the sites);
    otherwise exact. With ``release`` (a DP run choosing on validation): the Gaussian release of
    the summed histograms on every engine.
    """
    if (summed := getattr(sim, "validation_counts", None)) is not None:
        counts = summed()
        if counts is None:
            return dict.fromkeys(_ALL_KEYS, math.nan)
        if getattr(sim, "validation_noised", False) and release is not None:  # the sites added the noise
            return noised_validation(finish(counts), release)
        return released_validation(counts, release, sim.round)
    if data.val_shards is None:
        return dict.fromkeys(("val_cindex",) if is_survival(data.data) else _ALL_KEYS, math.nan)
    if release is not None:
        return _private(sim, problem, data, release)
    params, buffers = sim.global_model()
    group = getattr(sim, "group", None)
    if group is None:
        return exact_validation(problem, params, buffers, data)
    counts = torch.from_numpy(validation_histogram(problem, params, buffers, data, sim.clients))
    buf = counts.to(group.device)
    group.all_reduce(buf, "validation histograms (all_reduce)")
    return histogram_validation(buf.cpu().numpy())

"""Evaluation metrics: AUROC, average precision, partial AUROC (scikit-learn), per-client summaries."""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch

from fedxrisk.data.federated import FederatedData
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree


def _rankable(scores: np.ndarray) -> np.ndarray | None:
    """Scores scikit-learn accepts: ±inf kept in order as the largest finite values; None if any NaN."""
    scores = np.asarray(scores, dtype=np.float64)
    if np.isnan(scores).any():
        return None
    big = np.finfo(np.float64).max
    return np.nan_to_num(scores, posinf=big, neginf=-big)


def auroc(y: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; NaN when ``y`` holds a single class or a score is NaN."""
    from sklearn.metrics import roc_auc_score  # on first use, as the others: not at a Flower site's start

    ranked = _rankable(scores)
    return float(roc_auc_score(y, ranked)) if ranked is not None and 0 < y.sum() < len(y) else math.nan


def average_precision(y: np.ndarray, scores: np.ndarray) -> float:
    """Average precision (area under the precision-recall curve); NaN without positives or with NaN scores."""
    from sklearn.metrics import average_precision_score

    ranked = _rankable(scores)
    return float(average_precision_score(y, ranked)) if ranked is not None and y.sum() > 0 else math.nan


PAUC_FPRS = {"pauc30": 0.3, "pauc50": 0.5}  # one-way partial AUROC, FPR ≤ max_fpr


def partial_auroc(y: np.ndarray, scores: np.ndarray, max_fpr: float, mcclish: bool = False) -> float:
    """One-way partial AUROC over FPR ∈ [0, max_fpr]; NaN when ``y`` holds a single class or a score is NaN.

    ``mcclish=False``: the normalized partial area (1/max_fpr)·∫₀^max_fpr TPR dFPR ∈ [0, 1]
    (the ROC curve interpolated linearly at max_fpr). ``mcclish=True``: scikit-learn's
    McClish-standardized value ``roc_auc_score(max_fpr=...)`` (0.5 = chance, 1 = perfect).
    """
    from sklearn.metrics import roc_auc_score, roc_curve

    if not 0.0 < max_fpr <= 1.0:
        raise ValueError(f"max_fpr must lie in (0, 1], got {max_fpr}")
    scores = _rankable(scores)
    if scores is None or not 0 < y.sum() < len(y):
        return math.nan
    if mcclish:
        return float(roc_auc_score(y, scores, max_fpr=max_fpr))
    fpr, tpr, _ = roc_curve(y, scores)
    stop = np.searchsorted(fpr, max_fpr, side="right")
    x = np.append(fpr[:stop], max_fpr)
    t = np.append(tpr[:stop], np.interp(max_fpr, fpr, tpr))
    return float(np.sum(np.diff(x) * (t[1:] + t[:-1])) / 2 / max_fpr)


def pauc_metrics(y: np.ndarray, scores: np.ndarray, prefix: str = "test_") -> dict[str, float]:
    """``{prefix}pauc30_norm``, ``{prefix}pauc30_mcclish``, likewise at FPR ≤ 0.5."""
    out = {}
    for name, fpr in PAUC_FPRS.items():
        out[f"{prefix}{name}_norm"] = partial_auroc(y, scores, fpr)
        out[f"{prefix}{name}_mcclish"] = partial_auroc(y, scores, fpr, mcclish=True)
    return out


@contextmanager
def eval_mode(model: torch.nn.Module):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()
def predict(
    problem: Problem, params: Tree, buffers: Tree, x: torch.Tensor, chunk: int | None = None
) -> np.ndarray:
    """Logits of the model in eval mode (BatchNorm uses running statistics), ``chunk`` samples
    per forward pass (None: ``problem.eval_batch_size``, else from the default memory budget)."""
    from fedxrisk.data.stream import eval_batch_size, input_chunks  # lazy inputs: decoded chunk by chunk

    chunk = chunk or problem.eval_batch_size or eval_batch_size(tuple(x.shape[1:]))

    device = next(iter(params.values())).device
    with eval_mode(problem.model):
        out = [problem.logits(params, buffers, part.to(device))[0] for part in input_chunks(x, chunk)]
    return torch.cat(out).float().cpu().numpy()


def per_label(metric, y: np.ndarray, scores: np.ndarray) -> list[float]:
    """``metric`` on each column of multi-label ``y`` / ``scores`` ``[N, L]``."""
    return [metric(y[:, j], scores[:, j]) for j in range(y.shape[1])]


def _nanmean(values: list[float]) -> float:
    valid = [v for v in values if not math.isnan(v)]
    return float(np.mean(valid)) if valid else math.nan


def evaluate_multilabel(
    problem: Problem, params: Tree, buffers: Tree, data: FederatedData
) -> dict[str, float | list[float]]:
    """Multi-label: per-label test AUROC/AP and their means over labels (labels with
    a single class in the test set are left out of the mean); per client, the mean
    over labels of its AUROC on its own shard."""
    y_test, s_test = data.data.y_test.numpy(), predict(problem, params, buffers, data.data.x_test)
    y_train, s_train = data.data.y_train.numpy(), predict(problem, params, buffers, data.data.x_train)
    per_client = [_nanmean(per_label(auroc, y_train[sh], s_train[sh])) for sh in data.shards]
    return final_metrics(y_test, s_test, per_client)


def evaluate(problem: Problem, params: Tree, buffers: Tree, data: FederatedData) -> dict[str, float]:
    """Test AUROC/AP of the global model, and its AUROC on each client's own shard.

    ``client_auroc_mean``/``std`` are over clients holding both classes.
    Multi-label data: see :func:`evaluate_multilabel`.
    """
    if data.data.y_test.dim() == 2:
        return evaluate_multilabel(problem, params, buffers, data)  # type: ignore[return-value]
    if is_survival(data.data):
        return evaluate_survival(problem, params, buffers, data)
    y_test = data.data.y_test.numpy()
    s_test = predict(problem, params, buffers, data.data.x_test)
    s_train = predict(problem, params, buffers, data.data.x_train)
    y_train = data.data.y_train.numpy()
    per_client = [auroc(y_train[shard], s_train[shard]) for shard in data.shards]
    return final_metrics(y_test, s_test, per_client)  # type: ignore[return-value]


def final_metrics(
    y_test: np.ndarray, s_test: np.ndarray, client_aurocs: list[float] | None
) -> dict[str, float | list[float]]:
    """The ``final`` block of summary.json from test labels and scores (``[N]``, or ``[N, L]``
    multi-label: means over labels, per-label lists) and each client's AUROC on its own shard
    (mean/std over the non-NaN ones; None: no client keys)."""
    multi = y_test.ndim == 2
    if multi:
        aurocs, aps = per_label(auroc, y_test, s_test), per_label(average_precision, y_test, s_test)
        out: dict[str, float | list[float]] = {"test_auroc": _nanmean(aurocs), "test_ap": _nanmean(aps)}
    else:
        out = {
            "test_auroc": auroc(y_test, s_test),
            "test_ap": average_precision(y_test, s_test),
            **pauc_metrics(y_test, s_test),
        }
    if client_aurocs is not None:
        valid = [a for a in client_aurocs if not math.isnan(a)]
        out["client_auroc_mean"] = float(np.mean(valid)) if valid else math.nan
        out["client_auroc_std"] = float(np.std(valid)) if valid else math.nan
    if multi:
        out |= {"test_auroc_per_label": aurocs, "test_ap_per_label": aps}
    return out


SURVIVAL_KEYS = ("test_cindex", "client_cindex_mean", "client_cindex_std")  # a survival run's test columns


def is_survival(data) -> bool:
    """Survival data (:mod:`fedxrisk.data.readers.survival`): ``y`` is the event flag, ``time`` beside it."""
    return "time" in getattr(data, "groups_train", {})


def cindex(times: np.ndarray, events: np.ndarray, scores: np.ndarray) -> float:
    """Harrell's C of risk ``scores`` (:mod:`fedxrisk.stats.concordance`); NaN when no pair is comparable."""
    from fedxrisk.stats.concordance import c_index

    scores = np.asarray(scores, np.float64).ravel()
    if len(scores) == 0 or not np.isfinite(scores).all():
        return math.nan
    try:
        return c_index(times, events, scores)
    except ValueError:  # no comparable pair
        return math.nan


def evaluate_survival(problem: Problem, params: Tree, buffers: Tree, data: FederatedData) -> dict[str, float]:
    """Survival data: the pooled test C-index (Harrell's) of the global model's risk scores, and each
    client's C-index on its own training shard (mean/std over the clients with a comparable pair)."""
    d = data.data
    s_test = predict(problem, params, buffers, d.x_test)
    s_train = predict(problem, params, buffers, d.x_train)
    t_train, e_train = d.groups_train["time"], d.y_train.numpy()
    clients = [cindex(t_train[sh], e_train[sh], s_train[sh]) for sh in data.shards]
    valid = [c for c in clients if not math.isnan(c)]
    return {
        "test_cindex": cindex(d.groups_test["time"], d.y_test.numpy(), s_test),
        "client_cindex_mean": float(np.mean(valid)) if valid else math.nan,
        "client_cindex_std": float(np.std(valid)) if valid else math.nan,
    }

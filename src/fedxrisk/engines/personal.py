"""After federated training: local fine-tuning and the evaluation of each site's own model.

Fine-tuning (as in FLamby's fine-tuning example: every site continues from the global model
alone) runs ``steps`` more local steps of the algorithm on
every client, with no communication, at the last round's step size; each client keeps its
fine-tuned model in the simulation's state. With 0 steps nothing changes.

A site whose training data hold one class deploys the global model (:func:`deployed_models`): a
head (or a fine-tuned or Ditto model) trained on one class has no ranking to learn and can invert
it (issue 42). Each site's own model is also scored on that site's validation rows every evaluation
(:func:`site_validation`), so selection and tuning can follow the models the sites deploy.

A personalized run (``Problem.personal``, fine-tuning) has one model per site. Each is
evaluated on that site's own test rows when the clients are natural sites
(``partition = 'source'`` and a reader that kept the test rows' sites,
``groups_test['source']``), else on the whole test set; the averaged (global) model is
evaluated on the same rows, so each site's gain is read off one row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fedxrisk.algorithms.base import StepContext
from fedxrisk.algorithms.schedule import RoundPlan
from fedxrisk.data.federated import FederatedData
from fedxrisk.metrics import PAUC_FPRS, auroc, average_precision, partial_auroc, predict
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree, index


def fine_tune_states(
    algorithm: Any, engine: Any, states: Tree, last: RoundPlan, steps: int, next_batch: Callable[[], Tree]
) -> Tree:
    """``steps`` local steps of ``algorithm`` on ``states`` after the last round ``last``, no
    communication, at its step size; each on ``next_batch()``. The simulation and a Flower site
    (flower/site_personal.py) both fine-tune through it."""
    if steps < 0:
        raise ValueError(f"fine-tuning steps must be ≥ 0, got {steps}")
    first = last.first_step + last.window
    for i in range(steps):
        ctx = StepContext(first + i, i, last.round + 1, last.stage, last.lr, steps)
        states = engine.local_steps(algorithm.local_step, ctx, states, next_batch())
    return states


def fine_tune(sim: Any, steps: int) -> None:
    """``steps`` local steps on every client of ``sim`` (a finished simulation), no communication."""
    batch = lambda: sim._batch(sim.sampler.next())  # noqa: E731
    sim.states = fine_tune_states(sim.algorithm, sim.engine, sim.states, sim.plans[-1], steps, batch)


def site_test_rows(data: FederatedData) -> list[np.ndarray] | None:
    """Each client's own test rows (boolean masks) when every client is one site whose test rows
    are known; None otherwise."""
    train, test = data.data.groups_train.get("source"), data.data.groups_test.get("source")
    if train is None or test is None:
        return None
    masks = []
    for shard in data.shards:
        site = np.unique(np.asarray(train)[np.asarray(shard)])
        if len(site) != 1:
            return None
        masks.append(np.asarray(test) == site[0])
    return masks


def site_models(sim: Any) -> list[tuple[Tree, Tree]]:
    """Every client's own (params, buffers) from the simulation's stacked state (Ditto: its v)."""
    params, buffers = getattr(sim.algorithm, "personal_model", sim.algorithm.model)(sim.states)
    return [(index(params, k), index(buffers, k)) for k in range(len(sim.clients))]


def one_site(
    problem: Problem, own: tuple[Tree, Tree], global_model: tuple[Tree, Tree], x: Any, y: np.ndarray
) -> dict[str, float]:
    """One site's ``auroc``, ``ap`` (its own model) and ``global_auroc`` (the global model) on the
    rows ``x``, ``y``; NaN when the rows miss a class."""
    s = predict(problem, *own, x) if len(x) else np.zeros(0)
    g = predict(problem, *global_model, x) if len(x) else np.zeros(0)
    return {"auroc": auroc(y, s), "ap": average_precision(y, s), "global_auroc": auroc(y, g)}


def site_columns(sites: list[dict[str, float]]) -> dict[str, float]:
    """``site_auroc_<k>``, ``site_ap_<k>``, ``site_global_auroc_<k>`` from each site's :func:`one_site`
    (a site without numbers: NaN), and ``personal_auroc_mean`` / ``global_site_auroc_mean``: the
    means over the sites with both classes."""
    out: dict[str, float] = {}
    for k, site in enumerate(sites):
        for key in ("auroc", "ap", "global_auroc"):
            out[f"site_{key}_{k}"] = site.get(key, math.nan)
    for key, prefix in (
        ("personal_auroc_mean", "site_auroc_"),
        ("global_site_auroc_mean", "site_global_auroc_"),
    ):
        values = [out[f"{prefix}{k}"] for k in range(len(sites)) if not math.isnan(out[f"{prefix}{k}"])]
        out[key] = float(np.mean(values)) if values else math.nan
    return out


def history_fields(num_sites: int) -> tuple[str, ...]:
    """history.csv's per-site columns of a personalized run: the two means, then each site's AUROC."""
    return ("personal_auroc_mean", "global_site_auroc_mean", *(f"site_auroc_{k}" for k in range(num_sites)))


def history_row(columns: dict[str, float]) -> dict[str, float]:
    """The :func:`history_fields` part of :func:`site_columns`' numbers (the rest go to summary.json)."""
    return {k: v for k, v in columns.items() if k.startswith(("site_auroc_", "personal_", "global_site_"))}


def site_metrics(
    problem: Problem, models: list[tuple[Tree, Tree]], global_model: tuple[Tree, Tree], data: FederatedData
) -> dict[str, Any]:
    """``site_auroc_<k>`` / ``site_ap_<k>``: client k's model on its site's test rows;
    ``site_global_auroc_<k>``: the global model on the same rows; ``personal_auroc_mean`` and
    ``global_site_auroc_mean``: their means over the sites with both classes (``site_rows``:
    ``own`` when the rows are the site's, ``all`` when every site is tested on the whole test set)."""
    if data.data.y_test.dim() == 2:
        raise ValueError("per-site evaluation of personal models supports binary labels only")
    y = data.data.y_test.numpy()
    masks = site_test_rows(data)
    rows = masks if masks is not None else [np.ones(len(y), dtype=bool)] * len(models)
    sites = [
        one_site(problem, own, global_model, data.data.x_test[np.flatnonzero(m)], y[m])
        for own, m in zip(models, rows, strict=True)
    ]
    return {"site_rows": "own" if masks is not None else "all", **site_columns(sites)}


def personal_evaluation(sim: Any, problem: Problem, data: FederatedData) -> dict[str, float]:
    """:func:`site_metrics` of a (single-process) simulation's site models and global model."""
    return site_metrics(problem, site_models(sim), sim.global_model(), data)


AGGREGATES = ("mean", "worst", "weighted")  # how the sites' validation values become one monitor
SITE_VAL_METRICS = ("auroc", "ap", *(f"{name}_norm" for name in PAUC_FPRS))


def one_class_sites(data: FederatedData) -> list[int]:
    """The clients whose training rows hold one class only (binary labels; none for multi-label)."""
    if data.data.y_train.dim() == 2:
        return []
    return [k for k, (pos, neg) in enumerate(data.client_counts()) if pos == 0 or neg == 0]


def deployed_models(
    sim: Any, data: FederatedData, shared: tuple[Tree, Tree] | None = None
) -> list[tuple[Tree, Tree]]:
    """What each site deploys: its own model (:func:`site_models`), except a site whose training
    rows hold one class (:func:`one_class_sites`), which deploys the global model ``shared``
    (default: the simulation's global model now; after fine-tuning pass the one before it)."""
    models, fallback = site_models(sim), set(one_class_sites(data))
    if not fallback:
        return models
    shared = sim.global_model() if shared is None else shared
    return [shared if k in fallback else own for k, own in enumerate(models)]


def site_validation_fields(num_sites: int) -> tuple[str, ...]:
    """history.csv's per-site validation columns: the aggregates, then each site's own-model AUROC."""
    aggregates = [f"site_val_{m}_{a}" for m in SITE_VAL_METRICS for a in AGGREGATES]
    return (*aggregates, *(f"site_val_auroc_{k}" for k in range(num_sites)))


def site_validation(
    problem: Problem, models: list[tuple[Tree, Tree]], data: FederatedData
) -> dict[str, float]:
    """Each site's own model on its own validation rows: ``site_val_auroc_<k>``, and per metric
    (AUROC, AP, normalized pAUC) the ``mean`` over sites, the ``worst`` site and the mean
    ``weighted`` by validation rows, over the sites whose rows hold both classes (NaN: none)."""
    if data.val_shards is None or data.data.x_val is None or data.data.y_val is None:
        return dict.fromkeys(site_validation_fields(len(models)), math.nan)
    y_all = data.data.y_val.numpy()
    per_site: list[dict[str, float]] = []
    for (params, buffers), rows in zip(models, data.val_shards, strict=True):
        y = y_all[rows]
        s = predict(problem, params, buffers, data.data.x_val[rows]) if len(rows) else np.zeros(0)
        one = {"auroc": auroc(y, s), "ap": average_precision(y, s)}
        one |= {f"{n}_norm": partial_auroc(y, s, fpr) for n, fpr in PAUC_FPRS.items()}
        per_site.append(one | {"rows": float(len(rows))})
    out = {f"site_val_auroc_{k}": site["auroc"] for k, site in enumerate(per_site)}
    for metric in SITE_VAL_METRICS:
        valid = [(site[metric], site["rows"]) for site in per_site if not math.isnan(site[metric])]
        values = np.array([v for v, _ in valid])
        weights = np.array([w for _, w in valid])
        out[f"site_val_{metric}_mean"] = float(values.mean()) if valid else math.nan
        out[f"site_val_{metric}_worst"] = float(values.min()) if valid else math.nan
        out[f"site_val_{metric}_weighted"] = (
            float((values * weights).sum() / weights.sum()) if valid else math.nan
        )
    return out

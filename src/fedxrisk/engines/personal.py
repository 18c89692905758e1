"""After federated training: local fine-tuning and the evaluation of each site's own model.

Fine-tuning (as in FLamby's fine-tuning example: every site continues from the global model
alone) runs ``steps`` more local steps of the algorithm on
every client, with no communication, at the last round's step size; each client keeps its
fine-tuned model in the simulation's state. With 0 steps nothing changes.

A personalized run (``Problem.personal``, fine-tuning) has one model per site. Each is
evaluated on that site's own test rows when the clients are natural sites
(``partition = 'source'`` and a reader that kept the test rows' sites,
``groups_test['source']``), else on the whole test set; the averaged (global) model is
evaluated on the same rows, so each site's gain is read off one row.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedxrisk.algorithms.base import StepContext
from fedxrisk.data.federated import FederatedData
from fedxrisk.metrics import auroc, average_precision, predict
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree, index


def fine_tune(sim: Any, steps: int) -> None:
    """``steps`` local steps on every client of ``sim`` (a finished simulation), no communication."""
    if steps < 0:
        raise ValueError(f"fine-tuning steps must be ≥ 0, got {steps}")
    last = sim.plans[-1]
    first = last.first_step + last.window
    for i in range(steps):
        ctx = StepContext(first + i, i, last.round + 1, last.stage, last.lr, steps)
        batch = sim._batch(sim.sampler.next())
        sim.states = sim.engine.local_steps(sim.algorithm.local_step, ctx, sim.states, batch)


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


def site_metrics(
    problem: Problem, models: list[tuple[Tree, Tree]], global_model: tuple[Tree, Tree], data: FederatedData
) -> dict[str, float]:
    """``site_auroc_<k>`` / ``site_ap_<k>``: client k's model on its site's test rows;
    ``site_global_auroc_<k>``: the global model on the same rows; ``personal_auroc_mean`` and
    ``global_site_auroc_mean``: their means over the sites with both classes (``site_rows``:
    ``own`` when the rows are the site's, ``all`` when every site is tested on the whole test set)."""
    if data.data.y_test.dim() == 2:
        raise ValueError("per-site evaluation of personal models supports binary labels only")
    y = data.data.y_test.numpy()
    masks = site_test_rows(data)
    rows = masks if masks is not None else [np.ones(len(y), dtype=bool)] * len(models)
    s_global = predict(problem, *global_model, data.data.x_test)
    out: dict[str, Any] = {"site_rows": "own" if masks is not None else "all"}
    for k, ((params, buffers), m) in enumerate(zip(models, rows, strict=True)):
        x = data.data.x_test[np.flatnonzero(m)]
        s = predict(problem, params, buffers, x) if len(x) else np.zeros(0)
        out[f"site_auroc_{k}"] = auroc(y[m], s)
        out[f"site_ap_{k}"] = average_precision(y[m], s)
        out[f"site_global_auroc_{k}"] = auroc(y[m], s_global[m])
    for key, prefix in (
        ("personal_auroc_mean", "site_auroc_"),
        ("global_site_auroc_mean", "site_global_auroc_"),
    ):
        values = [out[f"{prefix}{k}"] for k in range(len(models)) if not math.isnan(out[f"{prefix}{k}"])]
        out[key] = float(np.mean(values)) if values else math.nan
    return out


def personal_evaluation(sim: Any, problem: Problem, data: FederatedData) -> dict[str, float]:
    """:func:`site_metrics` of a (single-process) simulation's site models and global model."""
    return site_metrics(problem, site_models(sim), sim.global_model(), data)

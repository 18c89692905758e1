"""Personalization on Flower, a site's side: what leaves it, its own numbers, fine-tuning.

- **What leaves.** The site's collective is a
  :class:`~fedxrisk.algorithms.personal.SiteCollective` (flower/site.py), so no personal entry is
  in any collective's payload, and :func:`reported_model` drops them from the evaluation report.
  Ditto's personal model v is state the algorithm never sends.
- **Its numbers.** At each evaluation a personalized site scores its own model (Ditto: v) and the
  global model as the site holds it (:func:`global_at_site`: the shared entries, equal on every
  site after the round, with the personal ones at their starting values, i.e. the server's
  ``model.pt``) on its own test rows (``SiteData.x_test``: a ``test.npz``/``test.csv`` in its
  folder, a trial site's rows) with :func:`~fedxrisk.engines.personal.one_site`, as ``fedxrisk run``
  scores client k. Under DP or SecAgg+ it sends none of them, as it sends no AUROC.
- **Fine-tuning.** After the last round's report the site runs ``finetune_steps`` local steps alone
  (:func:`~fedxrisk.engines.personal.fine_tune_states`, the simulation's rule, FLamby's example)
  and reports its fine-tuned model's numbers; its state keeps the fine-tuned model, and with the
  node config ``site-model="/path/site.pt"`` the site writes its own final model there (the
  server's ``model.pt`` format), the only copy outside the node's memory.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedxrisk.algorithms.personal import split_personal, start_values
from fedxrisk.engines.personal import fine_tune_states, one_site
from fedxrisk.flower.personal import FINAL, ROW, personalized, sites_differ, to_wire
from fedxrisk.flower.sitedata import SiteData, SiteDataError
from fedxrisk.outfiles import replace_atomic
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree, index

Model = tuple[Tree, Tree]


def own_model(algorithm: Any, state: Tree) -> Model:
    """The site's own model: Ditto's v, else the algorithm's model (personal entries included)."""
    params, buffers = getattr(algorithm, "personal_model", algorithm.model)(state)
    return index(params, 0), index(buffers, 0)


def global_at_site(problem: Problem, algorithm: Any, state: Tree) -> Model:
    """The global model as the site (and the server) can form it: the algorithm's model with every
    personal entry at its starting value (the identity without ``model.personal``)."""
    params, buffers = (index(t, 0) for t in algorithm.model(state))
    return start_values(problem, params, buffers)


def reported_model(problem: Problem, model: Model) -> dict[str, Tree]:
    """The model a site reports at an evaluation: no personal entry."""
    names = getattr(problem, "local_names", frozenset())
    params, buffers = model
    return {"params": split_personal(params, names), "buffers": split_personal(buffers, names)}


def site_numbers(
    cfg: Any, site: SiteData, problem: Problem, own: Model, glob: Model, prefix: str = ROW
) -> dict:
    """The site's own and global model on its own test rows, as reply metrics: at evaluations
    (``ROW``) when the sites' models differ during training, after fine-tuning (``FINAL``) in every
    personalized run; nothing without test rows or under DP / SecAgg+."""
    wanted = personalized(cfg) if prefix == FINAL else sites_differ(cfg)
    if not wanted or cfg.private_reports or site.x_test is None or site.y_test is None:
        return {}
    return to_wire(one_site(problem, own, glob, site.x_test, site.y_test.numpy()), prefix)


def rows_config(cfg: Any, site: SiteData) -> dict[str, Any]:
    """Which test rows the site's numbers are on (``own``, ``all``, ``none``), in a personalized run's reports."""
    rows = site.test_rows or ("own" if site.x_test is not None else "none")  # data_fn's SiteData: its own
    return {"site-rows": rows} if personalized(cfg) else {}


def finish(
    cfg: Any, site: SiteData, problem: Problem, algorithm: Any, engine: Any, state: Tree, last: Any,
    next_batch: Callable[[], Tree],
) -> tuple[Tree, dict[str, float], dict[str, Any]]:  # fmt: skip
    """After the last round's report: fine-tune (``finetune_steps``, 0: none), score the result
    against the global model of before, write the site's own model where its node config says
    (``site-model``); (the new state, reply metrics, reply config)."""
    glob = global_at_site(problem, algorithm, state)
    if personalized(cfg):
        state = fine_tune_states(algorithm, engine, state, last, cfg.run.finetune_steps, next_batch)
    own = own_model(algorithm, state)
    if site.model_out:
        save_site_model(Path(site.model_out), cfg, site, own)
    if not personalized(cfg):
        return state, {}, {}
    numbers = site_numbers(cfg, site, problem, own, glob, FINAL)
    return state, numbers, {"fine-tuned": True, **rows_config(cfg, site)}


def site_model_path(node_config: Mapping[str, Any]) -> str:
    """The node config's ``site-model`` (a file the site writes at the end; "" when not given),
    checked at set-up: a path in an existing folder."""
    value = node_config.get("site-model", "")
    if not isinstance(value, str) or (value and not Path(value).expanduser().parent.is_dir()):
        raise SiteDataError(
            f"node config site-model must be a file path in an existing folder, got {value!r}"
        )
    return str(Path(value).expanduser()) if value else ""


def save_site_model(path: Path, cfg: Any, site: SiteData, model: Model) -> None:
    """The site's own model in the server's ``model.pt`` format (atomically: never half-written)."""
    params, buffers = model
    data = io.BytesIO()
    torch.save(
        {"params": params, "buffers": buffers, "model": cfg.run.model, "input_shape": site.input_shape}, data
    )
    replace_atomic(path, lambda f: f.write(data.getvalue()), "wb")

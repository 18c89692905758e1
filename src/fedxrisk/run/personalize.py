"""A personalized run's end: local fine-tuning, then each site's model on its own test rows.

Called by :func:`fedxrisk.run.loop.train` after the last round. The global model (what
``model.pt`` holds) is taken first, so fine-tuning never changes it; each site's own model is
written as ``site_<k>.pt`` (and stays in ``final_state.pt`` when checkpoints are on).

What a site deploys (issue 42): a site whose training rows hold one class deploys the global model
(stated in a warning and in summary.json ``personal.global_model_sites``); with ``selection =
"best"`` the sites' models are those of the selected round (fine-tuning starts there); a site model
below chance on its own validation rows (without validation: its training rows) is warned about
and listed in ``personal.below_chance_sites``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from fedxrisk.engines.personal import (
    deployed_models,
    fine_tune,
    history_fields,
    history_row,
    one_class_sites,
    site_metrics,
    site_validation,
    site_validation_fields,
)
from fedxrisk.metrics import auroc, predict
from fedxrisk.run.build import Setup
from fedxrisk.run.folder import RunFolder
from fedxrisk.tree import Tree, tmap

DEPLOYED = "_deployed_models"  # finish_personal's models, handed to save_site_models (not in summary.json)


def ends_personal(personal: str, finetune_steps: int, algorithm: Any) -> bool:
    """Whether a run with ``model.personal = personal``, ``finetune_steps`` and ``algorithm`` (an
    instance or its class) ends with one model per site: personal entries, fine-tuning, Ditto. The
    Flower app asks the same (flower/personal.py)."""
    return personal != "none" or finetune_steps > 0 or hasattr(algorithm, "personal_model")


def sites_differ(personal: str, algorithm: Any) -> bool:
    """Whether the sites' models differ during training (personal entries, Ditto's v)."""
    return personal != "none" or hasattr(algorithm, "personal_model")


def personalized(setup: Setup) -> bool:
    """Whether the run ends with one model per site (``model.personal``, fine-tuning, Ditto)."""
    return ends_personal(setup.config.personal, setup.config.finetune_steps, setup.algorithm)


def finish_personal(setup: Setup, selected: Any = None) -> tuple[tuple[Tree, Tree], dict[str, Any] | None]:
    """(the global model, summary.json's ``personal`` block or None): fine-tunes on every rank;
    the per-site block needs every site in this process (not the distributed engine).
    ``selected``: the simulation's states at the selected round (``selection = "best"``): the
    sites' models and their fine-tuning start there; the global model returned is the last round's."""
    sim, cfg = setup.simulation, setup.config
    global_model = sim.global_model()
    if not personalized(setup):
        return global_model, None
    if remote_sites(setup):  # the sites fine-tuned and scored themselves; their models stay there
        return global_model, sim.personal_summary()
    last = sim.states
    if selected is not None:
        sim.states = selected
    shared = sim.global_model()  # model.pt: the selected (else last) global model, before fine-tuning
    fine_tune(sim, cfg.finetune_steps)
    if cfg.engine == "distributed" or not sim.is_primary:
        return global_model, None
    block: dict[str, Any] = {"personal": cfg.personal, "finetune_steps": cfg.finetune_steps}
    models = deployed_models(sim, setup.data, shared)
    if selected is not None:  # final_state.pt keeps the last round's states: an extension goes on from there
        block["from_round"] = "selected"
        sim.states = last
    block |= site_metrics(setup.problem, models, shared, setup.data) | _site_val(setup, models, shared)
    block |= _global_model_sites(setup) | _below_chance_sites(setup, models)
    return global_model, block | {DEPLOYED: models}  # save_site_models writes and removes them


def _site_val(setup: Setup, models: list[tuple[Tree, Tree]], shared: tuple[Tree, Tree]) -> dict[str, float]:
    """The deployed models' ``site_val_*`` and, beside each, the global model on the same validation
    rows (``site_global_val_auroc_<k>``, ``global_site_val_auroc_mean``); empty without validation."""
    if setup.data.val_shards is None:
        return {}
    own = site_validation(setup.problem, models, setup.data)
    other = site_validation(setup.problem, [shared] * len(models), setup.data)
    beside = {f"site_global_val_auroc_{k}": other[f"site_val_auroc_{k}"] for k in range(len(models))}
    return own | beside | {"global_site_val_auroc_mean": other["site_val_auroc_mean"]}


def _names(setup: Setup, ks: list[int]) -> str:
    sites = setup.data.client_sites() or []
    return ", ".join(f"{k}" + (f" ({sites[k]})" if k < len(sites) and sites[k] else "") for k in ks)


def _global_model_sites(setup: Setup) -> dict[str, Any]:
    """The sites holding one class in their training rows, which deploy the global model (warned)."""
    ks = one_class_sites(setup.data)
    if not ks:
        return {"global_model_sites": []}
    warnings.warn(
        f"site(s) {_names(setup, ks)} hold one class in their training data: no own model is trained "
        "from them; they deploy the global model (summary.json personal.global_model_sites)",
        stacklevel=3,
    )
    return {"global_model_sites": ks}


def _below_chance_sites(setup: Setup, models: list[tuple[Tree, Tree]]) -> dict[str, Any]:
    """``below_chance_sites``: each site whose deployed model ranks worse than chance on its own
    validation rows (without validation data: its own training rows), with the value; warned."""
    data, problem = setup.data, setup.problem
    if data.val_shards is not None:
        values = site_validation(problem, models, data)
        metric = "site_val_auroc"
        per_site = [values[f"site_val_auroc_{k}"] for k in range(len(models))]
    else:
        metric = "site_train_auroc"
        y = data.data.y_train.numpy()
        per_site = [
            auroc(y[shard], predict(problem, *model, data.data.x_train[shard])) if len(shard) else math.nan
            for model, shard in zip(models, data.shards, strict=True)
        ]
    low = [(k, v) for k, v in enumerate(per_site) if isinstance(v, float) and np.isfinite(v) and v < 0.5]
    if low:
        where = "validation" if metric == "site_val_auroc" else "training (no validation data)"
        warnings.warn(
            f"site model(s) below chance on their own {where} rows ({metric}): "
            + ", ".join(f"site {_names(setup, [k])} {v:.3f}" for k, v in low)
            + "; check that site's data and whether it should deploy the global model",
            stacklevel=3,
        )
    return {"below_chance_sites": [{"site": k, "metric": metric, "value": v} for k, v in low]}


def site_snapshot(setup: Setup) -> Any:
    """A function copying every site's state (what ``selection = "best"`` keeps of the selected
    round), for a personalized run whose sites are all in this process; None otherwise."""
    sim = setup.simulation
    if not personalized(setup) or remote_sites(setup) or setup.config.engine == "distributed":
        return None
    return lambda: tmap(lambda t: t.detach().clone(), sim.states)


def _site_rows_during_training(setup: Setup) -> bool:
    """Sites differ during training (personal entries, Ditto) and all of them are in this process."""
    return (
        sites_differ(setup.config.personal, setup.algorithm)
        and setup.config.engine != "distributed"
        and not remote_sites(setup)
    )


def remote_sites(setup: Setup) -> bool:
    """The sites' states live on their own nodes (Flower's federation, which reports their numbers
    itself: ``personal_fields``, ``personal_row``, ``personal_summary``), not in this process."""
    return setup.simulation.remote_sites


def personal_fields(setup: Setup) -> tuple[str, ...]:
    """history.csv's extra columns of a personalized run (none otherwise)."""
    if remote_sites(setup):
        return setup.simulation.personal_fields()
    if not _site_rows_during_training(setup):
        return ()
    num = setup.data.num_clients
    return (*history_fields(num), *(site_validation_fields(num) if setup.data.val_shards is not None else ()))


def personal_row(setup: Setup) -> dict[str, Any]:
    """The per-site numbers of an evaluation row (empty when the run is not personalized)."""
    if remote_sites(setup):
        return setup.simulation.personal_row()
    if not _site_rows_during_training(setup):
        return {}
    sim, problem, data = setup.simulation, setup.problem, setup.data
    models = deployed_models(sim, data)
    row = history_row(site_metrics(problem, models, sim.global_model(), data))
    return row | (site_validation(problem, models, data) if data.val_shards is not None else {})


def save_site_models(setup: Setup, folder: RunFolder, block: dict[str, Any]) -> dict[str, Any]:
    """Write each site's own model as ``site_<k>.pt`` (``model.pt``'s format, so any command that
    reads a model file reads it); the block gains ``site_models``: file name → sha256 (remote
    sites: none here, each site writes its own)."""
    if remote_sites(setup):
        return block
    data, shape = setup.data.data, setup.data.data.input_shape
    files = {}
    block = dict(block)
    models = block.pop(DEPLOYED, None) or deployed_models(setup.simulation, setup.data)
    for k, (params, buffers) in enumerate(models):
        name = f"site_{k}.pt"
        files[name] = folder.save_model(
            setup.config.model, shape, setup.problem.num_labels, params, buffers, name, data.preprocessing
        )
    return block | {"site_models": files}


def deployed_headline(block: dict[str, Any]) -> dict[str, Any]:
    """summary.json ``deployed``: the numbers of the models the sites deploy (``site_<k>.pt``; a
    one-class site: the global model) beside the global model's at the same sites, from ``block``
    (summary.json ``personal``): means over the sites, and the worst site's test AUROC."""
    sites = sorted(int(k.rsplit("_", 1)[1]) for k in block if k.startswith("site_auroc_"))
    own = [block[f"site_auroc_{k}"] for k in sites if isinstance(block[f"site_auroc_{k}"], float)]
    own = [v for v in own if math.isfinite(v)]
    return {
        "models": "each site's own model (site_<k>.pt); a site holding one class: the global model",
        "test_auroc_mean": block.get("personal_auroc_mean"),
        "global_test_auroc_mean": block.get("global_site_auroc_mean"),
        "worst_site_test_auroc": min(own) if own else math.nan,
        "val_auroc_mean": block.get("site_val_auroc_mean", math.nan),
        "global_val_auroc_mean": block.get("global_site_val_auroc_mean", math.nan),
        "global_model_sites": block.get("global_model_sites", []),
        "below_chance_sites": block.get("below_chance_sites", []),
    }

"""A personalized run's end: local fine-tuning, then each site's model on its own test rows.

Called by :func:`fedxrisk.run.loop.train` after the last round. The global model (what
``model.pt`` holds) is taken first, so fine-tuning never changes it; each site's own model is
written as ``site_<k>.pt`` (and stays in ``final_state.pt`` when checkpoints are on).
"""

from __future__ import annotations

from typing import Any

from fedxrisk.engines.personal import (
    fine_tune,
    history_fields,
    history_row,
    personal_evaluation,
    site_metrics,
    site_models,
)
from fedxrisk.run.build import Setup
from fedxrisk.run.folder import RunFolder
from fedxrisk.tree import Tree


def ends_personal(cfg: Any, algorithm: Any) -> bool:
    """Whether a run of ``cfg`` with ``algorithm`` (an instance or its class) ends with one model per
    site: ``model.personal``, fine-tuning, Ditto. The Flower app asks the same (flower/personal.py)."""
    return cfg.personal != "none" or cfg.finetune_steps > 0 or hasattr(algorithm, "personal_model")


def sites_differ(cfg: Any, algorithm: Any) -> bool:
    """Whether the sites' models differ during training (personal entries, Ditto's v)."""
    return cfg.personal != "none" or hasattr(algorithm, "personal_model")


def personalized(setup: Setup) -> bool:
    """Whether the run ends with one model per site (``model.personal``, fine-tuning, Ditto)."""
    return ends_personal(setup.config, setup.algorithm)


def finish_personal(setup: Setup) -> tuple[tuple[Tree, Tree], dict[str, Any] | None]:
    """(the global model, summary.json's ``personal`` block or None): fine-tunes on every rank;
    the per-site block needs every site in this process (not the distributed engine)."""
    sim, cfg = setup.simulation, setup.config
    global_model = sim.global_model()
    if not personalized(setup):
        return global_model, None
    if remote_sites(setup):  # the sites fine-tuned and scored themselves; their models stay there
        return global_model, sim.personal_summary()
    fine_tune(sim, cfg.finetune_steps)
    if cfg.engine == "distributed" or not sim.is_primary:
        return global_model, None
    block = {"personal": cfg.personal, "finetune_steps": cfg.finetune_steps}
    return global_model, block | site_metrics(setup.problem, site_models(sim), global_model, setup.data)


def _site_rows_during_training(setup: Setup) -> bool:
    """Sites differ during training (personal entries, Ditto) and all of them are in this process."""
    return (
        sites_differ(setup.config, setup.algorithm)
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
    return history_fields(setup.data.num_clients)


def personal_row(setup: Setup) -> dict[str, Any]:
    """The per-site numbers of an evaluation row (empty when the run is not personalized)."""
    if remote_sites(setup):
        return setup.simulation.personal_row()
    if not _site_rows_during_training(setup):
        return {}
    return history_row(personal_evaluation(setup.simulation, setup.problem, setup.data))


def save_site_models(setup: Setup, folder: RunFolder, block: dict[str, Any]) -> dict[str, Any]:
    """Write each site's own model as ``site_<k>.pt`` (``model.pt``'s format, so any command that
    reads a model file reads it); the block gains ``site_models``: file name → sha256 (remote
    sites: none here, each site writes its own)."""
    if remote_sites(setup):
        return block
    data, shape = setup.data.data, setup.data.data.input_shape
    files = {}
    for k, (params, buffers) in enumerate(site_models(setup.simulation)):
        name = f"site_{k}.pt"
        files[name] = folder.save_model(
            setup.config.model, shape, setup.problem.num_labels, params, buffers, name, data.preprocessing
        )
    return block | {"site_models": files}

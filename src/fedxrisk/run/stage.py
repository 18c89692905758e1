"""A two-stage run's first stage (``[pretrain]``, see :mod:`fedxrisk.run.recipes`): its keys, its
algorithm and :func:`pretrain_config`, the stage's own :class:`~fedxrisk.run.spec.RunConfig`. No torch."""

from __future__ import annotations

import dataclasses
from typing import Any

from fedxrisk.catalog import algorithm
from fedxrisk.errors import ConfigError
from fedxrisk.run.spec import RunConfig

PRETRAIN_ALGORITHM = "localsgdm"  # cross-entropy FedAvg with local momentum
CENTRALIZED = "centralized"  # PRETRAIN_ALGORITHM on one client holding all training data
STAGE_KEYS = (
    "algorithm", "rounds", "lr", "local_steps", "batch_size", "stages", "lr_decay", "window_growth",
    "eval_every", "checkpoint_every", "reset_head",
)  # fmt: skip
INHERITED = ("rounds", "batch_size", "stages", "lr_decay", "window_growth", "eval_every", "checkpoint_every")


def stage_algorithm(name: str) -> str:
    """The registry key a ``pretrain.algorithm`` value trains with."""
    return PRETRAIN_ALGORITHM if name == CENTRALIZED else name


def check_stage_algorithm(name: Any) -> None:
    """``pretrain.algorithm`` is ``centralized`` or a registered algorithm."""
    from fedxrisk.catalog import table

    if name != CENTRALIZED and algorithm(name) is None:
        raise ConfigError(
            f"pretrain.algorithm: unknown algorithm {name!r}; choose {CENTRALIZED!r} or one of {sorted(table('algorithms'))}"
        )


def pretrain_config(cfg: RunConfig) -> RunConfig:
    """The first stage's RunConfig: ``cfg`` with the ``[pretrain]`` settings applied."""
    if cfg.pretrain is None:
        raise ValueError("this config has no [pretrain] section")
    p = dict(cfg.pretrain)
    name = p.pop("algorithm", PRETRAIN_ALGORITHM)
    stage = {k: p.pop(k) for k in STAGE_KEYS if k in p}
    changes: dict[str, Any] = {k: stage[k] for k in INHERITED if k in stage}
    changes |= {
        "algorithm": stage_algorithm(name),
        "lr": stage.get("lr"),
        "local_steps": stage.get("local_steps"),
        "options": p,  # what is left: the pretrain algorithm's hyperparameters
        "reset_head": stage.get("reset_head", False),
        "pretrain": None,
    }
    if name == CENTRALIZED:
        changes |= {"clients": 1, "partition": "iid", "clients_per_rank": 1}
    return dataclasses.replace(cfg, **changes)

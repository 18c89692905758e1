"""Two-stage runs: a ``[pretrain]`` stage, then the main (AUC) stage from its model.

The FDAM chest X-ray protocol (Yuan et al. 2021, §6.2) and LibAUC's practice:
train with cross-entropy first, then continue from that network with an AUC
loss (``model.reset_head = true`` discards the cross-entropy classifier).

Config::

    [pretrain]
    algorithm = "localsgdm"   # default: cross-entropy FedAvg; "centralized": one client, all data
    rounds = 20               # keys not given take the main stage's value, except
    lr = 0.1                  # algorithm, lr, local_steps and hyperparameters (the
    momentum = 0.9            # pretrain algorithm's defaults) and reset_head (false)

Data, model, seed and engine are shared; ``model.init_from`` is where the *first*
stage starts. Run folder::

    RUN/config.toml           the whole two-stage config (re-runnable)
    RUN/pretrain/             a complete run folder of stage 1 (config.toml, history.csv,
                              summary.json, model.pt; checkpoint.pt while unfinished)
    RUN/history.csv, summary.json, model.pt   the main stage; its history starts with a
                              round-0 row (the pretrained model's metrics) and its
                              summary's ``init`` records the source and stage 1's summary

``fedxrisk run --resume RUN`` continues whichever stage was interrupted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.experiment import (
    CHECKPOINT,
    ConfigError,
    RunConfig,
    RunResult,
    Setup,
    _train,
    build,
    load_checkpoint,
    start_run_folder,
    validate,
)
from fedxrisk.validate import refuse_run

PRETRAIN_DIR = "pretrain"
PRETRAIN_ALGORITHM = "localsgdm"  # cross-entropy FedAvg with local momentum
CENTRALIZED = "centralized"  # PRETRAIN_ALGORITHM on one client holding all training data
STAGE_KEYS = (
    "algorithm", "rounds", "lr", "local_steps", "batch_size", "stages", "lr_decay", "window_growth",
    "eval_every", "checkpoint_every", "reset_head",
)  # fmt: skip
INHERITED = ("rounds", "batch_size", "stages", "lr_decay", "window_growth", "eval_every", "checkpoint_every")
SUMMARY_KEYS = ("status", "algorithm", "rounds", "final", "best", "wall_seconds", "communication")
Callback = Callable[[dict[str, Any], int, int], None]


def _algorithm_name(name: str) -> str:
    return PRETRAIN_ALGORITHM if name == CENTRALIZED else name


def _check_algorithm(name: Any) -> None:
    if name != CENTRALIZED and name not in ALGORITHMS:
        raise ConfigError(
            f"pretrain.algorithm: unknown algorithm {name!r}; choose {CENTRALIZED!r} or one of {sorted(ALGORITHMS)}"
        )


def pretrain_from_table(table: Any) -> dict[str, Any]:
    """Type-check a ``[pretrain]`` table (stage keys plus the algorithm's hyperparameters)."""
    from fedxrisk.config import _check, _fields, _unknown, hyperparameter_types

    if not isinstance(table, Mapping):
        raise ConfigError(f"[pretrain] must be a table of keys, got {table!r}")
    name = table.get("algorithm", PRETRAIN_ALGORITHM)
    _check_algorithm(name)
    fields, hparams = _fields(), hyperparameter_types(_algorithm_name(name))
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in STAGE_KEYS:
            out[key] = _check(f"pretrain.{key}", value, fields[key])
        elif key in hparams:
            out[key] = _check(f"pretrain.{key}", value, hparams[key])
        else:
            raise _unknown(
                f"pretrain.{key}", [*STAGE_KEYS, *hparams], f"[pretrain] with algorithm = {name!r}"
            )
    return out


def pretrain_config(cfg: RunConfig) -> RunConfig:
    """The first stage's RunConfig: ``cfg`` with the ``[pretrain]`` settings applied."""
    if cfg.pretrain is None:
        raise ValueError("this config has no [pretrain] section")
    p = dict(cfg.pretrain)
    name = p.pop("algorithm", PRETRAIN_ALGORITHM)
    stage = {k: p.pop(k) for k in STAGE_KEYS if k in p}
    changes: dict[str, Any] = {k: stage[k] for k in INHERITED if k in stage}
    changes |= {
        "algorithm": _algorithm_name(name),
        "lr": stage.get("lr"),
        "local_steps": stage.get("local_steps"),
        "options": p,  # what is left: the pretrain algorithm's hyperparameters
        "reset_head": stage.get("reset_head", False),
        "pretrain": None,
    }
    if name == CENTRALIZED:
        changes |= {"clients": 1, "partition": "iid", "clients_per_rank": 1}
    return dataclasses.replace(cfg, **changes)


def check_pretrain(cfg: RunConfig) -> None:
    """Validate the first stage as a run of its own; messages name ``pretrain.KEY``."""
    from fedxrisk.config import qualify

    if not isinstance(cfg.pretrain, Mapping):
        raise ConfigError(f"pretrain must be a dict of settings or None, got {cfg.pretrain!r}")
    unknown = set(cfg.pretrain) - set(STAGE_KEYS)
    name = cfg.pretrain.get("algorithm", PRETRAIN_ALGORITHM)
    _check_algorithm(name)
    unknown -= set(ALGORITHMS[_algorithm_name(name)].hyperparameters())
    if unknown:
        raise ConfigError(
            f"unknown pretrain key(s) {sorted(unknown)}; allowed: {[*STAGE_KEYS]} and hyperparameters"
        )
    if name == CENTRALIZED and cfg.engine == "distributed":
        raise ConfigError(
            "pretrain.algorithm: 'centralized' runs in one process; use engine loop, vmap or compile"
        )
    stage, names = pretrain_config(cfg), dict.fromkeys([*STAGE_KEYS, *cfg.pretrain], "pretrain")
    try:
        validate(stage)
    except ConfigError as e:
        raise ConfigError(qualify(str(e), names)) from None
    try:  # the algorithm's own range checks, before any data is loaded
        ALGORITHMS[stage.algorithm](None, **stage.options)  # type: ignore[arg-type]
    except ValueError as e:
        raise ConfigError(f"{qualify(str(e), names)} ({stage.algorithm})") from None
    except Exception:  # the constructor needs a real problem: checked when the stage is built
        pass


def _summary_of(folder: Path) -> dict[str, Any]:
    summary = json.loads((folder / "summary.json").read_text())
    if summary.get("status") != "completed":
        raise ConfigError(
            f"{folder} (the pretrain stage) ended with status {summary.get('status')!r}: "
            f"{summary.get('error')}; the main stage needs its model.pt"
        )
    return summary


def _finish_stage1(setup: Setup, folder: Path, callback: Callback | None, ckpt: dict[str, Any] | None):
    """Train stage 1 to its end; its summary and final network, in memory (under torchrun every
    rank holds it, so no rank waits for rank 0 to write ``model.pt``)."""
    result = _train(setup, folder, callback, ckpt)
    params, buffers = setup.simulation.global_model()
    return result.summary, {k: v.detach().clone() for k, v in {**params, **buffers}.items()}  # no views


def _main_stage(
    cfg: RunConfig,
    out: Path,
    callback: Callback | None,
    ckpt: dict[str, Any] | None,
    data_from: Setup | None = None,
    stage1: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> RunResult:
    """Build the main stage from stage 1's network (``stage1``, else ``out/pretrain``) and train it."""
    if stage1 is None:
        stage1 = _summary_of(out / PRETRAIN_DIR), None
    pre, weights = stage1
    setup = build(cfg, init=weights if weights is not None else out / PRETRAIN_DIR, data_from=data_from)
    setup.init = {
        **(setup.init or {}),
        "from": PRETRAIN_DIR,
        "pretrain": {k: pre.get(k) for k in SUMMARY_KEYS},
    }
    if ckpt is not None:
        setup.simulation.load_state_dict(ckpt["simulation"])
    return _train(setup, out, callback, ckpt)


def run_two_stage(cfg: RunConfig, out: Path, callback: Callback | None = None) -> RunResult:
    """Stage 1 in ``out/pretrain``, then the main stage in ``out`` from its network.

    Both stages are built (data loaded, ``init_from`` read) before anything is written.
    """
    main = build(cfg)  # validates the main stage and loads its data
    pcfg = pretrain_config(cfg)
    shared = cfg.pretrain.get("algorithm") != CENTRALIZED  # type: ignore[union-attr]
    pre = build(pcfg, data_from=main if shared else None)
    main.simulation = main.algorithm = main.problem = None  # type: ignore[assignment]  # keep only the data
    if pre.simulation.is_primary:
        refuse_run(out, (PRETRAIN_DIR,))  # re-checked: the data took time to load
        start_run_folder(cfg, out)
        start_run_folder(pcfg, out / PRETRAIN_DIR)
    stage1 = _finish_stage1(pre, out / PRETRAIN_DIR, callback, None)
    del pre  # stage 1's client states
    return _main_stage(cfg, out, callback, None, main, stage1)


def resume_two_stage(
    cfg: RunConfig, out: Path, ckpt: dict[str, Any] | None, callback: Callback | None = None
) -> RunResult:
    """Continue a killed two-stage run: finish stage 1 if needed, then the main stage."""
    folder = out / PRETRAIN_DIR
    stage1 = None
    if ckpt is None and not (folder / "summary.json").exists():
        pre = build(pretrain_config(cfg))
        pre_ckpt = load_checkpoint(folder / CHECKPOINT) if (folder / CHECKPOINT).exists() else None
        if pre_ckpt is not None:
            pre.simulation.load_state_dict(pre_ckpt["simulation"])
        elif pre.simulation.is_primary:  # killed before stage 1's first checkpoint
            start_run_folder(pre.config, folder)
        stage1 = _finish_stage1(pre, folder, callback, pre_ckpt)
        del pre, pre_ckpt  # stage 1's client states
    return _main_stage(cfg, out, callback, ckpt, stage1=stage1)

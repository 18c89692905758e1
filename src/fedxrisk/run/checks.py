"""Every check of a run's settings, run once per run, before any data is loaded or output written.

:func:`check` is the entry: it validates a :class:`RunConfig` (and a two-stage
run's first stage) and returns a :class:`CheckedConfig`; the config remembers
that it passed, so building, the two stages and a config read from a file do
not check it again unless it changed. Each check raises :class:`ConfigError`
(exit status 2 at the CLI) with one line naming the setting.

No torch: names, types and ranges are checked against the catalogue
(:mod:`fedxrisk.catalog`), so that a config error costs a fraction of a second
(tests/test_startup.py). Only a non-CPU device and the algorithms' own range checks of
hyperparameters that are set (:func:`check_hyperparameters`) load torch, last.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedxrisk.catalog import table
from fedxrisk.engines.launch import check_launch
from fedxrisk.errors import ConfigError, missing_data_dir
from fedxrisk.run.privacy import check_privacy
from fedxrisk.run.spec import (
    CENTRALIZED,
    PRETRAIN_ALGORITHM,
    STAGE_KEYS,
    RunConfig,
    check_stage_algorithm,
    pretrain_config,
    stage_algorithm,
)


@dataclass(frozen=True)
class CheckedConfig:
    """A config that passed :func:`check`; ``pretrain``: its first stage's, checked too."""

    config: RunConfig
    pretrain: CheckedConfig | None = None


_MARK = "_fedxrisk_checked"  # instance attribute (not a field): (repr when checked, CheckedConfig)


def check(cfg: RunConfig | CheckedConfig) -> CheckedConfig:
    """``cfg`` checked: :func:`validate` runs unless this very config (unchanged) passed already."""
    if isinstance(cfg, CheckedConfig):
        return cfg
    mark = cfg.__dict__.get(_MARK)
    if mark is not None and mark[0] == repr(cfg):
        return mark[1]
    stage = validate(cfg)
    checked = CheckedConfig(cfg, stage)
    cfg.__dict__[_MARK] = (repr(cfg), checked)
    return checked


def _choice(name: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; choose one of {sorted(allowed)}")


def validate(cfg: RunConfig) -> CheckedConfig | None:
    """Check every setting that can be checked without loading data; the checked first stage, if any."""
    algorithms = table("algorithms")
    _choice("algorithm", cfg.algorithm, algorithms)
    for name, key in (("dataset", "datasets"), ("partition", "partitions"), ("model", "models"),
                      ("engine", "engines"), ("buffer_policy", "buffer_policies"),
                      ("pos_ratio_mode", "pos_ratio_modes")):  # fmt: skip
        _choice(name, getattr(cfg, name), table(key))
    if cfg.imratio is not None and not 0.0 < cfg.imratio < 1.0:
        raise ConfigError(f"imratio must lie in (0, 1), got {cfg.imratio}")
    for name in ("clients", "rounds", "batch_size", "eval_every", "stages"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be ≥ 1, got {getattr(cfg, name)}")
    if cfg.lr is not None and cfg.lr <= 0:
        raise ConfigError(f"lr must be > 0, got {cfg.lr}")
    if cfg.checkpoint_every < 0:
        raise ConfigError(f"checkpoint_every must be ≥ 0 (0: no checkpoints), got {cfg.checkpoint_every}")
    _check_stream_settings(cfg)
    _check_selection(cfg)
    if cfg.dirichlet_alpha <= 0:
        raise ConfigError(f"dirichlet_alpha must be > 0, got {cfg.dirichlet_alpha}")
    steps = cfg.resolved_local_steps()
    fixed = algorithms[cfg.algorithm]["window"]
    if fixed is not None and steps != fixed:
        raise ConfigError(
            f"{cfg.algorithm} communicates every {fixed} step(s); local_steps must be {fixed}, got {steps}"
        )
    validate_settings(cfg)
    _validate_batches(cfg)
    check_privacy(cfg)
    _check_personal(cfg)
    known = algorithms[cfg.algorithm]["hyperparameters"]
    unknown = sorted(set(cfg.options) - set(known))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown} for {cfg.algorithm}; allowed: {sorted(known)}")
    try:
        if cfg.engine == "distributed":
            check_launch(cfg.clients, cfg.clients_per_rank, cfg.dist_timeout)
        from fedxrisk.schedule import Schedule  # torch-free

        Schedule.build(cfg.rounds, steps, cfg.resolved_lr(), cfg.stages, cfg.lr_decay, cfg.window_growth)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    check_device(cfg.device)
    return check_pretrain(cfg) if cfg.pretrain is not None else None


SELECTIONS = ("last", "best")
MONITORS = ("val_auroc", "val_ap", "val_pauc30_norm", "val_pauc50_norm")  # engines/validation.py VAL_KEYS


def _check_selection(cfg: RunConfig) -> None:
    """``validation`` is 0, a fraction in (0, 1), "official" or "auto"; ``selection``, ``monitor``
    and ``early_stopping`` are known, and the last two need validation data."""
    v = cfg.validation
    if isinstance(v, str) and v not in ("official", "auto"):
        raise ConfigError(f"validation: expected a fraction in (0, 1), 'official' or 'auto', got {v!r}")
    if not isinstance(v, str) and not (v == 0 or 0.0 < v < 1.0):
        raise ConfigError(f"validation must be 0 (none) or a fraction in (0, 1), got {v}")
    _choice("selection", cfg.selection, SELECTIONS)
    if cfg.monitor is not None:
        _choice("monitor", cfg.monitor, MONITORS)
    if cfg.early_stopping < 0:
        raise ConfigError(f"early_stopping must be ≥ 0 (0: off), got {cfg.early_stopping}")
    needs = (
        "selection = 'best'" if cfg.selection == "best" else "early_stopping" if cfg.early_stopping else None
    )
    if needs and v == 0:
        raise ConfigError(f"{needs} chooses on validation data: set data.validation (e.g. 0.2 or 'auto')")


def _check_stream_settings(cfg: RunConfig) -> None:
    from fedxrisk.data.preprocessing import AUGMENTATIONS, IMAGE_DATASETS, normalization
    from fedxrisk.data.stream_choice import (
        ON_BAD_FILE,
        STREAM_CHOICES,
        check_cache,
        eval_batch_size,
        parse_bytes,
    )

    if cfg.stream not in STREAM_CHOICES or not isinstance(cfg.stream, (bool, str)):
        raise ConfigError(f'data.stream must be true, false or "auto", got {cfg.stream!r}')
    from fedxrisk.data.stream_choice import MAX_WORKERS

    if cfg.workers is not None and not 0 <= cfg.workers <= MAX_WORKERS:
        raise ConfigError(
            f"data.workers must be between 0 (decode in the training process) and {MAX_WORKERS}, got {cfg.workers}"
        )
    _choice("data.on_bad_file", cfg.on_bad_file, ON_BAD_FILE)
    try:
        parse_bytes(cfg.memory_budget)
        eval_batch_size((1,), 1, cfg.eval_batch_size)
        normalization(cfg.normalize)
        check_cache(getattr(cfg, "cache", False), cfg.dataset, cfg.stream, IMAGE_DATASETS)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    size = cfg.image_size
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 4096):
        raise ConfigError(f"data.image_size must be an integer between 1 and 4096, got {size!r}")
    _choice("data.augment", cfg.augment, AUGMENTATIONS)
    images = size is not None or cfg.normalize not in (None, "none") or cfg.augment != "none"
    if images and cfg.dataset not in IMAGE_DATASETS:
        raise ConfigError(
            f"data.image_size, data.normalize and data.augment apply to image datasets {list(IMAGE_DATASETS)}, not {cfg.dataset!r}"
        )


def _validate_batches(cfg: RunConfig) -> None:
    """data.num_samples and class-aware batches (data.positives_per_batch), before any data."""
    sized = table("sized_datasets")
    if cfg.num_samples is not None and (cfg.dataset not in sized or cfg.num_samples < 100):
        raise ConfigError(
            f"num_samples sizes a generated dataset {list(sized)} and must be ≥ 100, "
            f"got {cfg.num_samples} for {cfg.dataset!r}"
        )
    p = cfg.positives_per_batch
    owns = "positives_per_batch" in table("algorithms")[cfg.algorithm]["hyperparameters"]  # FeDXL's B1
    if "positives_per_batch" in cfg.options and not owns:
        raise ConfigError(
            f"positives_per_batch is a data setting for {cfg.algorithm}: use data.positives_per_batch "
            "(--set data.positives_per_batch=N); it works for every algorithm"
        )
    own = cfg.options.get("positives_per_batch")
    if p and own is not None and own != p:
        raise ConfigError(f"positives_per_batch = {p} but the {cfg.algorithm} option says {own}; set one")


FINITE = ("lr", "lr_decay", "window_growth", "dirichlet_alpha", "imratio", "dist_timeout")


def validate_settings(cfg: Any) -> None:
    """Settings the type checks let through: NaN/inf numbers, a negative seed, an unknown
    device, an empty positive-class list, distributed-only settings on another engine."""
    for name in FINITE:
        value = getattr(cfg, name, None)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value}")
    for name, value in cfg.options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"algorithm.{name} must be a finite number, got {value} ({cfg.algorithm})")
    if cfg.seed < 0:
        raise ConfigError(f"seed must be ≥ 0, got {cfg.seed}")
    if cfg.test_imratio is not None and not 0 < cfg.test_imratio < 1:
        raise ConfigError(f'data.test_imratio must lie in (0, 1), or be "none", got {cfg.test_imratio}')
    if cfg.positive_classes is not None and len(cfg.positive_classes) == 0:
        raise ConfigError(
            "positive_classes is empty: name at least one class, or leave the key out for the default "
            "(the upper half of the classes)"
        )
    if cfg.engine != "distributed" and str(cfg.clients_per_rank) != "1":
        raise ConfigError(
            f"clients_per_rank = {cfg.clients_per_rank!r} applies to engine = 'distributed' only "
            f"(engine is {cfg.engine!r}); drop it"
        )


def check_data_dir(cfg: RunConfig) -> None:
    """A file dataset's ``data_dir`` is set and exists (the reader's own message, without torch).

    Called by ``fedxrisk run`` before anything heavy is imported; the library leaves it to the
    reader, so that a config can be checked where the data is not (a Flower server)."""
    layout = table("file_datasets").get(cfg.dataset)
    missing = None if not layout else missing_data_dir(cfg.dataset, cfg.data_dir, layout)
    if missing is not None:
        raise ConfigError(str(missing))


def check_device(device: str) -> None:
    """``device`` names a torch device type that this machine has."""
    if device == "cpu":  # the default: no need to load torch to know
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device {device!r} is not a torch device; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {device!r} requested but MPS is not available")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device {device!r}: only cpu, cuda and mps are supported")


def check_pretrain(cfg: RunConfig) -> CheckedConfig:
    """Check the first stage as a run of its own; messages name ``pretrain.KEY``."""
    if not isinstance(cfg.pretrain, Mapping):
        raise ConfigError(f"pretrain must be a dict of settings or None, got {cfg.pretrain!r}")
    unknown = set(cfg.pretrain) - set(STAGE_KEYS)
    name = cfg.pretrain.get("algorithm", PRETRAIN_ALGORITHM)
    check_stage_algorithm(name)
    unknown -= set(table("algorithms")[stage_algorithm(name)]["hyperparameters"])
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
        checked = check(stage)
    except ConfigError as e:
        raise ConfigError(qualify(str(e), names)) from None
    if not stage.options:  # the defaults pass the algorithm's own checks
        return checked
    from fedxrisk.algorithms import ALGORITHMS  # torch from here on

    try:  # the algorithm's own range checks, before any data is loaded
        ALGORITHMS[stage.algorithm](None, **stage.options)  # type: ignore[arg-type]
    except ValueError as e:
        raise ConfigError(f"{qualify(str(e), names)} ({stage.algorithm})") from None
    except Exception:  # the constructor needs a real problem: checked when the stage is built
        pass
    return checked


def qualify(message: str, sections: Mapping[str, str]) -> str:
    """Name the key with its section: ``imratio must …`` → ``data.imratio must …``,
    ``unknown dataset 'x'; …`` → ``unknown dataset 'x' (data.dataset); …``."""
    m = re.match(r"(unknown (?:option\(s\) )?)?(\w+)(.*)", message, re.S)
    if not m or m.group(2) not in sections or m.group(3).startswith("."):  # already qualified
        return message
    unknown, name, rest = m.groups()
    if unknown:
        value, sep, tail = rest.partition(";")
        return f"{unknown}{name}{value} ({sections[name]}.{name}){sep}{tail}"
    return f"{sections[name]}.{name}{rest}"


def check_hyperparameters(cfg: RunConfig) -> None:
    """Let the algorithm's own ``__post_init__`` range checks run now, before any data is loaded
    (this loads torch; with no options set there is nothing to check)."""
    if not cfg.options:
        return
    from fedxrisk.algorithms import ALGORITHMS

    try:
        ALGORITHMS[cfg.algorithm](None, **cfg.options)  # type: ignore[arg-type]
    except ValueError as e:
        message = qualify(str(e), dict.fromkeys(cfg.options, "algorithm"))
        raise ConfigError(f"{message} ({cfg.algorithm})") from e
    except Exception:  # the constructor needs a real problem: checked when the run is built
        pass


PERSONAL = ("none", "bn", "head")  # fedxrisk.problem.PERSONAL (this module imports no torch)


def _check_personal(cfg: Any) -> None:
    """``model.personal`` and ``algorithm.finetune_steps`` (fedxrisk.engines.personal)."""
    _choice("personal", cfg.personal, PERSONAL)
    if cfg.finetune_steps < 0:
        raise ConfigError(f"finetune_steps must be ≥ 0 (0: no fine-tuning), got {cfg.finetune_steps}")
    if cfg.personal != "none" and cfg.privacy and cfg.privacy.get("level", "client") == "client":
        raise ConfigError(
            f"model.personal = {cfg.personal!r} with privacy.level = 'client': the evaluated model would "
            "average the sites' personal entries without noise; use personal = 'none'"
        )

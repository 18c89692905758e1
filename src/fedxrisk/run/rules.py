"""The rules of a run's settings: :func:`declared` checks each setting against the values it declares
(:class:`~fedxrisk.run.fields.Allowed`); the rest are one function each: ``rule(cfg)``
raises one :class:`ConfigError` (one line, naming the setting without its section) or returns. :data:`CHECKS` reads only the config
and the catalogue; :data:`ALGORITHM_CHECKS` need a registered algorithm. :mod:`fedxrisk.run.checks`
runs every rule and collects the errors; no torch here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fedxrisk.catalog import table
from fedxrisk.engines.launch import check_launch
from fedxrisk.errors import ConfigError, raise_all
from fedxrisk.run import combos
from fedxrisk.run.configtypes import MISMATCH, coerce
from fedxrisk.run.fields import PERSONAL, PERSONAL_MONITORS, SELECTIONS  # noqa: F401  (re-exported)
from fedxrisk.run.privacy_rules import check_privacy
from fedxrisk.run.spec import RunConfig, settings


def declared(cfg: RunConfig) -> None:
    """Every setting within the values it declares (:class:`~fedxrisk.run.fields.Allowed`): each refusal."""
    errors = []
    for name, s in settings().items():
        allowed, value = s.allowed, getattr(cfg, name)
        if allowed is None or value is None or coerce(value, s.hint) is MISMATCH:
            continue  # a wrong type: type_errors (run/checks.py) reports it
        if allowed.choices is not None:
            choices = table(allowed.choices) if isinstance(allowed.choices, str) else allowed.choices
            if value not in choices:
                errors.append(ConfigError(f"unknown {name} {value!r}; choose one of {sorted(choices)}"))
            continue
        inside = (
            (allowed.above is None or value > allowed.above)
            and (allowed.at_least is None or value >= allowed.at_least)
            and (allowed.below is None or value < allowed.below)
            and (allowed.at_most is None or value <= allowed.at_most)
        )
        if allowed.finite and not math.isfinite(value):
            errors.append(ConfigError(f"{name} must be a finite number, got {value}"))
        elif not inside:
            errors.append(ConfigError(f"{name} must {allowed.bounds()}{allowed.note}, got {value}"))
    raise_all(errors)


def _choice(name: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; choose one of {sorted(allowed)}")


MONITORS = (
    "val_auroc",
    "val_ap",
    "val_pauc30_norm",
    "val_pauc50_norm",
    "val_cindex",
)  # engines/validation.py VAL_KEYS
SURVIVAL_MONITORS = ("val_cindex",)  # survival data's (engines/validation.py exact_validation)
# a site monitor's metric: personalization is a binary task's
BINARY_MONITORS = tuple(m for m in MONITORS if m not in SURVIVAL_MONITORS)
SITE_MONITORS = tuple(f"site_{m}_{a}" for m in BINARY_MONITORS for a in PERSONAL_MONITORS)  # site_validation


def _validation(cfg: RunConfig) -> None:
    """``validation`` is 0, a fraction in (0, 1), "official" or "auto"."""
    v = cfg.validation
    if isinstance(v, str) and v not in ("official", "auto"):
        raise ConfigError(f"validation: expected a fraction in (0, 1), 'official' or 'auto', got {v!r}")
    if not isinstance(v, str) and not (v == 0 or 0.0 < v < 1.0):
        raise ConfigError(f"validation must be 0 (none) or a fraction in (0, 1), got {v}")


def _monitor(cfg: RunConfig) -> None:
    if cfg.monitor is not None:
        if cfg.monitor not in SITE_MONITORS:  # site_<val_*>_<aggregate>: docs/personalization.md
            _choice("monitor", cfg.monitor, MONITORS)
        if cfg.monitor in SITE_MONITORS and not cfg.sites_train_own_models():
            raise ConfigError(
                f"monitor {cfg.monitor!r} follows the sites' own models: it needs model.personal (or Ditto) "
                "on an in-process engine; use a val_* monitor"
            )
        if cfg.monitor in SITE_MONITORS and cfg.privacy is not None:
            raise ConfigError(
                f"monitor {cfg.monitor!r} under [privacy]: the sites' validation values are not released "
                "through DP, so choosing on them would spend privacy ε does not count; use a val_* monitor"
            )


def _needs_validation(cfg: RunConfig) -> None:
    needs = (
        "selection = 'best'"
        if cfg.selection == "best"
        else "early_stopping"
        if cfg.early_stopping > 0
        else None
    )
    if needs and cfg.validation == 0:
        raise ConfigError(f"{needs} chooses on validation data: set data.validation (e.g. 0.2 or 'auto')")


def _stream_choice(cfg: RunConfig) -> None:
    from fedxrisk.data.stream_choice import STREAM_CHOICES

    if cfg.stream not in STREAM_CHOICES or not isinstance(cfg.stream, (bool, str)):
        raise ConfigError(f'data.stream must be true, false or "auto", got {cfg.stream!r}')


def _missing(cfg: RunConfig) -> None:
    from fedxrisk.data.missing import MISSING_DATASETS, POLICIES

    _choice("data.on_missing", cfg.on_missing, POLICIES)
    if cfg.on_missing != "error" and cfg.dataset not in MISSING_DATASETS:
        raise ConfigError(
            f"data.on_missing applies to {', '.join(MISSING_DATASETS)} CSVs, not {cfg.dataset!r}; drop it"
        )


def _workers(cfg: RunConfig) -> None:
    from fedxrisk.data.stream_choice import MAX_WORKERS

    if cfg.workers is not None and not 0 <= cfg.workers <= MAX_WORKERS:
        raise ConfigError(
            f"data.workers must be between 0 (decode in the training process) and {MAX_WORKERS}, got {cfg.workers}"
        )


def _on_bad_file(cfg: RunConfig) -> None:
    from fedxrisk.data.stream_choice import ON_BAD_FILE

    _choice("data.on_bad_file", cfg.on_bad_file, ON_BAD_FILE)


def _reading(cfg: RunConfig) -> None:
    """Memory budget, evaluation batch, normalization and cache: the data layer's own parsers, whose
    ValueError is the one-line refusal; each one's."""
    from fedxrisk.data.preprocessing import IMAGE_DATASETS, normalization
    from fedxrisk.data.stream_choice import check_cache, eval_batch_size, parse_bytes

    errors = []
    for parse in (
        lambda: parse_bytes(cfg.memory_budget),
        lambda: eval_batch_size((1,), 1, cfg.eval_batch_size),
        lambda: normalization(cfg.normalize),
        lambda: check_cache(cfg.cache, cfg.dataset, cfg.stream, IMAGE_DATASETS),
    ):
        try:
            parse()
        except ValueError as e:  # a ConfigError is one too
            errors.append(e if isinstance(e, ConfigError) else ConfigError(str(e)))
    raise_all(errors)


def _augment(cfg: RunConfig) -> None:
    from fedxrisk.data.preprocessing import AUGMENTATIONS

    _choice("data.augment", cfg.augment, AUGMENTATIONS)


def _image_dataset(cfg: RunConfig) -> None:
    from fedxrisk.data.preprocessing import IMAGE_DATASETS

    size = cfg.image_size
    images = size is not None or cfg.normalize not in (None, "none") or cfg.augment != "none"
    if images and cfg.dataset not in IMAGE_DATASETS:
        raise ConfigError(
            f"data.image_size, data.normalize and data.augment apply to image datasets {list(IMAGE_DATASETS)}, not {cfg.dataset!r}"
        )


def _num_samples(cfg: RunConfig) -> None:
    sized = table("sized_datasets")
    if cfg.num_samples is not None and (cfg.dataset not in sized or cfg.num_samples < 100):
        raise ConfigError(
            f"num_samples sizes a generated dataset {list(sized)} and must be ≥ 100, "
            f"got {cfg.num_samples} for {cfg.dataset!r}"
        )


def _positive_classes(cfg: RunConfig) -> None:
    if cfg.positive_classes is not None and len(cfg.positive_classes) == 0:
        raise ConfigError(
            "positive_classes is empty: name at least one class, or leave the key out for the default "
            "(the upper half of the classes)"
        )


def _clients_per_rank(cfg: RunConfig) -> None:
    if cfg.engine != "distributed" and str(cfg.clients_per_rank) != "1":
        raise ConfigError(
            f"clients_per_rank = {cfg.clients_per_rank!r} applies to engine = 'distributed' only "
            f"(engine is {cfg.engine!r}); drop it"
        )


def _launch(cfg: RunConfig) -> None:
    if cfg.engine == "distributed":
        try:
            check_launch(cfg.clients, cfg.clients_per_rank, cfg.dist_timeout)
        except ValueError as e:  # the launcher's refusal of the layout or the rendezvous variables
            raise ConfigError(str(e)) from None


def _personal_dp(cfg: RunConfig) -> None:
    if cfg.personal in PERSONAL[1:] and cfg.privacy and cfg.privacy.get("level", "client") == "client":
        raise ConfigError(
            f"model.personal = {cfg.personal!r} with privacy.level = 'client': the evaluated model would "
            "average the sites' personal entries without noise; use personal = 'none'"
        )


CHECKS: tuple[Callable[[RunConfig], None], ...] = (
    declared, _stream_choice, _workers, _on_bad_file, _missing, _reading, _augment,
    _image_dataset, _validation, _monitor, _needs_validation, _positive_classes, _clients_per_rank,
    _num_samples, _launch, _personal_dp,
    *combos.CHECKS,  # settings that meet each other (run/combos.py)
)  # fmt: skip


def _window(cfg: RunConfig) -> None:
    steps, fixed = cfg.resolved_local_steps(), table("algorithms")[cfg.algorithm]["window"]
    if fixed is not None and steps != fixed:
        raise ConfigError(
            f"{cfg.algorithm} communicates every {fixed} step(s); local_steps must be {fixed}, got {steps}"
        )


def _options(cfg: RunConfig) -> None:
    """Option names the algorithm declares; ``positives_per_batch`` is a data setting but FeDXL's."""
    known = table("algorithms")[cfg.algorithm]["hyperparameters"]
    if "positives_per_batch" in cfg.options and "positives_per_batch" not in known:
        raise ConfigError(
            f"positives_per_batch is a data setting for {cfg.algorithm}: use data.positives_per_batch "
            "(--set data.positives_per_batch=N); it works for every algorithm"
        )
    unknown = sorted(set(cfg.options) - set(known))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown} for {cfg.algorithm}; allowed: {sorted(known)}")
    own, p = cfg.options.get("positives_per_batch"), cfg.positives_per_batch
    if p and own is not None and own != p:
        raise ConfigError(f"positives_per_batch = {p} but the {cfg.algorithm} option says {own}; set one")


def _schedule(cfg: RunConfig) -> None:
    """The step-size schedule builds (numbers that failed their own checks are not read again)."""
    if (
        cfg.rounds < 1
        or cfg.stages < 1
        or (cfg.lr is not None and cfg.lr <= 0)
        or cfg.resolved_local_steps() < 1
        or not math.isfinite(cfg.lr_decay * cfg.window_growth)
    ):
        return
    try:
        schedule(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def schedule(cfg: RunConfig) -> Any:
    """The run's :class:`~fedxrisk.schedule.Schedule` (raises ValueError on bad numbers)."""
    from fedxrisk.schedule import Schedule  # torch-free

    return Schedule.build(
        cfg.rounds, cfg.resolved_local_steps(), cfg.resolved_lr(), cfg.stages, cfg.lr_decay, cfg.window_growth
    )


def tune_under_privacy(
    cfg: RunConfig, command: str = "tune", does: str = "chooses across trials that each train"
) -> None:
    """``fedxrisk tune`` (and ``compare``) under DP is refused: several trainings on the same private
    data compose into one ε, which no ledger records (docs/privacy.md)."""
    if cfg.privacy is not None:
        raise ConfigError(
            f"privacy: fedxrisk {command} {does} on the private data; their "
            f"composition is not accounted: {command} without [privacy] on public or synthetic data"
        )


ALGORITHM_CHECKS = (_window, _options, check_privacy, _schedule, *combos.ALGORITHM_CHECKS)

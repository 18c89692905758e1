"""Every check of a run's settings, in one pass that collects every error.

:func:`check` returns the list of :class:`ConfigError` of a :class:`RunConfig`
(and of a two-stage run's first stage): empty when the config is fine, else one
error per problem, each one line naming the setting as the config file spells it
(``data.imratio must …``). ``fedxrisk check`` prints them all; a run calls
:func:`checked` once where it starts, which raises the first one (saying how many
more there are) and returns a :class:`CheckedConfig`, the proof that it passed:
building and the two stages take it instead of checking again. Nothing is cached
on the config object.

No torch: names, types and ranges are checked against :class:`RunConfig`'s
declared types and the catalogue (:mod:`fedxrisk.catalog`), so that a config
error costs a fraction of a second (tests/test_startup.py). Only a non-CPU device
and the algorithm's own checks (:func:`algorithm_errors`: what its class declares,
run on the values) load torch, last.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from fedxrisk.catalog import table
from fedxrisk.errors import ConfigError, errors_in, missing_data_dir, raise_all
from fedxrisk.run.configtypes import check_value, hyperparameter_types
from fedxrisk.run.rules import ALGORITHM_CHECKS, CHECKS, MONITORS, SELECTIONS, schedule  # noqa: F401  (re-exported)
from fedxrisk.run.spec import RunConfig, settings
from fedxrisk.run.stage import (
    CENTRALIZED,
    PRETRAIN_ALGORITHM,
    STAGE_KEYS,
    check_stage_algorithm,
    pretrain_config,
    stage_algorithm,
)


@dataclass(frozen=True)
class CheckedConfig:
    """A config that passed :func:`check`; ``pretrain``: its first stage's, checked too."""

    config: RunConfig
    pretrain: CheckedConfig | None = None


def check(cfg: RunConfig, thorough: bool = False) -> list[ConfigError]:
    """Every error of ``cfg`` and of its first stage, in a fixed order; ``[]`` when it is fine.

    The algorithm's declared checks load torch: they run when ``cfg.options`` sets hyperparameters
    or when ``thorough`` (``fedxrisk check``); else ``build`` runs them (``validate_schedule``)."""
    sections = {name: s.section for name, s in settings().items() if s.section is not None}
    return [ConfigError(qualify(message, sections)) for message in _messages(cfg, thorough)]


def checked(cfg: RunConfig | CheckedConfig) -> CheckedConfig:
    """``cfg`` as a :class:`CheckedConfig`, or its error raised (several: :class:`ConfigErrors`)."""
    if isinstance(cfg, CheckedConfig):
        return cfg
    raise_all(check(cfg))  # several: a ConfigErrors, its message the first and how many more
    return CheckedConfig(cfg, CheckedConfig(pretrain_config(cfg)) if cfg.pretrain is not None else None)


def validate(cfg: RunConfig) -> None:
    """Raise the first error of ``cfg`` (the old entry point; :func:`check` lists them all)."""
    checked(cfg)


def _messages(cfg: RunConfig, thorough: bool = False, table_name: str = "algorithm") -> list[str]:
    """The messages of every failing check (a type error first, then ranges), the settings not yet
    qualified with their section, hyperparameters with ``table_name`` (``pretrain`` for a stage)."""
    out = type_errors(cfg, table_name)
    typed = not out  # with a value of the wrong type, a range check may meet it: reported already
    for one in CHECKS:
        _collect(partial(one, cfg), out, typed)
    if isinstance(cfg.algorithm, str) and cfg.algorithm in table("algorithms"):
        for one in ALGORITHM_CHECKS:
            _collect(partial(one, cfg), out, typed)
        if typed and (cfg.options or thorough):  # torch from here on
            out += algorithm_errors(cfg, table_name)
    _collect(lambda: check_device(cfg.device), out, typed)
    if cfg.pretrain is not None:
        out += [m for m in pretrain_errors(cfg, thorough) if m not in out]
    return out


def _collect(one: Callable[[], None], out: list[str], typed: bool) -> None:
    """``one()``'s refusals appended to ``out``; a TypeError is a bug only when every value is typed."""
    try:
        one()
    except ConfigError as e:  # a rule may find several (run/privacy_rules.py)
        out += [str(x) for x in errors_in(e)]
    except TypeError:
        if typed:  # every value has its declared type: the check has a bug
            raise


def type_errors(cfg: RunConfig, table_name: str = "algorithm") -> list[str]:
    """A setting (or a known hyperparameter) whose value has not its declared type."""
    out = []
    for name, s in settings().items():
        if s.section is not None:
            _collect(lambda n=name, h=s.hint: check_value(n, getattr(cfg, n), h), out, True)
    if isinstance(cfg.algorithm, str) and cfg.algorithm in table("algorithms"):
        hints = hyperparameter_types(cfg.algorithm)
        for key, value in cfg.options.items() if isinstance(cfg.options, Mapping) else ():
            if key in hints:
                _collect(lambda k=key, v=value: check_value(f"{table_name}.{k}", v, hints[k]), out, True)
    return out


def algorithm_errors(cfg: RunConfig, table_name: str = "algorithm") -> list[str]:
    """What the algorithm declares about its values (``Algorithm.check_values``: its hyperparameter
    checks and ``validate_schedule``), run on ``cfg.options`` before anything is built; loads torch."""
    from fedxrisk.algorithms import ALGORITHMS

    if set(cfg.options) - set(ALGORITHMS[cfg.algorithm].hyperparameters()):
        return []  # unknown options are reported by name already
    try:
        plan = schedule(cfg)
    except ValueError:
        plan = None  # reported by the schedule's check (or its numbers' own): hyperparameters only
    try:
        ALGORITHMS[cfg.algorithm].check_values(cfg.options, plan)
    except ValueError as e:
        message = qualify(str(e), dict.fromkeys(cfg.options, table_name))
        return [f"{message} ({cfg.algorithm})"]
    return []


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


def pretrain_errors(cfg: RunConfig, thorough: bool = False) -> list[str]:
    """The first stage checked as a run of its own; messages name ``pretrain.KEY``."""
    if not isinstance(cfg.pretrain, Mapping):
        return [f"pretrain must be a dict of settings or None, got {cfg.pretrain!r}"]
    name = cfg.pretrain.get("algorithm", PRETRAIN_ALGORITHM)
    try:
        check_stage_algorithm(name)
    except ConfigError as e:
        return [str(e)]
    unknown = set(cfg.pretrain) - set(STAGE_KEYS)
    unknown -= set(table("algorithms")[stage_algorithm(name)]["hyperparameters"])
    if unknown:
        return [f"unknown pretrain key(s) {sorted(unknown)}; allowed: {[*STAGE_KEYS]} and hyperparameters"]
    if name == CENTRALIZED and cfg.engine == "distributed":
        return ["pretrain.algorithm: 'centralized' runs in one process; use engine loop, vmap or compile"]
    names = dict.fromkeys([*STAGE_KEYS, *cfg.pretrain], "pretrain")
    return [qualify(m, names) for m in _messages(pretrain_config(cfg), thorough, "pretrain")]


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

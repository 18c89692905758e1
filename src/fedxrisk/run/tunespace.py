"""Search spaces of ``fedxrisk tune`` as data: read from the catalogue, overridden by ``--space``.

No torch and no optuna here, so that a bad ``--space`` is refused at once. A space maps a
key to a :class:`Param`; the key is either bare — ``lr``, an integer or float :class:`RunConfig` field
(``local_steps``, ``batch_size``, ``lr_decay``, …) or one of the algorithm's hyperparameters
(``margin``, ``eta_g``, …, written into ``options``) — or any ``SECTION.KEY`` that ``--set`` takes
(``server.lr``, ``server.optimizer``, ``model.personal``, ``algorithm.lam``, ``data.positives_per_batch``,
``pretrain.rounds``). A number is searched over ``LOW:HIGH[:log]``; any setting also over a list of
choices ``A,B,C`` (the only form for text and true/false settings).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedxrisk.errors import ConfigError
from fedxrisk.run.configfile import NESTED, PRIVACY, SECTIONS, SERVER, SERVER_KEYS, _fields, parse_value
from fedxrisk.run.configtypes import hyperparameter_types
from fedxrisk.run.spec import RunConfig
from fedxrisk.run.stage import STAGE_KEYS

INT_FIELDS = ("local_steps", "batch_size", "rounds", "stages", "positives_per_batch")
FLOAT_FIELDS = ("lr", "lr_decay", "window_growth", "dirichlet_alpha")
# Hyperparameters whose meaning bounds them (the config check does not see algorithm options):
# key -> (lowest allowed, highest allowed, highest is excluded).
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "momentum": (0.0, 1.0, True), "beta": (0.0, 1.0, False), "gamma": (0.0, 1.0, False),
    "margin": (0.0, math.inf, False), "mu": (0.0, math.inf, False), "prox": (0.0, math.inf, False),
    "weight_decay": (0.0, math.inf, False), "eta_g": (0.0, math.inf, False),
}  # fmt: skip


@dataclass(frozen=True)
class Param:
    """One searched key: ``low``..``high`` (inclusive), log-uniform if ``log``, integers if ``integer``;
    or one of ``choices`` (then ``low``/``high`` are unused)."""

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False
    choices: tuple[Any, ...] | None = None

    def suggest(self, trial: Any) -> Any:
        """This key's value in an Optuna ``trial``."""
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)

    def grid(self, points: int) -> list[Any]:
        """``points`` values spread over the range (evenly in log space if ``log``) for the grid sampler;
        every choice of a categorical key."""
        if self.choices is not None:
            return list(self.choices)
        if points < 2 or self.low == self.high:
            return [self.low]
        if self.log:
            values = [
                math.exp(math.log(self.low) + i * math.log(self.high / self.low) / (points - 1))
                for i in range(points)
            ]
        else:
            values = [self.low + i * (self.high - self.low) / (points - 1) for i in range(points)]
        if self.integer:
            return sorted({round(v) for v in values})
        return [float(f"{v:.6g}") for v in values]


def algorithm_entry(algorithm: str) -> dict[str, Any]:
    """The catalogue entry of ``algorithm`` (the name as registered), or a one-line error."""
    from fedxrisk.catalog import load

    algorithms = load()["algorithms"]
    if algorithm not in algorithms:
        raise ConfigError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(algorithms)}")
    return algorithms[algorithm]


def default_space(algorithm: str) -> dict[str, Param]:
    """The algorithm's own search space from ``catalog.json`` (``fedxrisk list`` shows the same)."""
    entry = algorithm_entry(algorithm)
    return {
        name: Param(name, float(p["low"]), float(p["high"]), bool(p["log"]))
        for name, p in entry["search_space"].items()
    }


def _number(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--space {spec}: {what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"--space {spec}: {what} must be finite, got {text!r}")
    return value


def _kind(hint: Any) -> str:
    """``int``, ``float`` or ``choice`` (text, true/false): how a setting of type ``hint`` is searched."""
    text = hint.__name__ if isinstance(hint, type) else str(hint)
    if "bool" in text or "str" in text:
        return "choice"
    return "int" if "int" in text and "float" not in text else "float"


def setting_type(key: str, algorithm: str, spec: str) -> Any:
    """The type of a searchable key (bare or ``SECTION.KEY``), or one line naming what is searchable."""

    fields, hyper = _fields(), hyperparameter_types(algorithm)
    section, dot, name = key.partition(".")
    if not dot:
        if key in INT_FIELDS + FLOAT_FIELDS:
            return fields[key]
        if key in hyper:
            return hyper[key]
        known = ", ".join([*FLOAT_FIELDS, *INT_FIELDS, *hyper])
        raise ConfigError(
            f"--space {spec}: {key!r} is neither a run setting nor a hyperparameter of {algorithm} ({known}); "
            "any other setting as SECTION.KEY, e.g. server.lr"
        )
    if section == PRIVACY:
        raise ConfigError(f"--space {spec}: tune is refused under [privacy] (its trials' ε is not composed)")
    if section == SERVER and name in SERVER_KEYS:
        return SERVER_KEYS[name]
    if section == "pretrain" and name in STAGE_KEYS:
        return fields.get(name, str)
    if section in SECTIONS and name in SECTIONS[section]:
        return fields[name]
    if section == "algorithm" and name in hyper:
        return hyper[name]
    if section not in (*SECTIONS, *NESTED):
        raise ConfigError(
            f"--space {spec}: unknown section {section!r}; sections: {', '.join([*SECTIONS, *NESTED])}"
        )
    raise ConfigError(f"--space {spec}: {name!r} is not a key of [{section}] (for {algorithm})")


def _choices(spec: str, rng: str, kind: str, hint: Any) -> tuple[Any, ...]:
    """The listed choices: text as written for a text setting (``none`` is a personalization, not
    None), else read as ``--set`` reads a value."""
    values = tuple(v.strip() if hint is str else parse_value(v) for v in rng.split(",") if v.strip())
    if not values:
        raise ConfigError(f"--space {spec}: no value given; KEY=A,B,C or KEY=LOW:HIGH[:log]")
    if len(set(map(repr, values))) < len(values):
        raise ConfigError(f"--space {spec}: a choice is listed twice")
    if kind != "choice" and not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"--space {spec}: {spec.partition('=')[0]} takes numbers")
    return values


def parse_space(spec: str, algorithm: str) -> Param:
    """``KEY=LOW:HIGH[:log]``, ``KEY=A,B,C`` or ``KEY=VALUE`` (a fixed value) → :class:`Param`, checked
    against ``algorithm``; KEY bare or ``SECTION.KEY`` (module doc)."""
    if "=" not in spec:
        raise ConfigError(f"--space expects KEY=LOW:HIGH[:log] or KEY=A,B,C, got {spec!r}")
    key, _, rng = (s.strip() for s in spec.partition("="))
    hint = setting_type(key, algorithm, spec)
    kind = _kind(hint)
    if kind == "choice" and ":" in rng:
        raise ConfigError(f"--space {spec}: {key} is not a number; search its choices as {key}=A,B")
    if kind == "choice" or "," in rng:
        return Param(key, 0.0, 0.0, choices=_choices(spec, rng, kind, hint))
    parts = rng.split(":")
    log = len(parts) == 3 and parts[2].strip().lower() == "log"
    if len(parts) == 3 and not log or len(parts) > 3 or not parts[0]:
        raise ConfigError(f"--space {spec}: expected KEY=LOW:HIGH[:log]")
    low = _number(parts[0], "LOW", spec)
    high = _number(parts[1], "HIGH", spec) if len(parts) > 1 else low
    if low > high:
        raise ConfigError(f"--space {spec}: LOW {low:g} is above HIGH {high:g}")
    if log and low <= 0:
        raise ConfigError(f"--space {spec}: a log range needs LOW > 0, got {low:g}")
    integer = kind == "int"
    if integer and (low != int(low) or high != int(high)):
        raise ConfigError(f"--space {spec}: {key} takes whole numbers")
    bare = key.rpartition(".")[2]
    if bare in BOUNDS and key.partition(".")[0] in (key, "algorithm"):
        lo, hi, open_high = BOUNDS[bare]
        if low < lo or high > hi or (open_high and high >= hi):
            right = ")" if open_high else "]"
            raise ConfigError(f"--space {spec}: {key} must lie in [{lo:g}, {hi:g}{right}")
    return Param(key, low, high, log, integer)


def check_space(base: RunConfig, space: dict[str, Param]) -> None:
    """Both ends of every searched range pass the run's own checks (``lr = 0``, ``local_steps = 0``, …),
    so a bad range is refused before the first trial, not by a trial's traceback."""
    from fedxrisk.run.checks import checked

    for p in space.values():
        values = p.choices if p.choices is not None else dict.fromkeys((p.low, p.high))
        shown = ",".join(map(str, p.choices)) if p.choices is not None else f"{p.low:g}:{p.high:g}"
        for value in values:
            value = int(value) if p.integer else value
            try:
                checked(apply_params(base, {p.name: value}))
            except ConfigError as e:
                text = f"{value:g}" if isinstance(value, float) else str(value)
                raise ConfigError(f"--space {p.name}={shown}: {p.name} = {text} is refused: {e}") from None


GRID_MAX = 100_000  # Optuna's grid sampler lists every point up front


def check_grid(space: dict[str, Param], sampler: str, points: int) -> None:
    """A grid of more than :data:`GRID_MAX` points is refused (listing it would not end)."""
    if sampler != "grid":
        return
    size = math.prod(len(p.grid(points)) for p in space.values())
    if size > GRID_MAX:
        raise ConfigError(
            f"--grid-points {points} over {len(space)} key(s) makes a grid of {size:.3g} points; "
            f"at most {GRID_MAX:,} (fewer --grid-points, or --space fewer keys)"
        )


def space_for(algorithm: str, overrides: tuple[str, ...] = ()) -> dict[str, Param]:
    """The default space of ``algorithm`` with every ``--space`` override applied (added or replaced)."""
    space = default_space(algorithm)
    given: set[str] = set()
    for spec in overrides:
        param = parse_space(spec, algorithm)
        if param.name in given:
            raise ConfigError(f"--space {spec}: {param.name} is searched twice; give one range per key")
        given.add(param.name)
        space[param.name] = param
    return space


def apply_params(cfg: RunConfig, params: dict[str, Any]) -> RunConfig:
    """``cfg`` with a trial's values: run settings as fields, ``server.``/``pretrain.`` keys into
    their tables, the rest as algorithm options."""
    fields, options, tables = {}, {}, {}
    for key, value in params.items():
        section, dot, name = key.rpartition(".")
        if section in NESTED:
            tables.setdefault(section, dict(getattr(cfg, section) or {}))[name] = value
        elif name in _fields() and (dot or name in INT_FIELDS + FLOAT_FIELDS):
            fields[name] = value
        else:
            options[name] = value
    return dataclasses.replace(cfg, **fields, **tables, options={**cfg.options, **options})


def current_value(cfg: RunConfig, key: str) -> Any:
    """The value ``cfg`` runs with for a searched key (None where it is unset: a data-dependent default)."""
    section, _, name = key.rpartition(".")
    if section in NESTED:
        return (getattr(cfg, section) or {}).get(name)
    if name in _fields() and (section or name in INT_FIELDS + FLOAT_FIELDS):
        return getattr(cfg, name)
    return cfg.options.get(name, algorithm_entry(cfg.algorithm)["hyperparameters"].get(name))


def default_params(cfg: RunConfig, space: dict[str, Param], lr: float | None = None) -> dict[str, Any]:
    """The values ``cfg`` runs with for the keys of ``space`` (the first, enqueued, trial), clipped into range;
    ``lr``: the step size ``fedxrisk run`` would use (``run.build.run_lr``: the data-dependent default)."""
    out: dict[str, Any] = {}
    for name, p in space.items():
        if name in ("lr", "algorithm.lr"):
            value = lr if lr is not None else cfg.resolved_lr()
        else:
            value = current_value(cfg, name)
        if p.choices is not None:  # the run's own value when it is a choice; else the sampler picks
            if value in p.choices:
                out[name] = value
            continue
        if value is None:
            continue
        out[name] = min(max(value, p.low), p.high)
        if p.integer:
            out[name] = int(out[name])
    return out


DEFAULT_VALIDATION = "auto"


def tune_config(cfg: RunConfig, monitor: str | None = None) -> RunConfig:
    """The base config of every trial: validation data (``auto``: the dataset's own split, else 20 %
    carved per client when the config sets none), the best-on-validation model selected, no TensorBoard."""
    changes: dict[str, Any] = {"tensorboard": False, "selection": "best"}
    for key in ("data_dir", "init_from"):  # absolute: best_config.toml runs from any folder
        value = getattr(cfg, key)
        if value not in (None, "none") and not Path(value).expanduser().is_absolute():
            changes[key] = str(Path(value).expanduser().resolve())
    if not cfg.validation:
        changes["validation"] = DEFAULT_VALIDATION
    if monitor is not None:
        changes["monitor"] = monitor
    return dataclasses.replace(cfg, **changes)

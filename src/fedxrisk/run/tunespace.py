"""Search spaces of ``fedxrisk tune`` as data: read from the catalogue, overridden by ``--space``.

No torch and no optuna here, so that a bad ``--space`` is refused at once. A space maps a
key to a :class:`Param`; the key is ``lr``, an integer or float :class:`RunConfig` field
(``local_steps``, ``batch_size``, ``lr_decay``, …) or one of the algorithm's hyperparameters
(``margin``, ``eta_g``, …, written into ``options``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedxrisk.errors import ConfigError
from fedxrisk.run.spec import RunConfig

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
    """One searched key: ``low``..``high`` (inclusive), log-uniform if ``log``, integers if ``integer``."""

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False

    def grid(self, points: int) -> list[float | int]:
        """``points`` values spread over the range (evenly in log space if ``log``) for the grid sampler."""
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


def parse_space(spec: str, algorithm: str) -> Param:
    """``KEY=LOW:HIGH[:log]`` (or ``KEY=VALUE`` to fix a key) → :class:`Param`, checked against ``algorithm``."""
    if "=" not in spec:
        raise ConfigError(f"--space expects KEY=LOW:HIGH[:log], got {spec!r}")
    key, _, rng = (s.strip() for s in spec.partition("="))
    hyper = algorithm_entry(algorithm)["hyperparameters"]
    if key not in INT_FIELDS + FLOAT_FIELDS and key not in hyper:
        known = ", ".join([*FLOAT_FIELDS, *INT_FIELDS, *hyper])
        raise ConfigError(
            f"--space {spec}: {key!r} is neither a run setting nor a hyperparameter of {algorithm} ({known})"
        )
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
    integer = key in INT_FIELDS
    if integer and (low != int(low) or high != int(high)):
        raise ConfigError(f"--space {spec}: {key} takes whole numbers")
    default = hyper.get(key)
    if isinstance(default, bool) or isinstance(default, str):
        raise ConfigError(
            f"--space {spec}: {key} is not a number (default {default!r}); set it with --option"
        )
    if key in BOUNDS:
        lo, hi, open_high = BOUNDS[key]
        if low < lo or high > hi or (open_high and high >= hi):
            right = ")" if open_high else "]"
            raise ConfigError(f"--space {spec}: {key} must lie in [{lo:g}, {hi:g}{right}")
    return Param(key, low, high, log, integer)


def check_space(base: RunConfig, space: dict[str, Param]) -> None:
    """Both ends of every searched range pass the run's own checks (``lr = 0``, ``local_steps = 0``, …),
    so a bad range is refused before the first trial, not by a trial's traceback."""
    from fedxrisk.run.checks import checked

    for p in space.values():
        for value in dict.fromkeys((p.low, p.high)):
            try:
                checked(apply_params(base, {p.name: int(value) if p.integer else value}))
            except ConfigError as e:
                raise ConfigError(
                    f"--space {p.name}={p.low:g}:{p.high:g}: {p.name} = {value:g} is refused: {e}"
                ) from None


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
    """``cfg`` with a trial's values: run settings as fields, the rest as algorithm options."""
    fields = {k: v for k, v in params.items() if k in INT_FIELDS + FLOAT_FIELDS}
    options = {k: v for k, v in params.items() if k not in fields}
    return dataclasses.replace(cfg, **fields, options={**cfg.options, **options})


def default_params(cfg: RunConfig, space: dict[str, Param], lr: float | None = None) -> dict[str, Any]:
    """The values ``cfg`` runs with for the keys of ``space`` (the first, enqueued, trial), clipped into range;
    ``lr``: the step size ``fedxrisk run`` would use (``run.build.run_lr``: the data-dependent default)."""
    hyper = algorithm_entry(cfg.algorithm)["hyperparameters"]
    out: dict[str, Any] = {}
    for name, p in space.items():
        if name == "lr":
            value = lr if lr is not None else cfg.resolved_lr()
        elif name in INT_FIELDS + FLOAT_FIELDS:
            value = getattr(cfg, name)
        else:
            value = cfg.options.get(name, hyper.get(name))
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

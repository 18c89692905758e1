"""What ``fedxrisk list`` shows, readable without importing torch.

``catalog.json`` (next to this file) is generated from the real registries
(:data:`fedxrisk.algorithms.ALGORITHMS`, datasets, partitions, models,
engines) by ``python -m fedxrisk.catalog``; a test checks that it equals
:func:`build`, so an algorithm or hyperparameter added without refreshing it
fails CI with that command in the message.

The config layer checks names, hyperparameter types, default step sizes and data
folders against it (:func:`algorithms`, :func:`names`), so that a config error is
reported without importing torch; once a registry module is loaded (torch is
then loaded anyway, and a user may have registered more), the live registry is used.
"""

from __future__ import annotations

import functools
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("catalog.json")
REFRESH = "python -m fedxrisk.catalog"


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None), list, dict)) else repr(value)


# Key knobs a tune searches besides the step size, when an algorithm has them with a number as default:
# name -> (low, high, log). The step size is searched log-uniformly over default/10 .. default*10.
KNOBS: dict[str, tuple[float, float, bool]] = {
    "margin": (0.5, 1.5, False),  # AUC square/hinge margin
    "momentum": (0.5, 0.95, False),  # local momentum
    "mu": (1e-3, 1.0, True),  # FedProx proximal weight
    "eta_g": (0.5, 1.5, False),  # server step (SCAFFOLD, CODASCA)
}
LR_SPAN = 10.0
# The high end of the lr range, as a factor of default_lr, where default × LR_SPAN failed in the
# measured study (benchmarks/heterogeneous/stability.py --ranges, results/stability.md: NaN or refused on the
# heart hospitals or a label-skewed split at defaults); tests/test_heterogeneous_study.py checks
# every AUC method's range against that table.
LR_HIGH: dict[str, float] = {
    "localscgdam": 1.0,  # α_h·η < 1 (α_h = 9) refuses η ≥ 1/9: 0.3 and 1.0 are not runnable
}


def search_space(
    default_lr: float, hyperparameters: dict[str, Any], algorithm: str = ""
) -> dict[str, dict[str, Any]]:
    """The default ``fedxrisk tune`` space: ``lr`` around its default (up to ``LR_HIGH`` × it where
    the stability study measured a failure above), then the knobs the algorithm has."""
    top = float(f"{default_lr * LR_HIGH[algorithm]:.6g}") if algorithm in LR_HIGH else default_lr * LR_SPAN
    space = {"lr": {"low": default_lr / LR_SPAN, "high": top, "log": True, "default": default_lr}}
    for name, (low, high, log) in KNOBS.items():
        value = hyperparameters.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            space[name] = {"low": low, "high": high, "log": log, "default": value}
    return space


def type_name(hint: Any) -> str:
    """A type hint as text: ``float``, ``str | None``; what :func:`hint_of` reads back."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(hint))
    return "None" if hint is type(None) else "Any" if hint is Any else getattr(hint, "__name__", str(hint))


_HINTS = {"bool": bool, "int": int, "float": float, "str": str, "None": type(None), "Any": Any}


def hint_of(text: str) -> Any:
    """The hint :func:`type_name` wrote; a class it cannot name without importing it is ``object``
    (the config layer passes such values through; the algorithm checks them)."""
    parts = tuple(_HINTS.get(p.strip(), object) for p in text.split("|"))
    return parts[0] if len(parts) == 1 else typing.Union[parts]  # noqa: UP007


@functools.cache
def _entry(cls: Any) -> dict[str, Any]:
    """One algorithm's catalogue entry (a class's entry never changes: computed once; not to be mutated)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: the default's type
        hints = {}
    defaults = cls.hyperparameters()
    return {
        "communicates": list(cls.communicates),
        "default_lr": cls.default_lr,
        "lr_pos_budget": getattr(cls, "lr_pos_budget", None),  # lr·p(1 − p) kept by default_lr_for
        "window": cls.fixed_window,
        "monitor": cls.monitor,
        "task": cls.task,
        **({"personal_model": True} if hasattr(cls, "personal_model") else {}),  # Ditto: a model per site
        "hyperparameters": {k: _jsonable(v) for k, v in defaults.items()},
        "types": {k: type_name(hints.get(k, type(v) if v is not None else Any)) for k, v in defaults.items()},
        "search_space": search_space(cls.default_lr, defaults, cls.name),
    }


def _layout(loader: Any) -> str:
    """A file reader's expected folder layout, from the error it gives without a data_dir."""
    from fedxrisk.errors import MissingDataError

    try:
        loader(None)
    except MissingDataError as e:
        return getattr(e, "layout", "")
    return ""


def _datasets(key: str) -> Any:
    from fedxrisk.data import DATASETS
    from fedxrisk.data.registry import FILE_DATASETS, SIZED_DATASETS, SURVIVAL_DATASETS

    if key == "file_datasets":
        return {name: _layout(DATASETS[name]) for name in DATASETS if name in FILE_DATASETS}
    if key == "survival_datasets":
        return list(SURVIVAL_DATASETS)
    return list(SIZED_DATASETS if key == "sized_datasets" else DATASETS)


def _table(key: str) -> Any:
    """One table of the catalogue, from the live registry (imports torch)."""
    if key == "algorithms":
        from fedxrisk.algorithms import ALGORITHMS

        return {name: _entry(cls) for name, cls in ALGORITHMS.items()}
    if key in ("datasets", "sized_datasets", "file_datasets", "survival_datasets"):
        return _datasets(key)
    if key == "partitions":
        from fedxrisk.data import PARTITIONS

        return list(PARTITIONS)
    if key == "models":
        from fedxrisk.models import MODELS

        return list(MODELS)
    if key == "engines":
        from fedxrisk.engines import ENGINE_NAMES

        return list(ENGINE_NAMES)
    from fedxrisk import problem

    return list(getattr(problem, key.upper()))  # buffer_policies, pos_ratio_modes


TABLES = (
    "algorithms", "datasets", "partitions", "models", "engines", "buffer_policies", "pos_ratio_modes",
    "sized_datasets", "file_datasets", "survival_datasets",
)  # fmt: skip


def build() -> dict[str, Any]:
    """The catalogue from the registries themselves (imports torch)."""
    return {key: _table(key) for key in TABLES}


@functools.cache
def _committed() -> dict[str, Any]:
    return json.loads(PATH.read_text())


def load() -> dict[str, Any]:
    """The committed catalogue (no torch); a fresh copy."""
    return json.loads(json.dumps(_committed()))


# The registry module whose import fills each table: once loaded, the live registry answers.
_LIVE = {
    "algorithms": "fedxrisk.algorithms",
    "datasets": "fedxrisk.data.registry",  # a custom reader registers there
    "sized_datasets": "fedxrisk.data.registry",
    "file_datasets": "fedxrisk.data.registry",
    "models": "fedxrisk.models",
    "engines": "fedxrisk.engines.simulation",
}


def table(key: str) -> Any:
    """One table (a name of :data:`TABLES`): ``algorithms`` maps a name to its entry (``default_lr``,
    ``window``, ``monitor``, ``task``, ``hyperparameters``, ``types``), ``file_datasets`` a name to its folder
    layout, the others are lists. The live registry once its module is loaded, else the committed file."""
    return _table(key) if _LIVE.get(key, "") in sys.modules else _committed()[key]


def algorithm(name: str) -> dict[str, Any] | None:
    """One algorithm's entry, or None when no algorithm has that name."""
    if _LIVE["algorithms"] in sys.modules:
        from fedxrisk.algorithms import ALGORITHMS

        cls = ALGORITHMS.get(name)
        return None if cls is None else _entry(cls)
    return _committed()["algorithms"].get(name)


def write(path: Path = PATH) -> Path:
    path.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n")
    return path


if __name__ == "__main__":
    print(write())

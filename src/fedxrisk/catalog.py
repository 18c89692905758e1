"""What ``fedxrisk list`` shows, readable without importing torch.

``catalog.json`` (next to this file) is generated from the real registries
(:data:`fedxrisk.algorithms.ALGORITHMS`, datasets, partitions, models,
engines) by ``python -m fedxrisk.catalog``; a test checks that it equals
:func:`build`, so an algorithm or hyperparameter added without refreshing it
fails CI with that command in the message.
"""

from __future__ import annotations

import json
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


def search_space(default_lr: float, hyperparameters: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The default ``fedxrisk tune`` space: ``lr`` around its default, then the knobs the algorithm has."""
    space = {
        "lr": {"low": default_lr / LR_SPAN, "high": default_lr * LR_SPAN, "log": True, "default": default_lr}
    }
    for name, (low, high, log) in KNOBS.items():
        value = hyperparameters.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            space[name] = {"low": low, "high": high, "log": log, "default": value}
    return space


def build() -> dict[str, Any]:
    """The catalogue from the registries themselves (imports torch)."""
    from fedxrisk.algorithms import ALGORITHMS
    from fedxrisk.data import DATASETS, PARTITIONS
    from fedxrisk.engines import ENGINE_NAMES
    from fedxrisk.models import MODELS

    algorithms = {
        name: {
            "communicates": list(cls.communicates),
            "default_lr": cls.default_lr,
            "window": cls.fixed_window,
            "hyperparameters": {k: _jsonable(v) for k, v in cls.hyperparameters().items()},
            "search_space": search_space(cls.default_lr, cls.hyperparameters()),
        }
        for name, cls in ALGORITHMS.items()
    }
    return {
        "algorithms": algorithms,
        "datasets": list(DATASETS),
        "partitions": list(PARTITIONS),
        "models": list(MODELS),
        "engines": list(ENGINE_NAMES),
    }


def load() -> dict[str, Any]:
    """The committed catalogue (no torch)."""
    return json.loads(PATH.read_text())


def write(path: Path = PATH) -> Path:
    path.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n")
    return path


if __name__ == "__main__":
    print(write())

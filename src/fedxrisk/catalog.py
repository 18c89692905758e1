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

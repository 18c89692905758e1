"""What a ``[server]`` table may say, without torch: its keys, their types and ranges, and which
algorithms a server optimizer can wrap. :class:`~fedxrisk.engines.server_opt.ServerOptimizer` and
the run's checks (``fedxrisk check``, ``fedxrisk run``, Flower's app writers) call these same rules."""

from __future__ import annotations

import math
from typing import Any

OPTIMIZERS = ("sgd", "adam", "yogi", "adagrad")
DEFAULT_LR = {"sgd": 1.0, "adam": 0.01, "yogi": 0.01, "adagrad": 0.01}  # untuned starting points
KEYS: dict[str, type] = {
    "optimizer": str,
    "lr": float,
    "beta1": float,
    "beta2": float,
    "tau": float,
    "bias_correction": bool,
}


def value_error(key: str, value: Any) -> str | None:
    """Why ``server.<key> = value`` is refused (a type-checked value), or None when it is fine."""
    if key == "optimizer" and value not in OPTIMIZERS:
        return f"server.optimizer must be one of {', '.join(OPTIMIZERS)}, got {value!r}"
    if key == "lr" and value is not None and not 0 < value < math.inf:
        return f"server.lr must be a finite number > 0, got {value}"
    if key in ("beta1", "beta2") and not 0.0 <= value < 1.0:
        return f"server.{key} must lie in [0, 1), got {value}"
    if key == "tau" and not 0 < value < math.inf:
        return f"server.tau must be a finite number > 0, got {value}"
    return None


def wrap_reason(name: str, communicates: Any) -> str | None:
    """Why a server optimizer cannot wrap the algorithm ``name`` (its round does not average w), or None."""
    if "w" not in tuple(communicates or ()):
        return f"{name} does not average the model w in its round"
    return None

"""Engines run algorithms unchanged: ``loop`` (reference), ``vmap`` (batched clients)
and ``distributed`` (torch.distributed ranks).

The names below are imported on first use, so that ``fedxrisk.engines.launch``
(the distributed engine's defaults and launch checks) can be read without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedxrisk.engines.dist_collective import DistCollective
    from fedxrisk.engines.distributed import DistributedError, DistributedSimulation
    from fedxrisk.engines.ledger import ByteLedger
    from fedxrisk.engines.simulation import ENGINES, NonFiniteLoss, SimCollective, Simulation

_HOMES = {
    "DistCollective": "dist_collective", "DistributedError": "distributed",
    "DistributedSimulation": "distributed", "ByteLedger": "ledger", "ENGINES": "simulation",
    "NonFiniteLoss": "simulation", "SimCollective": "simulation", "Simulation": "simulation",
}  # fmt: skip

__all__ = [
    "ENGINES", "ENGINE_NAMES", "ByteLedger", "DistCollective", "DistributedError",
    "DistributedSimulation", "NonFiniteLoss", "SimCollective", "Simulation",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "ENGINE_NAMES":
        value: Any = (*__getattr__("ENGINES"), "distributed")
    elif name in _HOMES:
        value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

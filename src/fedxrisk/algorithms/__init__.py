"""Algorithms, one module per family, registered by name in :data:`ALGORITHMS`."""

from fedxrisk.algorithms import coda, fedavg, fedce, scgdam  # noqa: F401  (registration side effect)
from fedxrisk.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientInfo,
    Collective,
    RoundContext,
    StepContext,
    register,
)
from fedxrisk.algorithms.schedule import RoundPlan, Schedule, Stage

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientInfo",
    "Collective",
    "RoundContext",
    "RoundPlan",
    "Schedule",
    "Stage",
    "StepContext",
    "register",
]

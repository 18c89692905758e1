"""Algorithms, one module per family, registered by name in :data:`ALGORITHMS`."""

from fedxrisk.algorithms import coda, fcsg, fedavg, fedce, fedxl, localpair, scgdam  # noqa: F401  (registration)
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

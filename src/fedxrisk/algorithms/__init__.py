"""Algorithms, one module per family, registered by name in :data:`ALGORITHMS`."""

from fedxrisk.algorithms import (  # noqa: F401  (registration, in this order)
    coda,
    coda_baselines,
    ditto,
    fcsg,
    fedavg,
    fedce,
    fedxl,
    localpair,
    scgdam,
    survival,
)
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

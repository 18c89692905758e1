"""fedxrisk: federated learning of AUC-type risks (AUROC, pAUC, AP) on imbalanced data."""

from fedxrisk.algorithms import ALGORITHMS, Algorithm, Schedule
from fedxrisk.data import make_federated
from fedxrisk.engines import Simulation
from fedxrisk.experiment import RunConfig, run_experiment
from fedxrisk.problem import Problem

__version__ = "0.1.0"

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Problem",
    "RunConfig",
    "Schedule",
    "Simulation",
    "make_federated",
    "run_experiment",
]

"""fedxrisk: federated learning of AUC-type risks (AUROC, pAUC, AP) on imbalanced data."""

from fedxrisk.algorithms import ALGORITHMS, Algorithm, Schedule
from fedxrisk.compare import compare_experiments
from fedxrisk.config import load_config
from fedxrisk.data import make_federated
from fedxrisk.engines import Simulation
from fedxrisk.experiment import RunConfig, load_run, resume_experiment, run_experiment
from fedxrisk.plots import plot_runs
from fedxrisk.problem import Problem

__version__ = "0.1.0"

# Imported on first use (they pull in matplotlib, PIL, scipy): name → module.
_LAZY = {"evaluate": "fedxrisk.evaluation", "predict": "fedxrisk.prediction"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedxrisk' has no attribute {name!r}")


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Problem",
    "RunConfig",
    "Schedule",
    "Simulation",
    "compare_experiments",
    "evaluate",
    "load_config",
    "load_run",
    "make_federated",
    "plot_runs",
    "predict",
    "resume_experiment",
    "run_experiment",
]

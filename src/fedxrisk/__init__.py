"""fedxrisk: federated learning of AUC-type risks (AUROC, pAUC, AP) on imbalanced data.

The public names below are imported on first use (PEP 562), so that
``import fedxrisk`` and the command line start without importing torch.
"""

from __future__ import annotations

import importlib
import os as _os
import sys as _sys
from typing import Any

if "torch" not in _sys.modules and "RANK" in _os.environ and "WORLD_SIZE" in _os.environ:
    # A rank launched by torchrun: when a peer dies, torch's C++ store client prints a warning
    # with a 20-line C++ stack for every failed heartbeat before our one-line diagnosis. Only
    # errors are kept; TORCH_CPP_LOG_LEVEL is read once, when torch loads (set it to override).
    _os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

__version__ = "0.1.0"

_WHERE = {
    "ALGORITHMS": "fedxrisk.algorithms",
    "Algorithm": "fedxrisk.algorithms",
    "Schedule": "fedxrisk.algorithms",
    "compare_experiments": "fedxrisk.compare",
    "load_config": "fedxrisk.run.configfile",
    "make_federated": "fedxrisk.data",
    "Simulation": "fedxrisk.engines",
    "RunConfig": "fedxrisk.run.spec",
    "load_run": "fedxrisk.run.folder",
    "resume_experiment": "fedxrisk.run.recipes",
    "run_experiment": "fedxrisk.run.recipes",
    "plot_runs": "fedxrisk.plots",
    "Problem": "fedxrisk.problem",
    "evaluate": "fedxrisk.evaluation",
    "predict": "fedxrisk.prediction",
    # pieces for one's own training loop (README "Pieces for your own loop")
    "AUCMLoss": "fedxrisk.losses",
    "AUCSquareLoss": "fedxrisk.losses",
    "APLoss": "fedxrisk.losses",
    "PartialAUCLoss": "fedxrisk.losses",
    "PESG": "fedxrisk.optim",
    "DualSampler": "fedxrisk.samplers",
    "ShuffleSampler": "fedxrisk.samplers",
    "make_client_app": "fedxrisk.flower.api",  # these two need the extra fedxrisk[flower]
    "make_server_app": "fedxrisk.flower.api",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fedxrisk' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])

"""Clients holding one class: ordinary for the cross-entropy baselines, refused for AUC objectives."""

from __future__ import annotations

import math
import warnings

import pytest

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.experiment import ConfigError, RunConfig, run_experiment

SPARSE = dict(clients=16, partition="iid", imratio=0.01, rounds=2, local_steps=2, stages=1, eval_every=1)


@pytest.mark.parametrize("algorithm", ["localsgdm", "fedprox", "scaffold", "localsgdm_rl"])
def test_cross_entropy_baselines_train_on_one_class_clients_without_being_told(algorithm, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a warning: such clients are ordinary here
        # (two rounds at 1 % positives may still rank worse than chance: that warning is another matter)
        warnings.filterwarnings("ignore", message=".*ranks worse than chance")
        result = run_experiment(RunConfig(algorithm=algorithm, **SPARSE), tmp_path)
    lacking = [
        k for k, (pos, neg) in enumerate(result.summary["data"]["client_counts"]) if pos == 0 or neg == 0
    ]
    assert len(lacking) >= 8  # the setting does hold one-class clients
    assert result.summary["status"] == "completed" and math.isfinite(result.summary["final"]["test_auroc"])


def test_auc_objectives_still_refuse_one_class_clients(tmp_path):
    with pytest.raises(ConfigError, match=r"client\(s\) hold only one class .*--allow-missing-class"):
        run_experiment(RunConfig(algorithm="codasca", **SPARSE), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_only_the_cross_entropy_family_accepts_one_class_clients():
    ce = {name for name, cls in ALGORITHMS.items() if not cls.needs_both_classes and cls.task == "binary"}
    assert ce == {"localsgdm", "fedprox", "scaffold", "localsgdm_rl", "ditto"}

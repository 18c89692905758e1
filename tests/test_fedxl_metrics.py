"""Partial AUROC (normalized and McClish), FeDXL's feature shift, and their place in run outputs."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from fedxrisk.data import make_federated
from fedxrisk.experiment import RunConfig, run_experiment
from fedxrisk.metrics import partial_auroc


def _direct_pauc(y: np.ndarray, s: np.ndarray, max_fpr: float) -> float:
    """Fraction of (positive, negative) pairs ranked right, over the top max_fpr·n− negatives."""
    neg = np.sort(s[y == 0])[::-1]
    top = neg[: round(max_fpr * len(neg))]
    return float((s[y == 1][:, None] > top[None, :]).mean())


@pytest.mark.parametrize("max_fpr", [0.3, 0.5])
def test_normalized_pauc_equals_the_direct_pairwise_count(max_fpr):
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(37), np.zeros(60)]
    s = rng.normal(size=97) + 0.8 * y  # continuous: no ties
    norm = partial_auroc(y, s, max_fpr)
    assert norm == pytest.approx(_direct_pauc(y, s, max_fpr), abs=1e-12)
    area, lo = norm * max_fpr, 0.5 * max_fpr**2  # McClish's standardization of the same area
    mcclish = 0.5 * (1 + (area - lo) / (max_fpr - lo))
    assert partial_auroc(y, s, max_fpr, mcclish=True) == pytest.approx(mcclish, abs=1e-12)


def test_pauc_extremes_and_bad_input():
    y = np.array([1, 1, 0, 0, 0])
    perfect = np.array([0.9, 0.8, 0.3, 0.2, 0.1])
    assert partial_auroc(y, perfect, 0.3) == 1.0
    assert partial_auroc(y, -perfect, 0.3) == 0.0
    assert np.isnan(partial_auroc(np.ones(3), np.arange(3.0), 0.3))
    with pytest.raises(ValueError, match="max_fpr"):
        partial_auroc(y, perfect, 0.0)


def test_feature_shift_moves_each_client_by_its_own_mean_and_leaves_test_alone():
    plain = make_federated("synthetic", 4, "iid", None, seed=3)
    shifted = make_federated("synthetic", 4, "iid", None, seed=3, feature_shift=True)
    assert torch.equal(plain.data.x_test, shifted.data.x_test)
    for k, shard in enumerate(plain.shards):
        noise = (shifted.data.x_train - plain.data.x_train)[torch.from_numpy(shard)]
        assert float(noise.mean()) == pytest.approx((k - 2) * 0.01, abs=0.01)
        assert float(noise.std()) == pytest.approx(0.2, abs=0.01)


def test_run_outputs_name_both_paucs(tmp_path):
    cfg = RunConfig(
        algorithm="fedxl1", dataset="breast_cancer", clients=2, partition="iid", rounds=2,
        local_steps=2, batch_size=8, eval_every=1, stages=1, feature_shift=True,
        options={"positives_per_batch": 4, "passive_samples": 4},
    )  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = list(csv.DictReader(open(tmp_path / "run" / "history.csv")))
    for key in ("test_pauc30_norm", "test_pauc30_mcclish", "test_pauc50_norm", "test_pauc50_mcclish"):
        assert 0.0 <= summary["final"][key] <= 1.0
        assert summary["test_oracle"][key] == max(float(r[key]) for r in rows)
    by = summary["communication"]["by_variable"]
    assert {"w", "pos_pool", "neg_pool"} == set(by)


def test_metrics_rank_infinite_scores_and_give_nan_for_nan_scores():
    """Overflowing logits (±inf) keep their order; a NaN score makes the metric NaN instead of crashing."""
    import math

    import numpy as np

    from fedxrisk.metrics import auroc, average_precision, partial_auroc

    y = np.array([0, 1, 0, 1])
    assert auroc(y, np.array([-np.inf, np.inf, 0.0, 5.0])) == 1.0
    assert average_precision(y, np.array([-np.inf, np.inf, 0.0, 5.0])) == 1.0
    assert math.isnan(auroc(y, np.array([0.0, np.nan, 1.0, 2.0])))
    assert partial_auroc(y, np.array([-np.inf, np.inf, 0.0, 5.0]), 0.3) == 1.0
    assert math.isnan(partial_auroc(y, np.array([0.0, np.nan, 1.0, 2.0]), 0.3, mcclish=True))

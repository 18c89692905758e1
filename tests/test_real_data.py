"""The real-data study's selection rule, paired comparisons and status line (benchmarks/real_data/)."""

from __future__ import annotations

import base64
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks.*`

from benchmarks.real_data import report as rep  # noqa: E402
from benchmarks.real_data import study as rd  # noqa: E402
from fedxrisk.stats import compare_models  # noqa: E402


def cell(method: str, lr: float, val: float, seed: int = 0, setting: str = "scratch", scores=None) -> dict:
    target = rd.METHODS[method][2]
    rec = {"method": method, "setting": setting, "lr": lr, "seed": seed, "status": "ok" if not math.isnan(val) else "nan",
           "val": {"auroc": math.nan, "ap": math.nan, "pauc": math.nan, target: val},
           "test": {"auroc": 0.5, "ap": 0.5, "pauc": 0.5, "acc": 0.5},
           "source": {"commit": "abc", "src_dirty": False, "files": "x"}, "seconds": 1.0}  # fmt: skip
    if scores is not None:
        rec["scores"] = base64.b64encode(np.asarray(scores, dtype=np.float32).tobytes()).decode()
    return rec


def put(results: dict, regime: str, rec: dict) -> None:
    results[rd.key(regime, rec["method"], rec["setting"], rec["lr"], rec["seed"])] = rec


def test_selection_takes_the_best_validation_value_and_extends_at_an_edge() -> None:
    results: dict = {}
    for lr, v in zip(rd.LR_GRIDS["ce"], (0.80, 0.85, 0.90)):  # best on the upper edge
        put(results, "heart", cell("ce", lr, v))
    extra = rd.candidates(results, "heart", "ce", "scratch")[-1]
    assert extra == pytest.approx(3.0)
    assert rd.selected_lr(results, "heart", "ce", "scratch") is None  # the extension has not run
    put(results, "heart", cell("ce", extra, 0.88))
    assert rd.selected_lr(results, "heart", "ce", "scratch") == 1.0


def test_selection_ranks_nan_last_and_falls_back_to_the_middle_when_validation_cannot_rank() -> None:
    results: dict = {}
    for lr, v in zip(rd.LR_GRIDS["codasca"], (0.87, 0.88, math.nan)):  # the top lr diverged
        put(results, "heart", cell("codasca", lr, v))
    assert rd.candidates(results, "heart", "codasca", "scratch") == list(rd.LR_GRIDS["codasca"])
    assert rd.selected_lr(results, "heart", "codasca", "scratch") == 1.0
    for lr in rd.LR_GRIDS["ce"]:  # Switzerland alone: validation holds one class, every value NaN
        put(results, "heart", cell("ce", lr, math.nan, setting="local2"))
    assert rd.selected_lr(results, "heart", "ce", "local2") == rd.LR_GRIDS["ce"][1]


def test_the_paired_comparison_is_compare_models_per_seed() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random(60) < 0.3).astype(int)
    results: dict = {"_labels": {"heart": y.tolist()}}
    a = [np.round(rng.normal(size=60) + y, 1) for _ in range(2)]  # ties, as in real scores
    b = [np.round(rng.normal(size=60) + 0.5 * y, 1) for _ in range(2)]
    runs = [cell("codasca", 0.3, 0.9, seed=s, scores=a[s]) for s in (0, 1)]
    refs = [cell("ce", 0.1, 0.9, seed=s, scores=b[s]) for s in (0, 1)]
    got = rep.compare(results, "heart", runs, refs)
    for s in (0, 1):
        want = compare_models(y, a[s].astype(np.float32), b[s].astype(np.float32), resamples=rep.RESAMPLES,
                              seed=[s, 21])  # fmt: skip
        for metric in ("auroc", "ap", "pauc"):
            assert got["seeds"][s][metric] == (want[metric]["difference"], want[metric]["p_value"])
    diffs = [got["seeds"][s]["auroc"][0] for s in (0, 1)]
    assert (
        rep.diff_cell(got, "auroc")
        == f"{np.mean(diffs):+.3f} ± {np.std(diffs):.3f} ({sum(d > 0 for d in diffs)}/2)"
    )


def test_positives_per_batch_is_the_data_share_with_a_floor_of_a_quarter() -> None:
    assert rd.positives_per_batch(0.52, 16) == 8
    assert rd.positives_per_batch(0.113, 32) == 8
    assert rd.positives_per_batch(0.27, 32) == 9


def test_status_names_the_rows_that_are_missing() -> None:
    results: dict = {}
    for lr, v in zip(rd.LR_GRIDS["ce"], (0.80, 0.85, 0.84)):
        put(results, "heart", cell("ce", lr, v))
    text = rep.status_table(results)
    assert text.startswith("3 cells")
    assert "heart: CE FedAvg (1/5 seeds)" in text
    assert "heart: CE → CODASCA (0/5 seeds)" in text

"""The evidence study's controls and paired tests (benchmarks/evidence/study.py, report.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: `benchmarks.*`

from benchmarks.evidence import report as R  # noqa: E402
from benchmarks.evidence import study as E  # noqa: E402


def test_the_controls_get_exactly_the_two_stage_rows_extra_steps():
    regime = "mnist1d 0.1 class"
    ce = E.rounds_of(regime, "ce", False)
    second = {m: E.rounds_of(regime, m, True) for m in E.TWO_STAGE}
    assert set(second.values()) == {ce // 2}  # CE → CE like every other second stage
    assert E.rounds_of(regime, "ce_long", False) == ce + ce // 2  # CE long: CE + a second stage
    assert ("ce", True) in E.variants(regime) and ("ce_long", False) in E.variants(regime)
    assert E.LR_GRIDS["ce_long"] == E.LR_GRIDS["ce"] and E.METHODS["ce_long"][:3] == E.METHODS["ce"][:3]


def test_the_plan_runs_the_controls_on_the_paired_seeds_of_both_main_regimes():
    planned = {}
    for group, two, names, _, seeds in E.PLAN:
        for regime in group:
            for m in names:
                planned.setdefault((regime, m, two), set()).update(seeds)
    for regime in E.MAIN:
        for row in [("ce", False), ("ce", True), ("ce_long", False), ("codasca_code", True)]:
            assert planned[(regime, *row)] >= set(E.ALL_SEEDS), (regime, row)
        for m in ("ce_ca", "fedxl2", "fcsg_m"):
            assert planned[(regime, m, True)] >= set(E.SEEDS)


def _runs(method, two, values, metric="auroc"):
    return [
        {"method": method, "two_stage": two, "seed": s, "test": {metric: v}} for s, v in enumerate(values)
    ]


def test_the_paired_t_test_is_scipys_on_the_common_seeds():
    a, b = [0.97, 0.975, 0.96, 0.971], [0.964, 0.967, 0.958, 0.965, 0.99]
    got = R.paired(_runs("x", True, a), _runs("ce", False, b), "auroc")
    want = stats.ttest_rel(a, b[:4])
    assert got["seeds"] == [0, 1, 2, 3] and got["p"] == pytest.approx(want.pvalue, abs=1e-15)
    assert got["mean"] == pytest.approx(np.mean(np.subtract(a, b[:4])), abs=1e-15)
    assert (got["wins"], got["losses"]) == (4, 0) and got["sign_p"] == pytest.approx(0.125)


def test_nan_seeds_are_dropped_and_identical_rows_are_no_difference():
    got = R.paired(_runs("x", True, [0.9, math.nan, 0.8]), _runs("ce", False, [0.9, 0.7, 0.8]), "auroc")
    assert got["seeds"] == [0, 2] and got["p"] == 1.0 and got["sign_p"] == 1.0


def test_holm_matches_the_textbook_step_down():
    # sorted 0.01, 0.03, 0.04 → 3·0.01, 2·0.03, max(0.06, 1·0.04)
    assert R.holm([0.01, 0.04, 0.03, math.nan]) == pytest.approx([0.03, 0.06, 0.06, math.nan], nan_ok=True)


def test_a_verdict_needs_three_seeds_and_holm_p_below_alpha():
    base = {"diffs": [0.01, 0.011, 0.012], "mean": 0.011}
    assert R.verdict({**base, "p_holm": 0.01}) == "better"
    assert R.verdict({**base, "mean": -0.011, "p_holm": 0.01}) == "worse"
    assert R.verdict({**base, "p_holm": 0.2}) == "no difference shown"
    assert R.verdict({**base, "diffs": [0.01, 0.02], "p_holm": 0.0}).startswith("fewer than")

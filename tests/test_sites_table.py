"""Files from another site and bad options (issue 26): each case of benchmarks/reliability/sites_table.py
stops with the message spelled out here (exit 2, nothing written or changed), or runs and passes its check.

The committed table (docs/reliability.md) must show the same messages.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "sites_table", ROOT / "benchmarks" / "reliability" / "sites_table.py"
)
table = importlib.util.module_from_spec(_spec)
sys.modules["sites_table"] = table  # dataclasses look their module up
_spec.loader.exec_module(table)
COMMITTED = {r["id"]: r for r in json.loads((ROOT / "benchmarks/results/sites.json").read_text())}
RUNS = [
    "predict-reordered",
    "predict-formula",
    "predict-bom",
    "predict-patient-id",
    "tab-patientid",
]  # accepted; the output is checked by the case
EXPECTED = {
    'model-random': 'TMP/tab/run/model.pt: not a fedxrisk model file (it holds more than tensors and plain values; never unpickled, as that could run code)',
    'model-pickle': 'TMP/tab/run/model.pt: not a fedxrisk model file (it holds more than tensors and plain values; never unpickled, as that could run code)',
    'model-bare-tensor': 'TMP/tab/run/model.pt: not a fedxrisk model file (holds Tensor; expected model, input_shape, params)',
    'model-wrong-shapes': "TMP/tab/run/model.pt: its weights do not fit its network 'linear' (missing, extra or wrongly shaped: fc.weight)",
    'init-from-nan': "model.init_from: 'TMP/w.pt' holds non-finite weights (NaN/inf) in fc.weight; start from a model saved before it diverged",
    'evaluate-nan-weights': 'TMP/tab/run/model.pt: non-finite weights (NaN/inf) in fc.weight; the model cannot score anything (retrain, or use a checkpoint taken before it diverged)',
    'predict-nan-row': 'TMP/new.csv: 1 row(s) with NaN/inf values, at line(s) 3; nothing was scored: fix or drop those rows',
    'manifest-leak': 'TMP/tm/manifest.csv: 1 image(s) in both the train and the test split (0.png); a test image seen in training inflates every metric',
    'eval-nan-label': "TMP/m/manifest.csv row 4: label column 'label' holds 'nan', not a finite number; give 1, 0, blank or -1 (uncertain)",
    'evaluate-seed-negative': '--seed must be ≥ 0, got -1',
    'evaluate-batch-zero': '--batch-size must be ≥ 1, got 0',
    'plot-broken-summary': 'TMP/tab/run/summary.json: not a readable summary (Unterminated string starting at: line 1 column 2 (char 1))',
    'plot-broken-history': "TMP/tab/run/history.csv: not a fedxrisk history (no column(s) ['round', 'test_auroc', 'bytes_up_per_client', 'bytes_down_per_client'])",
    'predict-latin1': 'TMP/new.csv: not UTF-8 text (byte 0xe9 on line 3); save it as UTF-8',
    'predict-npz-strings': "TMP/x.npz: array 'x' holds <U4 values, not numbers",
    'escape-codes': 'TMP/m/manifest.csv: 1 image(s) not found: TMP/m/\\x1b[2J\\x1b[31mb.png',
    'bootstrap-huge': '--bootstrap must be between 0 (no bootstrap intervals) and 100000, got 100000000',
    'workers-huge': 'data.workers must be between 0 (decode in the training process) and 64, got 100000',
    'model-empty': 'TMP/tab/run/model.pt: not a fedxrisk model file (empty, truncated or not a PyTorch file)',
    'model-truncated': 'TMP/tab/run/model.pt: not a fedxrisk model file (empty, truncated or not a PyTorch file)',
    'model-json': 'TMP/tab/run/model.pt: not a fedxrisk model file (it holds more than tensors and plain values; never unpickled, as that could run code)',
    'model-no-params': "TMP/tab/run/model.pt: not a fedxrisk model file (holds a dict with keys ['buffers', 'input_shape', 'model', 'num_labels', 'preprocessing']; expected model, input_shape, params)",
    'model-shape-negative': 'TMP/tab/run/model.pt: not a fedxrisk model file (model, input_shape, num_labels or weights malformed)',
    'model-shape-text': 'TMP/tab/run/model.pt: not a fedxrisk model file (model, input_shape, num_labels or weights malformed)',
    'model-labels-zero': 'TMP/tab/run/model.pt: not a fedxrisk model file (model, input_shape, num_labels or weights malformed)',
    'model-unknown-net': "TMP/tab/run/model.pt: cannot build its network 'resnet999' (unknown model 'resnet999'; choose one of ['cnn', 'cnn1d', 'cnn28', 'densenet121', 'densenet121_imagenet', 'densenet161', 'linear', 'mlp', 'resnet20'])",
    'model-param-list': 'TMP/tab/run/model.pt: not a fedxrisk model file (model, input_shape, num_labels or weights malformed)',
    'model-inf-weight': 'TMP/tab/run/model.pt: non-finite weights (NaN/inf) in fc.weight; the model cannot score anything (retrain, or use a checkpoint taken before it diverged)',
    'model-extra-weight': "TMP/tab/run/model.pt: its weights do not fit its network 'linear' (missing, extra or wrongly shaped: spare.weight)",
    'prep-mean-length': "TMP/tab/run/model.pt: preprocessing 'mean' has 2 entries, expected 3",
    'prep-std-zero': "TMP/tab/run/model.pt: preprocessing 'std' must be > 0",
    'prep-features-twice': "TMP/tab/run/model.pt: preprocessing 'features' names a column twice",
    'prep-not-dict': 'TMP/tab/run/model.pt: preprocessing must be a dict with string keys',
    'prep-mean-nan': "TMP/tab/run/model.pt: preprocessing 'mean' holds non-finite values",
    'init-from-empty': "model.init_from: 'TMP/w.pt' is not a PyTorch weights file (empty, truncated or not a PyTorch file)",
    'init-from-inf': "model.init_from: 'TMP/w.pt' holds non-finite weights (NaN/inf) in fc.weight; start from a model saved before it diverged",
    'init-from-pickle': "model.init_from: 'TMP/w.pt' is not a PyTorch weights file (it holds more than tensors and plain values; never unpickled, as that could run code)",
    'init-from-text': "model.init_from: 'TMP/w.txt' is not a PyTorch weights file (not a PyTorch file)",
    'predict-duplicate-column': "TMP/new.csv: column(s) ['a'] appear more than once",
    'predict-short-row': 'TMP/new.csv row 3: 2 fields, header has 4',
    'predict-text-feature': "TMP/new.csv row 2: could not convert string to float: 'high'",
    'predict-inf': 'TMP/new.csv: 3 row(s) with NaN/inf values, at line(s) 2, 3, 4; nothing was scored: fix or drop those rows',
    'predict-case': "TMP/new.csv: missing feature column(s) ['a', 'b', 'c']; unknown column(s) ['A', 'B', 'C']; the model takes the columns ['a', 'b', 'c'] (by name, any order; id, label and source are allowed)",
    'predict-empty-file': 'TMP/new.csv: empty file (no header row)',
    'predict-extra-column': "TMP/new.csv: unknown column(s) ['notes']; the model takes the columns ['a', 'b', 'c'] (by name, any order; id, label and source are allowed)",
    'predict-utf16': 'TMP/new.csv: not UTF-8 text (byte 0xff on line 1); save it as UTF-8',
    'predict-workers-huge': '--workers must be between 0 and 64, got 999',
    'predict-batch-zero': 'batch_size must be ≥ 1, got 0',
    'predict-scores-unknown': "scores must be one of ('prob', 'logit', 'both'), got 'odds'",
    'npz-1d': "TMP/x.npz: array 'x' holds samples of shape [] (array [6]); the model expects [4]",
    'npz-width': "TMP/x.npz: array 'x' holds samples of shape [5] (array [6, 5]); the model expects [4]",
    'npz-nan': 'TMP/x.npz: 2 row(s) with NaN/inf values, at index(s) 1, 4; nothing was scored: fix or drop those rows',
    'npz-scale': "TMP/x.npz: array 'x': values span [1.49, 973.5] but the model was trained on inputs in [0.0003007, 0.9972]; scale them as the training data were; nothing was scored",
    'npz-complex': "TMP/x.npz: array 'x' holds complex64 values, not numbers",
    'npz-no-x': "TMP/x.npz: no array 'x' or 'x_test' (arrays: ['a', 'b'])",
    'npz-objects': "TMP/x.npz: array 'x' holds Python objects, not numbers",
    'npz-zero-bytes': 'TMP/x.npz: not a readable .npz archive (File is not a zip file)',
    'evaluate-batch-negative': '--batch-size must be ≥ 1, got -5',
    'evaluate-workers-huge': '--workers must be between 0 and 64, got 1000',
    'eval-inf-label': "TMP/m/manifest.csv row 4: label column 'label' holds 'inf', not a finite number; give 1, 0, blank or -1 (uncertain)",
    'eval-label-two': "TMP/m/manifest.csv: labels in 'label' must be class ids 0..1 of the run's data (positive: 1), or 0/1",
    'eval-latin1': 'TMP/m/manifest.csv: not UTF-8 text (byte 0xe9 on line 4); save it as UTF-8',
    'eval-no-rows': "TMP/m/manifest.csv: no 'path' column or no rows",
    'eval-missing-image': 'TMP/m/manifest.csv: 1 image(s) not found: TMP/m/gone.png',
    'eval-bootstrap-negative': '--bootstrap must be between 0 (no bootstrap intervals) and 100000, got -1',
    'plot-summary-null': "TMP/tab/run/summary.json: not a fedxrisk summary (expected a JSON object with a 'config' object)",
    'plot-summary-latin1': "TMP/tab/run/summary.json: not a readable summary ('utf-8' codec can't decode byte 0xe9 in position 7: invalid continuation byte)",
    'plot-history-text-round': "TMP/tab/run/history.csv line 2: round = 'two' is not a number",
    'plot-history-long-row': 'TMP/tab/run/history.csv line 2: 25 field(s), the header has 24',
    'plot-history-binary': "TMP/tab/run/history.csv: not a readable history ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)",
    'plot-history-auroc-text': "TMP/tab/run/history.csv line 2: test_auroc = 'high' is not a number",
    'manifest-leak-dot': 'TMP/tm/manifest.csv: 1 image(s) in both the train and the test split (0.png); a test image seen in training inflates every metric',
    'workers-negative': 'data.workers must be between 0 (decode in the training process) and 64, got -3',
    'tab-only-id': "TMP/t2/data.csv: no feature columns besides 'label' (header ['id', 'label']); expected:",
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return table.make_runs(tmp_path_factory.mktemp("site_runs"))


def test_every_case_has_an_outcome_and_the_trial_is_large_enough():
    assert sorted([*EXPECTED, *RUNS]) == sorted(c.id for c in table.CASES)
    assert sum(c.new for c in table.CASES) >= 50


def test_docs_table_is_the_rendering_of_the_committed_results():
    rows = json.loads((ROOT / "benchmarks/results/sites.json").read_text())
    rendered = (ROOT / "benchmarks/results/sites.md").read_text()
    assert table.render(rows) == rendered
    assert {r["class"] for r in rows} <= {"clear", "runs"}
    doc = (ROOT / "docs/reliability.md").read_text()
    assert f"<!-- BEGIN GENERATED benchmarks/results/sites.md -->\n{rendered}<!-- END GENERATED -->" in doc


@pytest.mark.parametrize("case", table.CASES, ids=lambda c: c.id)
def test_case(case, runs, tmp_path):
    row = table.run_case(case, tmp_path, runs)
    if case.id in RUNS:
        assert (row["exit"], row["class"]) == (0, "runs"), row["message"]
    else:
        assert row["message"] == f"Error: {EXPECTED[case.id]}"
        assert (row["exit"], row["class"]) == (2, "clear")
    assert COMMITTED[case.id]["message"] == row["message"]  # docs/reliability.md shows this very line

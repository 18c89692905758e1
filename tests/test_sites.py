"""Files from another site (issue 26): the model carries its preprocessing; text written or printed is safe.

The bad-input cases (tampered models, NaN inputs, leaks, bad options) are in
benchmarks/reliability/sites_table.py and checked message by message in tests/test_sites_table.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.data import preprocessing
from fedxrisk.prediction import predict
from fedxrisk.textsafe import csv_cell, printable

TINY = ["--rounds", "2", "--stages", "1", "--eval-every", "1", "--clients", "2", "--partition", "iid"]
TINY += ["--imratio", "none", "--model", "linear", "--batch-size", "8", "--local-steps", "2", "-q"]


def _table(n: int, seed: int, id_name: str = "id") -> str:
    rng = np.random.default_rng(seed)
    lines = [f"{id_name},a,b,c,label"]
    for i in range(n):
        a, b, c = rng.normal(size=3)
        lines.append(f"{1000 + 37 * i},{a * 10 + 50:.4f},{b:.4f},{c * 3:.4f},{int(a + b > 0)}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def tab_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sites")
    (root / "data").mkdir()
    (root / "data" / "data.csv").write_text(_table(120, 0))
    args = [
        "run",
        "--dataset",
        "tabular",
        "--data-dir",
        str(root / "data"),
        *TINY,
        "--out",
        str(root / "run"),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return root


def test_model_pt_holds_feature_names_and_the_training_standardization(tab_run):
    from fedxrisk.data.readers.arrays import _read_table
    from fedxrisk.data.readers.base import split_labeled

    x, y, _, names = _read_table(tab_run / "data" / "data.csv")
    raw = split_labeled("tabular", x, y, 2).x_train
    prep = torch.load(tab_run / "run" / "model.pt", weights_only=True)["preprocessing"]
    assert prep["features"] == names == ["a", "b", "c"]  # the numeric id column is not a feature
    assert prep["id_columns"] == ["id"]
    assert np.allclose(prep["mean"], raw.mean(0), rtol=1e-6)
    assert np.allclose(prep["std"], raw.std(0) + 1e-8, rtol=1e-6)


def test_predict_needs_no_training_data_and_scores_as_before(tab_run, tmp_path):
    (tmp_path / "new.csv").write_text(_table(8, 1))
    before = predict(tab_run / "run", tmp_path / "new.csv").logits
    moved = tmp_path / "elsewhere"
    shutil.copytree(tab_run / "run", moved)
    shutil.move(tab_run / "data", tmp_path / "gone")  # the training data no longer exist
    try:
        after = predict(moved, tmp_path / "new.csv").logits
    finally:
        shutil.move(tmp_path / "gone", tab_run / "data")
    assert np.array_equal(before, after)


def test_columns_are_matched_by_name_not_position(tab_run, tmp_path):
    import csv

    rows = list(csv.reader(_table(8, 2).splitlines()))
    order = [4, 3, 0, 2, 1]  # label, c, id, b, a
    (tmp_path / "ordered.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
    (tmp_path / "shuffled.csv").write_text("\n".join(",".join(r[i] for i in order) for r in rows) + "\n")
    a = predict(tab_run / "run", tmp_path / "ordered.csv")
    b = predict(tab_run / "run", tmp_path / "shuffled.csv")
    assert np.array_equal(a.logits, b.logits)
    assert a.ids == b.ids and a.id_columns == ("id",)


def test_the_id_rule():
    ids = ["id", "ID", "Id", "patient_id", "record-id", "Study ID", "PatientID", "sampleId"]
    features = ["a", "valid", "COVID", "grid", "width", "idx", "identity", "ID2"]
    assert [n for n in ids + features if preprocessing.is_id_column(n)] == ids


def test_stored_preprocessing_round_trips_and_rejects_tampering():
    record = preprocessing.features(["a", "b"], np.array([1.0, 2.0]), np.array([0.5, 3.0]), ["id"])
    assert preprocessing.from_stored(preprocessing.to_stored(record)) == record
    mean, std = preprocessing.standardization(record)
    assert mean.dtype == np.float32 and std.tolist() == [0.5, 3.0]
    for bad, message in [
        ({**record, "std": [0.0, 1.0]}, "'std' must be > 0"),
        ({**record, "mean": [1.0]}, "'mean' has 1 entries, expected 2"),
        ({**record, "features": ["a", "a"]}, "names a column twice"),
        ({**record, "kind": "magic"}, "kind 'magic' is not one of"),
        ("zscore", "must be a dict"),
    ]:
        with pytest.raises(ValueError, match=message):
            preprocessing.from_stored(bad)


def test_range_check_tolerates_the_training_scale_and_refuses_another():
    record = preprocessing.value_range(np.array([[0.0, 1.0], [0.5, 0.2]]))
    assert record["kind"] == "arrays" and record["range"] == [0.0, 1.0]  # (+ column mean/std, issue 34)
    assert preprocessing.out_of_range(record, -0.5, 3.0) is None
    assert "trained on inputs in [0, 1]" in preprocessing.out_of_range(record, 0.0, 255.0)


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ("=HYPERLINK(1)", "'=HYPERLINK(1)"),
        ("+1+2", "'+1+2"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("-1.5", "-1.5"),
        ("+3e5", "+3e5"),
        ("plain", "plain"),
        (7, 7),
    ],
)
def test_csv_cells_are_escaped_against_formulas(cell, written):
    assert csv_cell(cell) == written


def test_printed_text_has_no_control_characters():
    assert printable("a\x1b[2Jb\x07\u202e") == "a\\x1b[2Jb\\x07\\u202e"
    assert printable("line\nnext", keep="\n") == "line\nnext"


def test_a_model_pt_without_preprocessing_still_standardizes_from_the_run_data(tab_run, tmp_path):
    """A model.pt written before the record existed falls back to re-reading the run's data."""
    old = tmp_path / "old"
    shutil.copytree(tab_run / "run", old)
    blob = torch.load(old / "model.pt", weights_only=True)
    blob.pop("preprocessing")
    torch.save(blob, old / "model.pt")
    summary = json.loads((old / "summary.json").read_text())
    summary.pop("model_sha256", None)  # the output layer's identity check: the file was rewritten on purpose
    (old / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "x.csv").write_text("a,b,c\n50,0.1,0.2\n40,-1,3\n")
    got = predict(old, tmp_path / "x.csv").logits
    want = predict(tab_run / "run", tmp_path / "x.csv").logits
    assert np.allclose(got, want, atol=1e-6)

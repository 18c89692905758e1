"""Issue 33's study pieces: class-aware batches for cross-entropy through the run layer, the study's
label-noise transform (benchmarks/heterogeneous/study.py), and the default tune ranges against the
committed stability table (benchmarks/heterogeneous/stability_ranges.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedxrisk.run.build import build
from fedxrisk.run.checks import checked
from fedxrisk.run.spec import RunConfig

ROOT = Path(__file__).resolve().parents[1]


def _bench(name: str):
    """``benchmarks/heterogeneous/NAME.py``, imported as ``benchmarks.heterogeneous.NAME``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the repository root: `benchmarks.*`
    return importlib.import_module(f"benchmarks.heterogeneous.{name}")


def _setup(positives: int):
    cfg = RunConfig(algorithm="localsgdm", dataset="digits", clients=4, positives_per_batch=positives,
                    batch_size=8, rounds=2, stages=1, local_steps=2, tensorboard=False, checkpoint_every=0)  # fmt: skip
    return build(checked(cfg))


def test_cross_entropy_draws_class_aware_batches_when_asked():
    """data.positives_per_batch works for CE FedAvg: every client's batch holds exactly P positives,
    while the default draws plain batches (digits at imratio 0.1: rarely 3 of 8)."""
    sim = _setup(3).simulation
    for _ in range(5):
        y = sim._batch(sim.sampler.next())["y"]
        assert y.sum(dim=1).tolist() == [3.0] * 4
    plain = _setup(0).simulation
    counts = [plain._batch(plain.sampler.next())["y"].sum(dim=1) for _ in range(5)]
    assert any(c.tolist() != [3.0] * 4 for c in counts)


def test_the_study_flips_the_chosen_share_of_labels_at_half_of_the_sites_only():
    study = _bench("study")
    from fedxrisk.data import make_federated
    from fedxrisk.data.validation import with_validation

    data = with_validation(make_federated("digits", 4, "iid", 0.1, 0), 0.2, 0)
    noisy = study.flip_labels(data, 0.15, seed=3)
    for k in range(4):
        for split, rows in (("train", data.shards[k]), ("val", data.val_shards[k])):
            before = getattr(data.data, f"y_{split}")[rows]
            after = getattr(noisy.data, f"y_{split}")[rows]
            flipped = int((before != after).sum())
            assert flipped == (round(0.15 * len(rows)) if k < 2 else 0), (k, split)
    assert torch.equal(noisy.data.y_test, data.data.y_test)
    again = study.flip_labels(data, 0.15, seed=3)
    assert torch.equal(again.data.y_train, noisy.data.y_train)  # seeded


@pytest.fixture(scope="module")
def stability():
    ranges = _bench("stability_ranges")
    table = json.loads((ROOT / "benchmarks" / "results" / "stability.json").read_text())
    return ranges, table


def test_every_auc_methods_default_tune_range_ran_without_nan_at_both_ends(stability):
    """catalog.json's lr range of every AUC method is the stable range the committed stability
    table measured (stability_ranges.stable_range): both ends ran on the label-skewed splits
    with no NaN run."""
    from fedxrisk.catalog import load

    ranges, table = stability
    methods = [m for m in _bench("stability").METHODS]
    assert set(table.get("ranges", {})) == set(methods), (
        "rerun benchmarks/heterogeneous/stability.py --resume --ranges"
    )
    for method in methods:
        space = load()["algorithms"][method]["search_space"]["lr"]
        measured = ranges.stable_range(table, method)
        assert measured is not None, method
        assert (space["low"], space["high"]) == pytest.approx(measured), method
        for end in measured:
            runs = table["ranges"][method][ranges.lr_key(end)]
            assert runs and all(r["outcome"] == "ok" for r in runs), (method, end)
            assert np.isfinite([r["test_auroc"] for r in runs]).all()


def test_the_default_stability_table_has_no_nan_and_includes_donors(stability):
    _, table = stability
    runs = [r for row in table["cells"].values() for col in row.values() for r in col]
    assert runs and not [r for r in runs if r["outcome"] == "nan"]
    donors = [c for c in table["columns"] if c.startswith("donors")]
    assert len(donors) == 3  # dirichlet α = 0.5, 0.1 and class
    for method, row in table["cells"].items():
        assert all(row.get(c) for c in donors), f"{method}: a donors column has no run"

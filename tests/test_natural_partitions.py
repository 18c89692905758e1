"""Natural partitions: one client per source, and the ChestXray-IH patient split."""

from __future__ import annotations

import numpy as np
import pytest

from fedxrisk.data.partition import clients_per_source, partition


def _groups():
    rng = np.random.default_rng(3)
    sources = np.repeat([0, 1, 2], [40, 25, 15])
    patients = np.concatenate(
        [rng.integers(0, 12, 40), 100 + rng.integers(0, 9, 25), 200 + rng.integers(0, 6, 15)]
    )
    return {"source": sources, "patient": patients}


def test_source_partition_is_one_client_per_source():
    g = _groups()
    y = np.zeros(80)
    parts = partition("source", y, y.astype(int), 3, np.random.default_rng(0), groups=g)
    for s, part in enumerate(parts):
        np.testing.assert_array_equal(part, np.flatnonzero(g["source"] == s))
    with pytest.raises(ValueError, match="the data has 3 sources, so set clients=3"):
        partition("source", y, y.astype(int), 4, np.random.default_rng(0), groups=g)
    with pytest.raises(ValueError, match="needs a per-sample 'source' id"):
        partition("source", y, y.astype(int), 3, np.random.default_rng(0))


def test_clients_per_source_is_proportional_with_one_each():
    assert clients_per_source(np.array([40, 25, 15]), 8).tolist() == [4, 3, 1]  # quotas 4, 2.5, 1.5
    assert clients_per_source(np.array([40, 25, 15]), 3).tolist() == [1, 1, 1]
    assert clients_per_source(np.array([1000, 1, 1]), 16).tolist() == [14, 1, 1]
    with pytest.raises(ValueError, match="at least one client per source"):
        clients_per_source(np.array([40, 25, 15]), 2)


def test_patient_partition_keeps_patients_and_sources_whole():
    g = _groups()
    y = np.zeros(80)
    parts = partition("patient", y, y.astype(int), 8, np.random.default_rng(1), groups=g)
    assert len(parts) == 8
    assert sorted(np.concatenate(parts).tolist()) == list(range(80))  # every sample exactly once
    owner = {}
    for k, part in enumerate(parts):
        assert len(np.unique(g["source"][part])) == 1  # one organization per client
        for p in np.unique(g["patient"][part]):
            assert owner.setdefault(p, k) == k  # no patient in two clients
    assert [int(np.unique(g["source"][p])[0]) for p in parts] == [0, 0, 0, 0, 1, 1, 1, 2]
    again = partition("patient", y, y.astype(int), 8, np.random.default_rng(1), groups=g)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_class_partitions_refuse_multilabel():
    y = np.zeros((10, 3))
    with pytest.raises(ValueError, match="multi-label data needs iid, source or patient"):
        partition("class", y, np.zeros(10, dtype=int), 2, np.random.default_rng(0))

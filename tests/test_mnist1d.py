"""The procedurally generated MNIST-1D dataset (optional extra)."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("mnist1d")

from fedxrisk.data import DATASETS, load_dataset  # noqa: E402


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_mnist1d_is_generated_deterministically_without_touching_global_rngs():
    random.seed(1)
    np.random.seed(1)
    expected = (random.random(), np.random.rand())
    random.seed(1)
    np.random.seed(1)
    data = load_dataset("mnist1d")
    assert (random.random(), np.random.rand()) == expected
    assert "mnist1d" in DATASETS
    assert data.x_train.shape == (3500, 40) and data.x_test.shape == (1500, 40)
    assert data.num_classes == 10 and np.bincount(data.y_train).tolist() == [350] * 10
    again = load_dataset("mnist1d")
    assert np.array_equal(again.x_train, data.x_train)
    assert abs(float(np.concatenate([data.x_train, data.x_test]).std()) - 1.0) < 1e-3  # standardized

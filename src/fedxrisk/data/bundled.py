"""Bundled datasets (no download, no files): scikit-learn's digits and breast cancer, and Gaussian clusters."""

from __future__ import annotations

import numpy as np

from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData, split


@register("digits")
def load_digits() -> LabeledData:
    """scikit-learn's 8×8 digits (1797 images, 10 classes), as 1×8×8 images in [0, 1]."""
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]
    return split("digits", x, d.target.astype(np.int64), 10)


@register("breast_cancer")
def load_breast_cancer() -> LabeledData:
    """scikit-learn's Wisconsin breast cancer (569 × 30), standardized on the train split.

    Classes: 0 = malignant, 1 = benign (scikit-learn's coding); the positive class is
    malignant (before this was stated, the upper-half default made "benign" positive).
    """
    from sklearn.datasets import load_breast_cancer as sk_bc

    from fedxrisk.data.readers.base import standardize  # here: the readers register after the bundled sets

    d = sk_bc()
    data = split("breast_cancer", d.data.astype(np.float32), d.target.astype(np.int64), 2)
    standardize(data, [str(n) for n in d.feature_names])
    data.label_names, data.default_positive = ("malignant", "benign"), (0,)
    return data


@register("synthetic", sized=True)
def load_synthetic(
    num_samples: int = 6000, num_features: int = 20, num_classes: int = 10, seed: int = 7
) -> LabeledData:
    """Gaussian class clusters in ``num_features`` dimensions, overlapping enough to be hard."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, size=(num_classes, num_features))
    y = rng.integers(0, num_classes, size=num_samples)
    x = centers[y] + rng.normal(0.0, 1.5, size=(num_samples, num_features))
    return split("synthetic", x.astype(np.float32), y.astype(np.int64), num_classes)

"""Where the data types, bundled datasets and ``load_dataset`` used to live; their names, re-exported.

New code imports from the module that defines a name: :mod:`fedxrisk.data.types`
(``LabeledData``, ``BinaryData``, ``binarize``, ``split``), :mod:`fedxrisk.data.registry`
(``DATASETS``), :mod:`fedxrisk.data.bundled`, :mod:`fedxrisk.data.loading` (``load_dataset``).
Nothing inside :mod:`fedxrisk.data` imports this module.
"""

from __future__ import annotations

from fedxrisk.data.bundled import load_breast_cancer, load_digits, load_synthetic
from fedxrisk.data.loading import load_dataset
from fedxrisk.data.mnist1d import load_mnist1d
from fedxrisk.data.registry import DATASETS, FILE_DATASETS, SIZED_DATASETS
from fedxrisk.data.types import (
    SPLIT_SEED,
    TEST_FRACTION,
    BinaryData,
    LabeledData,
    binarize,
    default_positive_classes,
    split,
)

__all__ = [
    "DATASETS",
    "FILE_DATASETS",
    "SIZED_DATASETS",
    "SPLIT_SEED",
    "TEST_FRACTION",
    "BinaryData",
    "LabeledData",
    "binarize",
    "default_positive_classes",
    "load_breast_cancer",
    "load_dataset",
    "load_digits",
    "load_mnist1d",
    "load_synthetic",
    "split",
]

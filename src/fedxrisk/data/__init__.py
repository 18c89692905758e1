"""Datasets, imbalance, partitions and per-client samplers.

Layers, bottom to top (each imports only those below; tests/test_architecture.py checks it):
types → checks, decode → lazy → registry → bundled, mnist1d, readers → loading →
imbalance, partition, shift, augment → federated → sampler, prefetch, stream, validation.

The names below are imported on first use (PEP 562), so that the torch-free modules
(:mod:`~fedxrisk.data.stream_choice`, :mod:`~fedxrisk.data.preprocessing`,
:mod:`~fedxrisk.data.partition`) serve the config checks without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# numpy only; imported here so that `fedxrisk.data.partition` is the function, as it always was
from fedxrisk.data.partition import PARTITIONS, partition

if TYPE_CHECKING:
    from fedxrisk.data.federated import FederatedData, check_client_classes, make_federated
    from fedxrisk.data.imbalance import imbalance_counts, make_imbalanced
    from fedxrisk.data.loading import load_dataset
    from fedxrisk.data.registry import DATASETS
    from fedxrisk.data.sampler import ClientSampler
    from fedxrisk.data.types import BinaryData, LabeledData, binarize

_HOMES = {
    "BinaryData": "types", "LabeledData": "types", "binarize": "types",
    "load_dataset": "loading", "FederatedData": "federated", "check_client_classes": "federated",
    "make_federated": "federated", "imbalance_counts": "imbalance", "make_imbalanced": "imbalance",
    "ClientSampler": "sampler",
}  # fmt: skip

__all__ = [
    "DATASETS", "PARTITIONS", "BinaryData", "ClientSampler", "FederatedData", "LabeledData", "binarize",
    "check_client_classes", "imbalance_counts", "load_dataset", "make_federated", "make_imbalanced",
    "partition",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "DATASETS":  # complete once every reader has registered (loading imports them)
        importlib.import_module(f"{__name__}.loading")
        value: Any = importlib.import_module(f"{__name__}.registry").DATASETS
    elif name in _HOMES:
        value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

"""Datasets, imbalance, partitions and per-client samplers.

Layers, bottom to top (each imports only those below; tests/test_data_layers.py checks it):
types → checks, decode → lazy → registry → bundled, mnist1d, readers → loading →
imbalance, partition, shift, augment → federated → sampler, prefetch, stream, validation.
"""

from fedxrisk.data.types import BinaryData, LabeledData, binarize  # noqa: I001  (layer order)
from fedxrisk.data.registry import DATASETS
from fedxrisk.data.loading import load_dataset
from fedxrisk.data.federated import FederatedData, check_client_classes, make_federated
from fedxrisk.data.imbalance import imbalance_counts, make_imbalanced
from fedxrisk.data.partition import PARTITIONS, partition
from fedxrisk.data.sampler import ClientSampler

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "BinaryData",
    "ClientSampler",
    "FederatedData",
    "LabeledData",
    "binarize",
    "check_client_classes",
    "imbalance_counts",
    "load_dataset",
    "make_federated",
    "make_imbalanced",
    "partition",
]

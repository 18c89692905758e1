"""Datasets, imbalance, partitions and per-client samplers."""

from fedxrisk.data import readers  # noqa: F401  (registers the file datasets)
from fedxrisk.data.datasets import DATASETS, BinaryData, LabeledData, binarize, load_dataset
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

"""File readers for the papers' datasets, each registered in :data:`fedxrisk.data.registry.DATASETS`
by its module.

Each reader takes the folder named by ``RunConfig.data_dir`` (``--data-dir``) and
returns a :class:`~fedxrisk.data.LabeledData`; a missing file raises
:class:`MissingDataError` and a malformed one :class:`DataFileError`, both
naming the expected layout (docs/data.md lists them). No torchvision needed.
"""

from __future__ import annotations

# registration order is the order `fedxrisk list` shows
# isort: off
from fedxrisk.data.readers.cifar import read_cifar10, read_cifar100
from fedxrisk.data.readers.binary import read_fashion_mnist, read_idx, read_mnist, read_stl10
from fedxrisk.data.readers.images import load_image, read_image_folder, read_site_folders
from fedxrisk.data.readers.manifest import (
    CHEXPERT_LABELS,
    UNCERTAIN_POLICIES,
    read_chestxray_ih,
    read_chexpert,
    read_manifest,
    read_manifest_dir,
    read_manifest_table,
)
from fedxrisk.data.readers.arrays import read_npz, read_tabular_csv
from fedxrisk.data.readers.medmnist import read_medmnist
from fedxrisk.data.readers.heart import read_heart_disease
from fedxrisk.data.readers.survival import read_survival_dir, read_tcga_brca

# isort: on
from fedxrisk.data.readers.base import DataFileError, MissingDataError
from fedxrisk.data.registry import DATASETS, FILE_DATASETS

READERS = {name: DATASETS[name] for name in DATASETS if name in FILE_DATASETS}  # the file datasets

__all__ = [
    "CHEXPERT_LABELS",
    "READERS",
    "UNCERTAIN_POLICIES",
    "DataFileError",
    "MissingDataError",
    "load_image",
    "read_chestxray_ih",
    "read_survival_dir",
    "read_tcga_brca",
    "read_chexpert",
    "read_cifar10",
    "read_cifar100",
    "read_fashion_mnist",
    "read_heart_disease",
    "read_idx",
    "read_image_folder",
    "read_manifest",
    "read_manifest_dir",
    "read_manifest_table",
    "read_medmnist",
    "read_mnist",
    "read_npz",
    "read_site_folders",
    "read_stl10",
    "read_tabular_csv",
]

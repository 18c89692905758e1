"""File readers for the papers' datasets, registered in :data:`fedxrisk.data.DATASETS`.

Each reader takes the folder named by ``RunConfig.data_dir`` (``--data-dir``) and
returns a :class:`~fedxrisk.data.LabeledData`; a missing file raises
:class:`MissingDataError` and a malformed one :class:`DataFileError`, both
naming the expected layout (docs/data.md lists them). No torchvision needed.
"""

from __future__ import annotations

from fedxrisk.data.datasets import DATASETS, FILE_DATASETS
from fedxrisk.data.readers.arrays import read_npz, read_tabular_csv
from fedxrisk.data.readers.base import DataFileError, MissingDataError
from fedxrisk.data.readers.binary import read_fashion_mnist, read_idx, read_mnist, read_stl10
from fedxrisk.data.readers.cifar import read_cifar10, read_cifar100
from fedxrisk.data.readers.images import (
    CHEXPERT_LABELS,
    UNCERTAIN_POLICIES,
    load_image,
    read_chestxray_ih,
    read_chexpert,
    read_image_folder,
    read_manifest,
    read_manifest_dir,
    read_manifest_table,
    read_site_folders,
)

READERS = {
    "cifar10": read_cifar10,
    "cifar100": read_cifar100,
    "stl10": read_stl10,
    "mnist": read_mnist,
    "fashionmnist": read_fashion_mnist,
    "folder": read_image_folder,  # CATvsDOG, Melanoma-style class folders (32×32 RGB)
    "sites": read_site_folders,  # one folder per hospital/site
    "manifest": read_manifest_dir,  # <data_dir>/manifest.csv, 224×224 RGB
    "chexpert": read_chexpert,
    "chestxray_ih": read_chestxray_ih,
    "npz": read_npz,
    "tabular": read_tabular_csv,
}
DATASETS.update(READERS)
FILE_DATASETS.update(READERS)

__all__ = [
    "CHEXPERT_LABELS",
    "READERS",
    "UNCERTAIN_POLICIES",
    "DataFileError",
    "MissingDataError",
    "load_image",
    "read_chestxray_ih",
    "read_chexpert",
    "read_cifar10",
    "read_cifar100",
    "read_fashion_mnist",
    "read_idx",
    "read_image_folder",
    "read_manifest",
    "read_manifest_dir",
    "read_manifest_table",
    "read_mnist",
    "read_npz",
    "read_site_folders",
    "read_stl10",
    "read_tabular_csv",
]

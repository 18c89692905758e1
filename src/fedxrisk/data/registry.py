"""The dataset registry: every dataset name and its loader, filled by the modules that define them.

A bundled loader takes no argument (a generated one also ``num_samples``); a file
reader takes ``data_dir``. Loaders add themselves with :func:`register`, as
algorithms do with ``fedxrisk.algorithms.base.register``; :mod:`fedxrisk.data.loading`
imports every module that registers, so the tables are complete once it is imported.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, TypeVar

DATASETS: dict[str, Callable[..., Any]] = {}  # name → loader, in registration order (`fedxrisk list`)
FILE_DATASETS: set[str] = set()  # loaders that read files from a data_dir (fedxrisk.data.readers)
SIZED_DATASETS: list[str] = []  # generated: their loader takes num_samples (kept sorted)
SURVIVAL_DATASETS: list[str] = []  # survival data (event flag + time): their runs take survival algorithms

Loader = TypeVar("Loader", bound=Callable[..., Any])


def register(
    name: str, *, files: bool = False, sized: bool = False, task: str = "binary"
) -> Callable[[Loader], Loader]:
    """Decorator adding a loader to :data:`DATASETS` under ``name``; ``files``: it reads
    ``data_dir`` (a file reader); ``sized``: it generates ``num_samples`` samples; ``task``:
    ``"survival"`` for event/time data (:data:`SURVIVAL_DATASETS`), else ``"binary"``."""

    def add(loader: Loader) -> Loader:
        if not name or name in DATASETS:
            raise ValueError(f"dataset name {name!r} missing or registered twice")
        DATASETS[name] = loader
        if files:
            FILE_DATASETS.add(name)
        if sized:
            bisect.insort(SIZED_DATASETS, name)
        if task == "survival":
            SURVIVAL_DATASETS.append(name)
        return loader

    return add

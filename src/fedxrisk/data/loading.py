"""``load_dataset``: a dataset by name, from the registry every loader has added itself to."""

from __future__ import annotations

# imported for their registrations, in the order `fedxrisk list` shows them
import fedxrisk.data.bundled  # noqa: F401
import fedxrisk.data.mnist1d  # noqa: F401
import fedxrisk.data.readers  # noqa: F401
from fedxrisk.data.lazy import lazy_reading
from fedxrisk.data.registry import DATASETS, FILE_DATASETS, SIZED_DATASETS
from fedxrisk.data.types import LabeledData


def load_dataset(
    name: str, data_dir: str | None = None, lazy: bool = False, num_samples: int | None = None
) -> LabeledData:
    """A bundled dataset by name, or a file dataset read from ``data_dir``.

    ``lazy``: a file dataset's inputs are :class:`~fedxrisk.data.lazy.LazySamples`
    (decoded when sampled; labels are always read); bundled datasets ignore it.
    ``num_samples``: the size of a generated dataset (:data:`SIZED_DATASETS`; None: its default)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    if num_samples is not None:
        if name not in SIZED_DATASETS:
            raise ValueError(
                f"num_samples applies to generated datasets {list(SIZED_DATASETS)}, not {name!r}; drop it"
            )
        return DATASETS[name](num_samples=num_samples)
    if name in FILE_DATASETS:
        if lazy:
            with lazy_reading():
                return DATASETS[name](data_dir)
        return DATASETS[name](data_dir)
    if data_dir is not None:
        raise ValueError(f"dataset {name!r} is bundled and reads no files; drop data_dir={data_dir!r}")
    return DATASETS[name]()

"""``load_dataset``: a dataset by name, from the registry every loader has added itself to."""

from __future__ import annotations

# imported for their registrations, in the order `fedxrisk list` shows them
import fedxrisk.data.bundled  # noqa: F401
import fedxrisk.data.mnist1d  # noqa: F401
import fedxrisk.data.readers  # noqa: F401
from fedxrisk.data.lazy import lazy_reading
from fedxrisk.data.missing import MISSING_DATASETS
from fedxrisk.data.preprocessing import IMAGE_DATASETS
from fedxrisk.data.registry import DATASETS, FILE_DATASETS, SIZED_DATASETS
from fedxrisk.data.types import LabeledData


def load_dataset(
    name: str,
    data_dir: str | None = None,
    lazy: bool = False,
    num_samples: int | None = None,
    image_size: int | None = None,
    on_missing: str = "error",
) -> LabeledData:
    """A bundled dataset by name, or a file dataset read from ``data_dir``.

    ``lazy``: a file dataset's inputs are :class:`~fedxrisk.data.lazy.LazySamples`
    (decoded when sampled; labels are always read); bundled datasets ignore it.
    ``num_samples``: the size of a generated dataset (:data:`SIZED_DATASETS`; None: its default).
    ``image_size``: images resized to S×S (:data:`IMAGE_DATASETS`; None: the reader's default),
    recorded in the data's ``preprocessing``. ``on_missing``: a tabular CSV's missing cells
    (:mod:`fedxrisk.data.missing`)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    if num_samples is not None:
        if name not in SIZED_DATASETS:
            raise ValueError(
                f"num_samples applies to generated datasets {list(SIZED_DATASETS)}, not {name!r}; drop it"
            )
        return DATASETS[name](num_samples=num_samples)
    if image_size is not None and name not in IMAGE_DATASETS:
        raise ValueError(
            f"data.image_size applies to image datasets {list(IMAGE_DATASETS)}, not {name!r}; drop it"
        )
    if on_missing != "error" and name not in MISSING_DATASETS:
        raise ValueError(
            f"data.on_missing applies to {', '.join(MISSING_DATASETS)} CSVs, not {name!r}; drop it"
        )
    if name in FILE_DATASETS:
        kwargs = {} if image_size is None else {"image_size": image_size}
        kwargs |= {} if on_missing == "error" else {"on_missing": on_missing}
        if lazy:
            with lazy_reading():
                data = DATASETS[name](data_dir, **kwargs)
        else:
            data = DATASETS[name](data_dir, **kwargs)
        if name in IMAGE_DATASETS:
            data.preprocessing = {
                **data.preprocessing,
                "kind": "images",
                "image_size": int(data.x_train.shape[-1]),
            }
        return data
    if data_dir is not None:
        raise ValueError(f"dataset {name!r} is bundled and reads no files; drop data_dir={data_dir!r}")
    return DATASETS[name]()

"""MNIST-1D (Greydanus 2020): ten 1-D digit templates under random scaling, shift,
shear and noise, generated procedurally by the ``mnist1d`` package (optional extra
``pip install fedxrisk[mnist1d]``).

We call its ``make_dataset`` with explicit arguments, which only generates: no
file is read or downloaded (its ``get_dataset`` would fetch a pickle from a URL;
we never call it). The generator reseeds Python's and NumPy's global random
state; we restore both afterwards so importing data never changes a run's streams.
"""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np

from fedxrisk.data.registry import register
from fedxrisk.data.types import LabeledData, split

# mnist1d's published defaults (get_dataset_args), minus the download URL
MNIST1D_ARGS = {
    "num_samples": 5000,
    "train_split": 0.8,
    "template_len": 12,
    "padding": [36, 60],
    "scale_coeff": 0.4,
    "max_translation": 48,
    "corr_noise_scale": 0.25,
    "iid_noise_scale": 2e-2,
    "shear_scale": 0.75,
    "shuffle_seq": False,
    "final_seq_length": 40,
    "seed": 42,
}


@lru_cache(maxsize=2)
def _generate(seed: int, num_samples: int = MNIST1D_ARGS["num_samples"]) -> tuple[np.ndarray, np.ndarray]:
    try:
        from mnist1d.data import make_dataset
        from mnist1d.utils import ObjectView
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "dataset 'mnist1d' needs the mnist1d package: pip install 'fedxrisk[mnist1d]'"
        ) from e
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        d = make_dataset(ObjectView(dict(MNIST1D_ARGS, seed=seed, num_samples=num_samples)))
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    x = np.concatenate([d["x"], d["x_test"]]).astype(np.float32)
    y = np.concatenate([d["y"], d["y_test"]]).astype(np.int64)
    return x, y


@register("mnist1d", sized=True)
def load_mnist1d(seed: int = 42, num_samples: int | None = None) -> LabeledData:
    """``num_samples`` (default 5000, the package's) signals of length 40, 10 classes, split
    like the other bundled sets (70/30, stratified); the same seed and size give the same data."""
    if num_samples is not None and num_samples < 100:
        raise ValueError(f"num_samples must be ≥ 100 for mnist1d, got {num_samples}")
    x, y = _generate(seed, num_samples or MNIST1D_ARGS["num_samples"])
    return split("mnist1d", x.copy(), y.copy(), 10)

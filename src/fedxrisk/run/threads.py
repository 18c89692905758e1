"""torch's CPU threads: one for the small models, the default of ``fedxrisk run``, ``compare``,
``tune`` and the Python API alike (a second thread costs more CPU than it saves on them; under
load, 5.5× the wall time of a 50-round compare was measured with torch's default). Set
``OMP_NUM_THREADS`` to choose another count (``fedxrisk run --threads N`` too)."""

from __future__ import annotations

import os

SMALL_MODELS = ("linear", "mlp", "cnn", "cnn28", "cnn1d")


def set_threads(threads: int | None, model: str | None) -> int:
    """torch's intra-op threads for a run: ``threads`` (0: torch's default), else 1 for the small
    models unless OMP_NUM_THREADS says otherwise; the count in use is returned."""
    import torch

    if threads is None and model in SMALL_MODELS and "OMP_NUM_THREADS" not in os.environ:
        threads = 1
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()

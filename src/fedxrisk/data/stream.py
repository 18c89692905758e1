"""A run's training data, streamed or in memory: read the dataset lazily, choose, attach the stream.

``data.stream`` is applied where a run's data are built (:func:`fedxrisk.run.build.open_training_data`,
with :mod:`fedxrisk.data.stream_choice`); :func:`attach_stream` gives the federated data its :class:`~fedxrisk.data.prefetch.Stream`.
The streaming machinery lives in :mod:`fedxrisk.data.prefetch` and the bad-file policy in
:mod:`fedxrisk.data.lazy`; their names are re-exported here, where callers have found them.
"""

from __future__ import annotations

from typing import Any

from fedxrisk.data.lazy import RESUME_ADVICE, decode_rows, is_lazy  # noqa: F401  (re-exported)
from fedxrisk.data.prefetch import (  # noqa: F401  (re-exported)
    PREFETCH,
    Stream,
    input_chunks,
    materialize,
    sampler_requests,
    simulation_requests,
)
from fedxrisk.data.stream_choice import (  # noqa: F401  (re-exported)
    MAX_NAMED,
    MEMORY_FRACTION,
    ON_BAD_FILE,
    STREAM_CHOICES,
    UNITS,
    StreamChoice,
    choose,
    default_workers,
    eval_batch_size,
    parse_bytes,
    physical_memory,
)
from fedxrisk.errors import BadFileError, DataFileError  # noqa: F401  (re-exported)


def attach_stream(fed: Any, choice: StreamChoice | None, device: str, batch_size: int = 32) -> None:
    """Give a streamed run's :class:`FederatedData` its :class:`Stream`, prefetching at most
    :data:`PREFETCH` steps per worker and no more than a quarter of the memory budget in all."""
    if choice is not None and choice.streamed and is_lazy(fed.data.x_train):
        fed.stream = Stream(fed.data.x_train, fed.shards, choice.workers, choice.on_bad_file,
                            pin_memory=str(device).startswith("cuda"),
                            prefetch=prefetch_steps(fed, choice, batch_size))  # fmt: skip


def prefetch_steps(fed: Any, choice: StreamChoice, batch_size: int) -> int:
    """Steps each worker decodes ahead: :data:`PREFETCH`, fewer when ``workers`` × steps of
    ``K × batch_size`` float32 samples would take more than a quarter of ``choice.budget``."""
    numel = 1
    for d in fed.data.input_shape:
        numel *= int(d)
    step = 4 * numel * batch_size * len(fed.shards)
    if not choice.budget:
        return PREFETCH
    return int(max(1, min(PREFETCH, choice.budget // 4 // (step * max(1, choice.workers)))))

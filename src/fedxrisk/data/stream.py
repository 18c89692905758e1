"""A run's training data, streamed or in memory: read the dataset lazily, choose, attach the stream.

:func:`open_training_data` applies ``data.stream`` (:mod:`fedxrisk.data.stream_choice`)
and :func:`attach_stream` gives the federated data its :class:`~fedxrisk.data.prefetch.Stream`.
The streaming machinery lives in :mod:`fedxrisk.data.prefetch` and the bad-file policy in
:mod:`fedxrisk.data.lazy`; their names are re-exported here, where callers have found them.
"""

from __future__ import annotations

from typing import Any

from fedxrisk.data.checks import check_labeled, check_test_classes
from fedxrisk.data.lazy import RESUME_ADVICE, decode_rows, is_lazy  # noqa: F401  (re-exported)
from fedxrisk.data.loading import load_dataset
from fedxrisk.data.prefetch import (  # noqa: F401  (re-exported)
    PREFETCH,
    Stream,
    input_chunks,
    materialize,
    sampler_requests,
    simulation_requests,
)
from fedxrisk.data.registry import FILE_DATASETS
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
from fedxrisk.data.types import binarize
from fedxrisk.errors import BadFileError, DataFileError  # noqa: F401  (re-exported)


def open_training_data(cfg: Any) -> tuple[Any, StreamChoice]:
    """What ``make_federated`` should read for the run ``cfg`` (a :class:`RunConfig`): the
    dataset's name (bundled data, or ``data.stream = false``: read into memory as always),
    or a binarized dataset read lazily, either decoded into memory here (``auto`` within
    the budget) or left lazy to be streamed; and the choice made."""
    if cfg.dataset not in FILE_DATASETS:
        return cfg.dataset, StreamChoice(False, "a bundled dataset, held in memory")
    if cfg.stream is False:
        return cfg.dataset, StreamChoice(False, "data.stream = false: the files are decoded into memory")
    lazy = load_dataset(
        cfg.dataset, cfg.data_dir, lazy=True, image_size=cfg.image_size, on_missing=cfg.on_missing
    )
    workers = default_workers() if cfg.workers is None else cfg.workers
    budget = parse_bytes(cfg.memory_budget)
    choice = choose(cfg.stream, int(lazy.x_train.nbytes), budget, workers)
    choice.on_bad_file = cfg.on_bad_file
    if getattr(cfg, "cache", False):  # decoded once into a memory-mapped file (data/cache.py)
        from fedxrisk.data.cache import use_cache

        choice.cache = use_cache(lazy, cfg.cache, workers)
    for split in ("train", "test", "val"):
        x, y = getattr(lazy, f"x_{split}"), getattr(lazy, f"y_{split}")
        if is_lazy(x):
            x.attach(y, workers=workers, on_bad_file=cfg.on_bad_file, bad_log=choice.bad_log)
            if not choice.streamed:
                try:
                    setattr(lazy, f"x_{split}", materialize(x).numpy())
                except BadFileError as e:  # before training: nothing to resume, so keep only what failed
                    raise DataFileError(e.detail) from None
    if choice.streamed and cfg.feature_shift:
        raise ValueError("data.feature_shift shifts inputs in memory; it cannot be combined with streaming "
                         "(set data.stream = false)")  # fmt: skip
    check_labeled(lazy, cfg.data_dir or cfg.dataset)  # what is in memory now; streamed inputs are not scanned
    data = binarize(lazy, cfg.positive_classes)
    check_test_classes(data, cfg.data_dir or cfg.dataset)
    for x, y in ((data.x_train, data.y_train), (data.x_test, data.y_test), (data.x_val, data.y_val)):
        if is_lazy(x):
            x.attach(y.numpy())  # binary labels: a replacement keeps the task's label
    return data, choice


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

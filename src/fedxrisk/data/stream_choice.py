"""Whether a run streams its training data (``data.stream``), with how many workers and what budget.

Settings and the choice only: no torch, nothing else of :mod:`fedxrisk.data`, so config
checks can use them cheaply. The streaming itself is :mod:`fedxrisk.data.prefetch`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

ON_BAD_FILE = ("error", "skip")
STREAM_CHOICES = (True, False, "auto")
MEMORY_FRACTION = 0.25  # default budget: a quarter of the machine's physical memory
MAX_NAMED = 20  # bad files named in the summary
UNITS = {"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "b": 1.0}
EVAL_SHARE = 0.5  # share of the memory budget one evaluation batch may take
ACTIVATION_FACTOR = 64  # a forward pass's peak bytes per sample, in units of its float32 input
MAX_EVAL_BATCH = 4096


MAX_WORKERS = 64  # decoding processes: beyond this they only compete for cores and memory


def default_workers() -> int:
    """Half the cores this process may use (at least 1): the other half trains."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // 2)


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * 10**9


def parse_bytes(value: int | float | str | None) -> int:
    """A memory size: a number of bytes, or a string such as ``"4GB"``, ``"500 MB"``; None: the default."""
    if value is None:
        return int(MEMORY_FRACTION * physical_memory())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"data.memory_budget must be > 0, got {value}")
        return int(value)
    text = str(value).strip().lower().replace(" ", "")
    for unit in sorted(UNITS, key=len, reverse=True):
        if text.endswith(unit):
            try:
                number = float(text[: -len(unit)])
            except ValueError:
                break
            if number > 0:
                return int(number * UNITS[unit])
            break
    raise ValueError(f"data.memory_budget must be a positive size such as 4GB or 500MB, got {value!r}")


def eval_batch_size(
    input_shape: tuple[int, ...], budget: int | None = None, setting: int | None = None
) -> int:
    """Samples per evaluation/prediction forward pass: ``setting`` (``data.eval_batch_size``) when
    given, else as many as fit in :data:`EVAL_SHARE` of the budget, counting each sample as its
    float32 input times :data:`ACTIVATION_FACTOR` (decoded copy and activations), between 1 and
    :data:`MAX_EVAL_BATCH`. ``budget`` None: the default budget (:func:`parse_bytes`)."""
    if setting is not None:
        if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
            raise ValueError(f"data.eval_batch_size must be a positive integer, got {setting!r}")
        return setting
    numel = 1
    for d in input_shape:
        numel *= int(d)
    per_sample = 4 * max(1, numel) * ACTIVATION_FACTOR
    share = EVAL_SHARE * (parse_bytes(None) if budget is None else budget)
    return int(min(MAX_EVAL_BATCH, max(1, share // per_sample)))


CACHE_WORDS = ("none", "auto", "true", "false", "off", "on", "yes", "no", "")


def check_cache(setting: Any, dataset: str, stream: bool | str, image_datasets: tuple[str, ...]) -> None:
    """``data.cache``: false, true or a folder path, for an image dataset that may be streamed."""
    word = isinstance(setting, str) and setting.strip().lower() in CACHE_WORDS
    if word or not isinstance(setting, (bool, str)):
        raise ValueError(
            "data.cache must be false (decode every time), true (the user cache folder) or a folder path, "
            f"got {setting!r}"
        )
    if setting is False:
        return
    if dataset not in image_datasets:
        raise ValueError(f"data.cache keeps decoded images of {list(image_datasets)}, not of {dataset!r}")
    if stream is False:
        raise ValueError(
            "data.cache serves streamed runs; with data.stream = false the images are decoded into memory "
            'anyway: set data.stream = true or "auto", or data.cache = false'
        )


def _fmt(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


@dataclass
class StreamChoice:
    """Whether the run streams its training data, and why (reported in the summary)."""

    streamed: bool
    reason: str
    decoded_bytes: int = 0
    budget: int = 0
    workers: int = 0
    on_bad_file: str = "error"
    bad_log: list[str] = field(default_factory=list)  # every replaced sample's file (skip)
    cache: list[dict[str, Any]] = field(default_factory=list)  # data.cache files used (data/cache.py)
    memory: dict[str, int] = field(default_factory=dict)  # how the budget is shared (data/budget.py)

    def summary(self) -> dict[str, Any]:
        cache = {"cache": self.cache} if self.cache else {}
        cache |= {"memory": self.memory} if self.memory else {}
        return {
            "streamed": self.streamed,
            "reason": self.reason,
            "decoded_train_bytes": self.decoded_bytes,
            "memory_budget_bytes": self.budget,
            "workers": self.workers,
            "on_bad_file": self.on_bad_file,
            "bad_samples_skipped": len(self.bad_log),
            "bad_files": sorted(set(self.bad_log))[:MAX_NAMED],
        } | cache


def choose(setting: bool | str, decoded_bytes: int, budget: int, workers: int) -> StreamChoice:
    """``data.stream``: ``true``/``false`` as told; ``"auto"`` streams when the decoded training
    set would exceed ``data.memory_budget``."""
    size = f"the decoded training set takes {_fmt(decoded_bytes)}"
    if setting is True:
        return StreamChoice(True, f"data.stream = true ({size})", decoded_bytes, budget, workers)
    if setting is False:
        return StreamChoice(False, f"data.stream = false ({size})", decoded_bytes, budget, 0)
    if decoded_bytes > budget:
        reason = f"data.stream = auto: {size}, more than the memory budget {_fmt(budget)}"
        return StreamChoice(True, reason, decoded_bytes, budget, workers)
    reason = f"data.stream = auto: {size}, within the memory budget {_fmt(budget)}"
    return StreamChoice(False, reason, decoded_bytes, budget, 0)

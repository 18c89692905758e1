"""Checks that stop a run before anything is written: settings, the output folder, checkpoints.

Each check raises :class:`~fedxrisk.experiment.ConfigError` (exit status 2 at the
CLI) with one line naming the setting or the file. ``validate_settings`` runs
inside :func:`fedxrisk.experiment.validate`; ``check_out_dir`` runs before any
data is loaded; ``read_checkpoint`` turns every way a checkpoint can be damaged
into one message that says how to restart.
"""

from __future__ import annotations

import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

FINITE = ("lr", "lr_decay", "window_growth", "dirichlet_alpha", "imratio", "dist_timeout")


def _error(message: str) -> Exception:
    from fedxrisk.experiment import ConfigError  # experiment imports this module

    return ConfigError(message)


def validate_settings(cfg: Any) -> None:
    """Settings the type checks let through: NaN/inf numbers, a negative seed, an unknown
    device, an empty positive-class list, distributed-only settings on another engine."""
    for name in FINITE:
        value = getattr(cfg, name, None)
        if isinstance(value, float) and not math.isfinite(value):
            raise _error(f"{name} must be a finite number, got {value}")
    for name, value in cfg.options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise _error(f"algorithm.{name} must be a finite number, got {value} ({cfg.algorithm})")
    if cfg.seed < 0:
        raise _error(f"seed must be ≥ 0, got {cfg.seed}")
    if cfg.positive_classes is not None and len(cfg.positive_classes) == 0:
        raise _error(
            "positive_classes is empty: name at least one class, or leave the key out for the default "
            "(the upper half of the classes)"
        )
    if cfg.engine != "distributed" and str(cfg.clients_per_rank) != "1":
        raise _error(
            f"clients_per_rank = {cfg.clients_per_rank!r} applies to engine = 'distributed' only "
            f"(engine is {cfg.engine!r}); drop it"
        )
    check_device(cfg.device)


def check_device(device: str) -> None:
    """``device`` names a torch device type that this machine has."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise _error(f"device {device!r} is not a torch device; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise _error(f"device {device!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise _error(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise _error(f"device {device!r} requested but MPS is not available")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise _error(f"device {device!r}: only cpu, cuda and mps are supported")


def check_batch_size(batch_size: int, shard_sizes: list[int]) -> int:
    """The batch size to train with: ``batch_size``, capped with a warning at the largest shard
    (a larger batch only repeats every sample); a warning too when it exceeds some shards."""
    largest, smallest = max(shard_sizes), min(shard_sizes)
    if batch_size > largest:
        warnings.warn(
            f"data.batch_size = {batch_size} exceeds every client's data (largest shard: {largest} "
            f"samples); training with batches of {largest}",
            stacklevel=2,
        )
        return largest
    if batch_size > smallest:
        small = sum(size < batch_size for size in shard_sizes)
        warnings.warn(
            f"data.batch_size = {batch_size} exceeds the data of {small} client(s) (smallest shard: "
            f"{smallest} samples): they repeat samples within a batch",
            stacklevel=2,
        )
    return batch_size


def check_out_dir(out: Path) -> None:
    """``out`` is new or empty (or refused with the reason), and can be created.

    A folder holding a fedxrisk run is refused with the way to continue it; any
    other non-empty folder is refused so that no user file is overwritten. A path
    that does not exist is created and removed again to prove it can be made.
    """
    if out.exists() and not out.is_dir():
        raise _error(f"--out {out} is a file, not a folder")
    if out.is_dir():
        refuse_run(out, ("checkpoint.pt", "config.toml"))
        names = sorted(p.name for p in out.iterdir())
        if names:
            shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
            raise _error(
                f"--out {out} is not empty and holds no fedxrisk run ({shown}); choose a new or empty folder"
            )
        return
    first_missing = out
    while not first_missing.parent.exists() and first_missing.parent != first_missing:
        first_missing = first_missing.parent
    try:
        out.mkdir(parents=True)
    except OSError as e:
        raise _error(f"--out {out} cannot be created ({e.strerror or e})") from None
    shutil.rmtree(first_missing)


def refuse_run(out: Path, unfinished: tuple[str, ...] = ("checkpoint.pt",)) -> None:
    """Refuse a folder holding a finished run (``summary.json``) or an unfinished one (any of
    ``unfinished``), with the way to continue it."""
    if (out / "summary.json").exists():
        raise _error(f"{out} already holds a finished run (summary.json); choose another --out")
    if any((out / name).exists() for name in unfinished):
        raise _error(f"{out} holds an unfinished run; continue it with `fedxrisk run --resume {out}`")


def read_checkpoint(path: Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``, or one message naming the file and how to restart.

    Never retries with ``weights_only=False``: a damaged or foreign file is not trusted.
    """
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # empty (EOFError), truncated (zip reader), random bytes (unpickling)
        reason = "empty file" if path.stat().st_size == 0 else _reason(e)
        raise _error(
            f"checkpoint unreadable: {path} ({reason}); delete it and run `fedxrisk run --resume "
            f"{path.parent}` to restart the run from round 0, or start afresh with another --out"
        ) from None
    if not isinstance(ckpt, dict) or "format" not in ckpt:
        raise _error(f"checkpoint unreadable: {path} (not a fedxrisk checkpoint); delete it to restart")
    return ckpt


def _reason(e: Exception) -> str:
    text = str(e)
    if "central directory" in text or "zip archive" in text:
        return "truncated or not a zip archive"
    if "Weights only load failed" in text or "pickle" in text.lower():
        return "not a torch checkpoint"
    return f"{type(e).__name__}"

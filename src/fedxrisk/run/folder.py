"""The run folder: every file a run writes or reads, and how.

A run folder holds ``config.toml`` (the resolved config, re-runnable with
``fedxrisk run --config``), ``history.csv`` (one row per evaluation),
``checkpoint.pt`` while the run is unfinished (every ``checkpoint_every``
rounds, written atomically), and at the end ``summary.json`` and ``model.pt``
(the final global model); a two-stage run keeps its first stage in
``pretrain/``, a run folder of its own. Every write goes through a temporary
file and a rename (:func:`replace_atomic`). :class:`RunFolder` is what the
training loop writes through; :func:`load_run`, :func:`load_model` and
:func:`load_checkpoint` read a folder back.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.engines.validation import BOUND_KEYS, VAL_KEYS
from fedxrisk.errors import ConfigError
from fedxrisk.models import build_model
from fedxrisk.outfiles import disk_errors, open_append, replace_atomic
from fedxrisk.run.identity import check_model_identity, fingerprint  # noqa: F401  (re-exported)
from fedxrisk.run.readback import parse_cell as _parse_cell  # noqa: F401  (re-exported)
from fedxrisk.run.readback import read_history, read_summary
from fedxrisk.run.spec import RunConfig

PAUC_KEYS = ("test_pauc30_norm", "test_pauc30_mcclish", "test_pauc50_norm", "test_pauc50_mcclish")
HISTORY_FIELDS = (
    "round", "step", "stage", "lr", "train_loss", "test_auroc", "test_ap", *PAUC_KEYS, *VAL_KEYS, *BOUND_KEYS,
    "client_auroc_mean", "client_auroc_std", "bytes_up_per_client",
    "bytes_down_per_client", "wall_seconds",
)  # fmt: skip
SURVIVAL_FIELDS = (  # a survival run's history.csv: Harrell's C instead of AUROC (metrics.evaluate_survival)
    "round", "step", "stage", "lr", "train_loss", "test_cindex", "val_cindex", "client_cindex_mean",
    "client_cindex_std", "bytes_up_per_client", "bytes_down_per_client", "wall_seconds",
)  # fmt: skip
CHECKPOINT = "checkpoint.pt"
FINAL_STATE = "final_state.pt"  # a finished run's last checkpoint: --resume RUN --rounds N extends it
CHECKPOINT_FORMAT = 1
CONFIG = "config.toml"
HISTORY = "history.csv"
SUMMARY = "summary.json"
MODEL = "model.pt"  # the selected model: the last, or the best on validation (selection = "best")
LAST_MODEL = "last.pt"  # selection = "best": the final model too
PRETRAIN_DIR = "pretrain"  # a two-stage run's first stage
Tensors = Mapping[str, torch.Tensor]


def default_out_dir(cfg: RunConfig, root: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(root) / f"{stamp}-{cfg.algorithm}-{cfg.dataset}"


def write_json_atomic(path: Path, obj: Any, intact: str | None = None) -> None:
    """Write JSON through a temporary file and a rename: never a half-written file."""
    text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    replace_atomic(path, lambda f: f.write(text), intact=intact)


def _torch_safe(obj: Any) -> Any:
    """NumPy arrays/scalars → tensors/Python numbers, so checkpoints load with ``weights_only=True``."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _torch_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_torch_safe(v) for v in obj)
    return obj


def resume_hint(folder: Path) -> str:
    return f"the run keeps its last checkpoint; free space, then `fedxrisk run --resume {folder}`"


def save_checkpoint(path: Path, obj: dict[str, Any]) -> None:
    """``torch.save`` through a temporary file and ``os.replace``: the old checkpoint survives a crash."""
    buffer = io.BytesIO()  # serialized first: torch's own file writer turns a full disk into a RuntimeError
    torch.save(_torch_safe(obj), buffer)
    data = buffer.getvalue()
    replace_atomic(path, lambda f: f.write(data), "wb", intact=resume_hint(path.parent))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint written by :func:`save_checkpoint` (tensors and plain Python only)."""
    ckpt = read_checkpoint(Path(path))
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path}: checkpoint format {ckpt.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    return ckpt


def json_safe(value: Any) -> Any:
    """NaN → None so summary.json stays standard JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


@dataclass
class RunResult:
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    out_dir: Path

    def table(self) -> Any:
        """The history as a pandas DataFrame, one row per evaluation (extra: ``fedxrisk[pandas]``)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                'RunResult.table() needs pandas: pip install "fedxrisk[pandas]"; '
                "RunResult.history has the same rows as a list of dicts"
            ) from e
        survival = bool(self.history) and "test_cindex" in self.history[0]
        return pd.DataFrame(self.history, columns=list(SURVIVAL_FIELDS if survival else HISTORY_FIELDS))


def start_run_folder(cfg: RunConfig, out: Path) -> None:
    """Refuse a folder holding a run, else create it and write ``config.toml``."""
    refuse_run(out)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, cfg)


def write_config(out: Path, cfg: RunConfig) -> None:
    from fedxrisk.run.configfile import config_to_toml

    header = f"fedxrisk {cfg.algorithm} on {cfg.dataset}; re-run with: fedxrisk run --config config.toml"
    text = config_to_toml(cfg, header)
    replace_atomic(out / "config.toml", lambda f: f.write(text))


def model_bytes(
    model: str,
    input_shape: Sequence[int],
    num_labels: int,
    params: Tensors,
    buffers: Tensors,
    preprocessing: Mapping[str, Any] | None = None,
    mark: str | None = None,
) -> bytes:
    """The bytes of ``model.pt``: the network's name, input shape, labels, its weights on the CPU and
    the preprocessing its inputs went through (:mod:`fedxrisk.data.preprocessing`); ``mark``: kept
    under ``privacy`` (a DP test-mode run's "NOT PRIVATE")."""
    from fedxrisk.data.preprocessing import to_stored

    blob = {
        "model": model,
        "input_shape": list(input_shape),
        "num_labels": num_labels,
        "params": {k: v.detach().cpu() for k, v in params.items()},
        "buffers": {k: v.detach().cpu() for k, v in buffers.items()},
        "preprocessing": to_stored(preprocessing),
        **({"privacy": mark} if mark is not None else {}),
    }
    buffer = io.BytesIO()
    torch.save(blob, buffer)
    return buffer.getvalue()


def save_model(
    path: Path,
    model: str,
    input_shape: Sequence[int],
    num_labels: int,
    params: Tensors,
    buffers: Tensors,
    preprocessing: Mapping[str, Any] | None = None,
    mark: str | None = None,
) -> str:
    """Write ``model.pt``; returns its sha256 (recorded in summary.json)."""
    data = model_bytes(model, input_shape, num_labels, params, buffers, preprocessing, mark)
    replace_atomic(path, lambda f: f.write(data), "wb", intact=resume_hint(path.parent))
    return hashlib.sha256(data).hexdigest()


@dataclass
class RunFolder:
    """The files of one run. ``primary``: this process writes (under torchrun only rank 0 does)."""

    path: Path
    primary: bool = True
    fields: tuple[str, ...] = HISTORY_FIELDS  # history.csv's columns (a private run adds "epsilon")
    model_mark: str | None = None  # written into every model.pt (a DP test-mode run: "NOT PRIVATE")

    def stage(self, name: str = PRETRAIN_DIR) -> RunFolder:
        """A two-stage run's first stage: a run folder inside this one."""
        return RunFolder(self.path / name, self.primary)

    def start(self, cfg: RunConfig) -> None:
        """Refuse a folder holding a run, else create it and write ``config.toml``."""
        if self.primary:
            start_run_folder(cfg, self.path)

    def write_history(self, rows: list[dict[str, Any]]) -> None:
        """``history.csv`` with exactly ``rows`` (drops rows evaluated after a checkpoint)."""
        if not self.primary:
            return

        def write_rows(f) -> None:
            writer = csv.DictWriter(f, fieldnames=self.fields, extrasaction="ignore")  # per-label lists
            writer.writeheader()
            writer.writerows(rows)

        replace_atomic(self.path / HISTORY, write_rows, intact=resume_hint(self.path))

    @contextmanager
    def history_rows(self) -> Iterator[Callable[[Mapping[str, Any]], None]]:
        """Append rows to ``history.csv`` as they come, each flushed to disk."""
        path = self.path / HISTORY
        with open_append(path) if self.primary else open(os.devnull, "a") as f:
            writer = csv.DictWriter(f, fieldnames=self.fields, extrasaction="ignore")

            def append(row: Mapping[str, Any]) -> None:
                with disk_errors(path, resume_hint(self.path)):
                    writer.writerow(row)
                    f.flush()

            yield append

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        if self.primary:
            save_checkpoint(self.path / CHECKPOINT, {"format": CHECKPOINT_FORMAT, **state})

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint, or None if the run wrote none (yet)."""
        path = self.path / CHECKPOINT
        return load_checkpoint(path) if path.exists() else None

    def drop_checkpoint(self) -> None:
        if self.primary:
            (self.path / CHECKPOINT).unlink(missing_ok=True)

    def save_final_state(self, state: dict[str, Any]) -> None:
        """The finished run's state, in checkpoint form, kept so the run can be extended."""
        if self.primary:
            save_checkpoint(self.path / FINAL_STATE, {"format": CHECKPOINT_FORMAT, **state})

    def save_model(
        self,
        model: str,
        input_shape: Sequence[int],
        num_labels: int,
        params: Tensors,
        buffers: Tensors,
        name: str = MODEL,
        preprocessing: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Write ``name`` (``model.pt`` by default); its sha256 (None on a rank that does not write)."""
        if self.primary:
            return save_model(
                self.path / name,
                model,
                input_shape,
                num_labels,
                params,
                buffers,
                preprocessing,
                self.model_mark,
            )
        return None

    def write_summary(self, summary: dict[str, Any]) -> None:
        """``summary.json``: written last, it commits the run."""
        if self.primary:
            write_json_atomic(self.path / SUMMARY, summary, resume_hint(self.path))

    def summary(self) -> dict[str, Any] | None:
        path = self.path / SUMMARY
        return json.loads(path.read_text()) if path.exists() else None


def load_model(run_dir: str | Path) -> torch.nn.Module:
    """The final global model of a finished run (``model.pt``), in eval mode, with the input
    normalization it was trained with (``data.normalize``, kept in the file's preprocessing)."""
    from fedxrisk.data.preprocessing import from_stored

    blob = torch.load(Path(run_dir) / "model.pt", map_location="cpu", weights_only=True)
    normalize = from_stored(blob.get("preprocessing")).get("normalize")
    model = build_model(blob["model"], tuple(blob["input_shape"]), 0, blob.get("num_labels", 1), normalize)
    model.load_state_dict({**blob["params"], **blob["buffers"]})
    return model.eval()


def load_run(run_dir: str | Path) -> RunResult:
    """A saved run: ``summary.json`` (or, for an unfinished run, ``config.toml``) and ``history.csv``."""
    out = Path(run_dir)
    if (out / "summary.json").exists():
        summary = read_summary(out / "summary.json")
    elif (out / "config.toml").exists():
        from fedxrisk.run.configfile import flat_unchecked, read_config_file

        summary = {"status": "unfinished", "config": flat_unchecked(read_config_file(out / "config.toml"))}
    else:
        raise ConfigError(f"{out} is not a run folder (no summary.json or config.toml)")
    history = read_history(out / "history.csv") if (out / "history.csv").exists() else []
    return RunResult(summary, history, out)


def check_out_dir(out: Path) -> None:
    """``out`` is new or empty (or refused with the reason), and can be created.

    A folder holding a fedxrisk run is refused with the way to continue it; any
    other non-empty folder is refused so that no user file is overwritten. A path
    that does not exist is created and removed again to prove it can be made.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    if out.is_dir():
        refuse_run(out, ("checkpoint.pt", "config.toml"))
        names = sorted(p.name for p in out.iterdir())
        if names:
            shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
            raise ConfigError(
                f"--out {out} is not empty and holds no fedxrisk run ({shown}); choose a new or empty folder"
            )
        return
    first_missing = out
    while not first_missing.parent.exists() and first_missing.parent != first_missing:
        first_missing = first_missing.parent
    try:
        out.mkdir(parents=True)
    except OSError as e:
        raise ConfigError(f"--out {out} cannot be created ({e.strerror or e})") from None
    shutil.rmtree(first_missing)


def refuse_run(out: Path, unfinished: tuple[str, ...] = ("checkpoint.pt",)) -> None:
    """Refuse a folder holding a finished run (``summary.json``) or an unfinished one (any of
    ``unfinished``), with the way to continue it."""
    if (out / "summary.json").exists():
        raise ConfigError(f"{out} already holds a finished run (summary.json); choose another --out")
    if any((out / name).exists() for name in unfinished):
        raise ConfigError(f"{out} holds an unfinished run; continue it with `fedxrisk run --resume {out}`")


def read_checkpoint(path: Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``, or one message naming the file and how to restart.

    Never retries with ``weights_only=False``: a damaged or foreign file is not trusted.
    """
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # empty (EOFError), truncated (zip reader), random bytes (unpickling)
        reason = "empty file" if path.stat().st_size == 0 else _reason(e)
        raise ConfigError(
            f"checkpoint unreadable: {path} ({reason}); delete it and run `fedxrisk run --resume "
            f"{path.parent}` to restart the run from round 0, or start afresh with another --out"
        ) from None
    if not isinstance(ckpt, dict) or "format" not in ckpt:
        raise ConfigError(f"checkpoint unreadable: {path} (not a fedxrisk checkpoint); delete it to restart")
    return ckpt


def _reason(e: Exception) -> str:
    text = str(e)
    if "central directory" in text or "zip archive" in text:
        return "truncated or not a zip archive"
    if "Weights only load failed" in text or "pickle" in text.lower():
        return "not a torch checkpoint"
    return f"{type(e).__name__}"

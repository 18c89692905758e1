"""A finished run's model applied to new inputs, with the preprocessing of training.

Shared by :mod:`fedxrisk.evaluation` and :mod:`fedxrisk.prediction`: load the
model from ``config.toml`` + ``model.pt`` (no engine is built), and read inputs
in batches without decoding them all first (:mod:`fedxrisk.inputs`).

Preprocessing matches the readers used in training: images are decoded with
Pillow, converted to the model's channel count (L or RGB), resized bilinearly
to its input size and scaled to [0, 1]; feature vectors are standardized with
the training mean and standard deviation stored in ``model.pt`` (its
``preprocessing`` entry, :mod:`fedxrisk.data.preprocessing`; a ``model.pt``
written before it existed falls back to re-reading the run's data); every other
input is taken as the model's input as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.data.preprocessing import standardization
from fedxrisk.errors import ConfigError
from fedxrisk.run.spec import RunConfig


class InputError(ConfigError):
    """A bad run folder or input file; the message names it. The CLI exits with status 2."""


@dataclass
class TrainedModel:
    """A run's final model on ``device`` in eval mode, and what its inputs must look like."""

    run_dir: Path
    config: RunConfig
    problem: object  # fedxrisk.problem.Problem around the loaded model
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    input_shape: tuple[int, ...]
    label_names: list[str]
    standardize: tuple[np.ndarray, np.ndarray] | None
    positive: dict[str, Any] | None = None  # summary.json's positive_class: {"ids", "names"}
    preprocessing: dict[str, Any] = field(default_factory=dict)  # data/preprocessing.py

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def logits(self, x: np.ndarray | torch.Tensor) -> np.ndarray:
        """Logits ``[B]`` (``[B, L]`` multi-label) of raw inputs, after the run's feature standardization."""
        x = torch.as_tensor(np.asarray(x, dtype=np.float32) if isinstance(x, np.ndarray) else x)
        if self.standardize is not None:
            mean, std = self.standardize
            x = (x - torch.from_numpy(mean)) / torch.from_numpy(std)
        return self.model_logits(x)

    def model_logits(self, x: torch.Tensor) -> np.ndarray:
        """Logits of inputs already in the model's space (a reader's output), as the run evaluated them."""
        from fedxrisk.metrics import predict

        return predict(self.problem, self.params, self.buffers, x)  # type: ignore[arg-type]


def resolve_workers(workers: int | None) -> int:
    """Decoding processes: ``workers``, or by default half the cores (``data.stream.default_workers``)."""
    from fedxrisk.data.stream import default_workers
    from fedxrisk.data.stream_choice import MAX_WORKERS

    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        raise InputError(f"--workers must be between 0 and {MAX_WORKERS}, got {workers}")
    return default_workers() if workers is None else workers


def load_trained(run_dir: str | Path, device: str = "cpu") -> TrainedModel:
    """The model of a finished run folder, on ``device``; :class:`InputError` when it is not one."""
    from fedxrisk.run.assemble import scoring_problem
    from fedxrisk.run.configfile import load_config
    from fedxrisk.run.identity import check_config_identity, check_model_identity

    folder = Path(run_dir)
    if not folder.is_dir():
        raise InputError(f"{folder}: run folder not found")
    for name in ("config.toml", "model.pt"):
        if not (folder / name).is_file():
            raise InputError(
                f"{folder}: no {name}; not a finished fedxrisk run (evaluate a run that completed)"
            )
    from fedxrisk.run.checks import check_device

    check_device(device)  # a ConfigError (one line), as `fedxrisk run --device`
    check_model_identity(folder)  # a model.pt swapped in from elsewhere is refused
    cfg = load_config(folder / "config.toml")
    check_config_identity(folder, cfg.to_dict())  # another dataset or model would not fit model.pt
    model, blob, prep = read_model_file(folder / "model.pt")
    labels = int(blob["num_labels"])
    from fedxrisk.data.stream_choice import eval_batch_size, parse_bytes

    chunk = eval_batch_size(tuple(blob["input_shape"]), parse_bytes(cfg.memory_budget), cfg.eval_batch_size)
    problem = scoring_problem(model, labels, device, chunk)
    params, buffers = problem.init_model()
    names = _label_names(folder, labels, prep.get("label_names"))
    summary = _summary(folder / "summary.json")
    standardize = standardization(prep) if prep else feature_standardization(cfg)  # older model.pt
    positive = prep.get("positive_class") or summary.get("positive_class")  # the model's own record first
    return TrainedModel(folder, cfg, problem, params, buffers, tuple(blob["input_shape"]), names,
                        standardize, positive, prep)  # fmt: skip


def _summary(path: Path) -> dict[str, Any]:
    """The run's ``summary.json`` ({} when absent); a damaged one is one line naming it."""
    if not path.is_file():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable summary ({_reason(e)})") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{path}: not a fedxrisk summary (expected a JSON object)")
    return summary


def _reason(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_model_file(path: Path) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """(model in eval mode, the file's dict, its preprocessing) of a ``model.pt``, checked entry by entry.

    Read with ``weights_only=True`` (a pickled payload is refused, never run); a file
    that is not a fedxrisk model, whose weights do not fit its network, or that holds
    NaN/inf weights raises :class:`InputError` naming the file and the problem.
    """
    from fedxrisk.data.preprocessing import from_stored
    from fedxrisk.run.assemble import saved_model
    from fedxrisk.run.weights import load_reason

    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # random bytes, a pickle payload, a truncated zip alike
        raise InputError(f"{path}: not a fedxrisk model file ({load_reason(e)})") from None
    if not isinstance(blob, dict) or not all(k in blob for k in ("model", "input_shape", "params")):
        what = (
            type(blob).__name__
            if not isinstance(blob, dict)
            else f"a dict with keys {sorted(map(str, blob))[:6]}"
        )
        raise InputError(
            f"{path}: not a fedxrisk model file (holds {what}; expected model, input_shape, params)"
        )
    shape, labels = blob["input_shape"], blob.get("num_labels", 1)
    tensors = {**(blob.get("params") or {}), **(blob.get("buffers") or {})}
    if (
        not isinstance(blob["model"], str)
        or not isinstance(shape, (list, tuple))
        or not all(isinstance(d, int) and d > 0 for d in shape)
        or not isinstance(labels, int)
        or labels < 1
        or not all(isinstance(v, torch.Tensor) for v in tensors.values())
    ):
        raise InputError(
            f"{path}: not a fedxrisk model file (model, input_shape, num_labels or weights malformed)"
        )
    try:
        prep = legacy_record(from_stored(blob.get("preprocessing")))
    except ValueError as e:
        raise InputError(f"{path}: {e}") from None
    try:
        model = saved_model(blob["model"], tuple(shape), labels, prep.get("normalize"))
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise InputError(f"{path}: cannot build its network {blob['model']!r} ({_reason(e)})") from None
    own = model.state_dict()
    wrong = [k for k in own if k not in tensors and not k.endswith("num_batches_tracked")]
    wrong += [k for k, v in tensors.items() if k not in own or v.shape != own[k].shape]
    if wrong:
        raise InputError(
            f"{path}: its weights do not fit its network {blob['model']!r} (missing, extra or "
            f"wrongly shaped: {', '.join(wrong[:4])}{' …' if len(wrong) > 4 else ''})"
        )
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise InputError(
            f"{path}: non-finite weights (NaN/inf) in {', '.join(bad[:4])}{' …' if len(bad) > 4 else ''}; "
            "the model cannot score anything (retrain, or use a checkpoint taken before it diverged)"
        )
    model.load_state_dict({**own, **{k: v.to(own[k].dtype) for k, v in tensors.items()}})
    return model.eval(), blob, prep


def legacy_record(prep: dict[str, Any]) -> dict[str, Any]:
    """A record written before every number was in raw space (before ``label_names`` was recorded):
    a standardizing reader's ``range`` there was taken AFTER standardization while its mean/std were
    raw (ADBench's ``X, y``: no input could pass both checks), so that range is dropped; the column
    means still catch rows on another scale."""
    if "mean" in prep and "range" in prep and "label_names" not in prep:
        return {k: v for k, v in prep.items() if k != "range"}
    return prep


def _label_names(folder: Path, labels: int, recorded: list[str] | None = None) -> list[str]:
    """Label names of a multi-label run: model.pt's record, else summary.json's (older files), else
    ``label0…``; one label: ``["score"]``."""
    if labels == 1:
        return ["score"]
    names = recorded
    if not names and (folder / "summary.json").is_file():
        names = json.loads((folder / "summary.json").read_text()).get("label_names")
    return list(names) if names and len(names) == labels else [f"label{j}" for j in range(labels)]


def feature_standardization(cfg: RunConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) the run's reader applied to its features, or None when it applied none.

    ``tabular`` and ``breast_cancer`` standardize with the mean and std (+1e-8) of
    their raw training split (data/readers/arrays.py, data/bundled.py).
    """
    if cfg.dataset == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        from fedxrisk.data.types import split

        d = load_breast_cancer()
        raw = split("breast_cancer", d.data.astype(np.float32), d.target.astype(np.int64), 2).x_train
    elif cfg.dataset == "tabular":
        raw = _raw_tabular_train(cfg.data_dir)
    else:
        return None
    return raw.mean(0), (raw.std(0) + 1e-8).astype(np.float32)


def _raw_tabular_train(data_dir: str | None) -> np.ndarray:
    """The unstandardized training features the ``tabular`` reader saw."""
    from fedxrisk.data.readers.arrays import TABULAR_LAYOUT, _read_table
    from fedxrisk.data.readers.base import MissingDataError, require_dir, split_labeled

    root = require_dir(data_dir, "tabular", TABULAR_LAYOUT)
    if (root / "train.csv").is_file() and (root / "test.csv").is_file():
        return _read_table(root / "train.csv")[0]
    if (root / "data.csv").is_file():
        x, y, _, _ = _read_table(root / "data.csv")
        return split_labeled("tabular", x, y, int(y.max()) + 1).x_train
    raise MissingDataError(
        f"the run was trained on tabular data in {root}, which is needed to standardize inputs as in "
        "training but has no train.csv + test.csv or data.csv"
    )

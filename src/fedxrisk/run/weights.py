"""Start a run from saved weights: ``model.init_from`` and ``model.reset_head``.

The source is a fedxrisk run folder (its ``model.pt``), a fedxrisk ``model.pt``, or
any PyTorch state dict / checkpoint file (a dict of tensors, or one under
``state_dict`` / ``model_state_dict`` / ``model``), read with ``weights_only=True``.
Loading is strict: every parameter and buffer of the chosen model must be in the
file with the same shape (a missing ``num_batches_tracked`` counter keeps 0),
and the file may hold nothing else. Every mismatch is named in one error.

``reset_head`` re-initialises the classifier head (the FDAM protocol discards the
cross-entropy classifier before AUC training, Yuan et al. 2021 §6.2): the head's
keys are not read from the file (they may be absent or of another shape) and the
head keeps the seeded initialisation of a run started from scratch. A model names
its head with a ``head_name`` attribute (every bundled model does); otherwise its
last ``nn.Linear`` layer is the head.

The weights are written into the model *before* the algorithm is built, so every
algorithm's ``init`` (which copies the model's parameters and buffers) and every
engine start from exactly them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedxrisk.errors import ConfigError

MODEL_FILE = "model.pt"
NESTED_KEYS = ("state_dict", "model_state_dict", "model")  # common checkpoint layouts
SHOWN = 6  # keys listed per kind of mismatch


def head_name(model: nn.Module) -> str | None:
    """The classifier head's module name: ``model.head_name``, else the last ``nn.Linear``."""
    named = getattr(model, "head_name", None)
    if named:
        return named
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return linears[-1] if linears else None


def _is_tensor_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def read_state(path: str | Path) -> tuple[dict[str, torch.Tensor], str | None]:
    """``(state dict, model name if the file says)`` from a run folder or a weights file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"model.init_from: {str(path)!r} does not exist")
    file = path / MODEL_FILE if path.is_dir() else path
    if path.is_dir() and not file.is_file():
        raise ConfigError(
            f"model.init_from: folder {str(path)!r} has no {MODEL_FILE} (not a finished fedxrisk run)"
        )
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and weights_only errors alike
        reason = load_reason(e)
        raise ConfigError(
            f"model.init_from: {str(file)!r} is not a PyTorch weights file ({reason})"
        ) from None
    if isinstance(blob, Mapping) and _is_tensor_dict(blob.get("params")):  # a fedxrisk model.pt
        state = {**blob["params"], **(blob.get("buffers") or {})}
        return state, blob.get("model") if isinstance(blob.get("model"), str) else None
    if _is_tensor_dict(blob):
        return _strip_module(dict(blob)), None
    for key in NESTED_KEYS:
        if isinstance(blob, Mapping) and _is_tensor_dict(blob.get(key)):
            return _strip_module(dict(blob[key])), None
    raise ConfigError(
        f"model.init_from: {str(file)!r} holds no state dict (expected a dict of tensors, a fedxrisk "
        f"model.pt, or a checkpoint with one of {list(NESTED_KEYS)})"
    )


def load_reason(e: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a few words (torch's own text is a page)."""
    import pickle

    text = str(e).strip()
    if isinstance(e, pickle.UnpicklingError) or "Weights only load failed" in text:
        return "it holds more than tensors and plain values; never unpickled, as that could run code"
    if isinstance(e, EOFError) or "central directory" in text:
        return "empty, truncated or not a PyTorch file"
    if len(text) < 20:  # torch's legacy reader on arbitrary bytes: a bare key or number
        return "not a PyTorch file"
    return text.splitlines()[0].split(". ")[0]


def _strip_module(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the ``module.`` prefix ``DataParallel`` / DDP add to every key."""
    if all(k.startswith("module.") for k in state):
        return {k.removeprefix("module."): v for k, v in state.items()}
    return state


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(map(str, t.shape)) + "]"


def _listing(items: list[str]) -> str:
    more = f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def load_weights(
    model: nn.Module,
    model_name: str,
    source: str | Path | Mapping[str, torch.Tensor] | None,
    reset_head: bool = False,
) -> dict[str, Any]:
    """Load ``source`` (a path, or a state dict in memory) into ``model`` in place, strictly;
    with ``reset_head`` the head keeps its fresh initialisation.

    Returns what the run summary records under ``init``. Raises :class:`ConfigError`
    naming every missing, unexpected and shape-mismatched key.
    """
    head = head_name(model)
    if reset_head and head is None:
        raise ConfigError(
            f"model.reset_head: model {model_name!r} has no classifier head "
            "(no head_name attribute and no nn.Linear layer)"
        )
    prefix = f"{head}." if reset_head else None
    own = model.state_dict()
    in_head = (lambda k: k.startswith(prefix)) if prefix else (lambda k: False)
    if source is None:  # reset_head alone would do nothing: the fresh model's head is fresh already
        raise ConfigError(
            "model.reset_head without model.init_from does nothing (every weight is freshly initialised); "
            "set model.init_from (--init-from) to the weights to start from, or drop reset_head"
        )
    if isinstance(source, Mapping):
        state, saved_model, path = {k: v.detach() for k, v in source.items()}, None, "the given state dict"
    else:
        (state, saved_model), path = read_state(source), str(source)
    adapt = getattr(model, "adapt_state_dict", None)  # a model's own key renames (DenseNet: torchvision's)
    if adapt is not None:
        state = adapt(state)
    missing = [
        f"{k} {_shape(v)}"
        for k, v in own.items()
        if k not in state and not in_head(k) and not k.endswith("num_batches_tracked")
    ]
    unexpected = [f"{k} {_shape(v)}" for k, v in state.items() if k not in own and not in_head(k)]
    mismatched = [
        f"{k} file {_shape(v)} vs model {_shape(own[k])}"
        for k, v in state.items()
        if k in own and not in_head(k) and v.shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        parts = [
            f"{label} ({len(keys)}): {_listing(keys)}"
            for label, keys in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("shape mismatch", mismatched),
            )
            if keys
        ]
        saved = (
            f" (the file holds a {saved_model!r} model)" if saved_model and saved_model != model_name else ""
        )
        raise ConfigError(
            f"model.init_from: {path!r} does not fit model {model_name!r}{saved}: " + "; ".join(parts)
        )
    integer = [k for k in own if k in state and not in_head(k) and own[k].is_floating_point()
               and not state[k].is_floating_point()]  # fmt: skip
    if integer:  # cast to float they would load as whole numbers: a model that trains to chance
        raise ConfigError(
            f"model.init_from: {path!r} holds integer tensors for floating-point weights in {_listing(integer)} "
            f"({state[integer[0]].dtype}); save the trained model's float weights"
        )
    bad = [k for k in own if k in state and not in_head(k) and state[k].is_floating_point()]
    bad = [k for k in bad if not torch.isfinite(state[k]).all()]
    if bad:
        raise ConfigError(
            f"model.init_from: {path!r} holds non-finite weights (NaN/inf) in {_listing(bad)}; "
            "start from a model saved before it diverged"
        )
    loaded = {k: state[k].to(own[k].dtype) if k in state else own[k] for k in own if not in_head(k)}
    with torch.no_grad():
        model.load_state_dict({**own, **loaded}, strict=True)
    return {"from": path, "reset_head": reset_head, "head": head, "keys_loaded": len(loaded)}

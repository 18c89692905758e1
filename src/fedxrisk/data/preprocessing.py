"""What a model's inputs went through before training, stored with the model and applied again later.

This module is the one place that writes and reads the ``preprocessing`` dict: a reader
builds it (:func:`features`, :func:`value_range`), ``run/folder.py`` stores it in
``model.pt`` (:func:`to_stored`), and ``inference.py`` reads it back (:func:`from_stored`), so
``predict`` and ``evaluate`` need no training data. Values are plain lists, numbers and
strings, which ``torch.load(weights_only=True)`` reads without running any code.

Keys (each optional; an unknown key is kept as is, so other settings can be added here):

``kind``         ``"features"`` (columns of a table) | ``"arrays"`` (an ``.npz``) | ``"images"``
``features``     the feature column names in the model's order (tabular CSV, breast_cancer)
``mean``/``std`` per-feature standardization of raw inputs, ``(x - mean) / std``
``id_columns``   columns of the training CSV that were identifiers, never features
``range``        ``[min, max]`` of the raw training inputs (an ``.npz``): inputs far outside are refused

``image_size``   S of the S×S images the model was trained on (image datasets)
``normalize``    ``{"mean": [...], "std": [...]}`` per image channel, applied by the model's
                 input hook (:func:`fedxrisk.models.normalize_inputs`) after scaling to [0, 1]
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

KINDS = ("features", "arrays", "images")
AUGMENTATIONS = ("none", "flip", "crop_flip")  # data.augment: training batches only
IMAGE_DATASETS = ("folder", "sites", "manifest", "chexpert", "chestxray_ih")  # readers taking image_size
ID_PATTERN = re.compile(r"^((?i:id)|.*[_\- ](?i:id)|.*[a-z](Id|ID))$")  # id, ID, patient_id, PatientID …
RANGE_SLACK = 10.0  # inputs beyond min/max ± 10 × the training span are refused as another scale


def is_id_column(name: str) -> bool:
    """The documented rule: ``id`` in any case, a name ending in ``_id``/``-id``/`` id`` (any case),
    or a camel-case name ending in ``Id``/``ID`` after a lower-case letter (``PatientID``)."""
    return bool(ID_PATTERN.match(name.strip()))


def features(
    names: Sequence[str], mean: np.ndarray, std: np.ndarray, id_columns: Sequence[str] = ()
) -> dict[str, Any]:
    """The record of standardized feature columns."""
    return {
        "kind": "features",
        "features": [str(n) for n in names],
        "mean": [float(v) for v in np.asarray(mean, np.float64)],
        "std": [float(v) for v in np.asarray(std, np.float64)],
        "id_columns": [str(n) for n in id_columns],
    }


RANGE_ROWS = 10_000  # rows read for the range of a large (memory-mapped) array, evenly spaced


def value_range(x: np.ndarray) -> dict[str, Any]:
    """The record of arrays taken as they are: the range of the (finite) training inputs, from at
    most :data:`RANGE_ROWS` evenly spaced rows, so a memory-mapped array is not read whole."""
    if len(x) == 0 or not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x):
        return {"kind": "arrays"}
    rows = np.asarray(x if len(x) <= RANGE_ROWS else x[np.linspace(0, len(x) - 1, RANGE_ROWS).astype(int)])
    finite = rows[np.isfinite(rows)]
    if finite.size == 0:
        return {"kind": "arrays"}
    record: dict[str, Any] = {"kind": "arrays", "range": [float(finite.min()), float(finite.max())]}
    if rows.ndim == 2 and np.isfinite(rows).all():  # feature rows: each column's scale, for predict
        record["column_mean"] = [float(v) for v in rows.mean(0, dtype=np.float64)]
        record["column_std"] = [float(v) for v in rows.std(0, dtype=np.float64)]
    return record


OFF_SCALE = 3.0  # median |input column mean − training's| / training std above this: another scale


def off_scale(record: Mapping[str, Any], column_mean: np.ndarray) -> str | None:
    """Why rows whose columns average ``column_mean`` are not on the training scale (pre-standardized
    rows given to a model trained on raw values, or the reverse), or None when they are."""
    keys = ("column_mean", "column_std") if "column_mean" in record else ("mean", "std")  # arrays | features
    if keys[0] not in record or keys[1] not in record or len(record[keys[0]]) != len(column_mean):
        return None
    mean, std = np.asarray(record[keys[0]]), np.asarray(record[keys[1]])
    varying = std > 0
    if not varying.any():
        return None
    z = float(np.median(np.abs(column_mean[varying] - mean[varying]) / std[varying]))
    if z <= OFF_SCALE:
        return None
    return (
        f"the columns average a median {z:.1f} training standard deviations away from the training data's "
        "(pre-standardized or rescaled rows?); give the raw values the model was trained on"
    )


NORMALIZE_PRESETS = {"imagenet": ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])}


def normalization(setting: Any, channels: int | None = None) -> dict[str, list[float]] | None:
    """``data.normalize`` as stored: None/``"none"`` → None; ``"imagenet"`` or
    ``{"mean": [...], "std": [...]}`` (one value per channel, or one for all) → a checked dict.
    ``ValueError`` naming the problem."""
    if setting is None or setting == "none":
        return None
    if isinstance(setting, str):
        if setting not in NORMALIZE_PRESETS:
            raise ValueError(
                f'data.normalize must be "none", {sorted(NORMALIZE_PRESETS)} or {{mean = [...], std = [...]}}, '
                f"got {setting!r}"
            )
        mean, std = NORMALIZE_PRESETS[setting]
        setting = {"mean": mean, "std": std}
    if not isinstance(setting, Mapping) or set(setting) != {"mean", "std"}:
        raise ValueError(f"data.normalize as a table needs exactly the keys mean and std, got {setting!r}")
    mean, std = (_numbers(setting[k], f"normalize {k}") for k in ("mean", "std"))
    if len(mean) != len(std) or not mean:
        raise ValueError(f"data.normalize mean and std need as many values, got {len(mean)} and {len(std)}")
    if min(std) <= 0:
        raise ValueError("data.normalize std must be > 0")
    if channels is not None and len(mean) not in (1, channels):
        raise ValueError(
            f"data.normalize has {len(mean)} values per statistic; the images have {channels} channel(s)"
        )
    return {"mean": mean, "std": std}


def _numbers(value: Any, key: str, width: int | None = None) -> list[float]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"preprocessing {key!r} must be a list of numbers")
    if not all(math.isfinite(v) for v in value):
        raise ValueError(f"preprocessing {key!r} holds non-finite values")
    if width is not None and len(value) != width:
        raise ValueError(f"preprocessing {key!r} has {len(value)} entries, expected {width}")
    return [float(v) for v in value]


def to_stored(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The dict written into ``model.pt`` (checked as :func:`from_stored` will read it)."""
    return from_stored(dict(record or {}))


def from_stored(record: Any) -> dict[str, Any]:
    """A checked copy of a stored record; ``ValueError`` naming what is wrong (a tampered file)."""
    if record is None:
        return {}
    if not isinstance(record, Mapping) or not all(isinstance(k, str) for k in record):
        raise ValueError("preprocessing must be a dict with string keys")
    out = dict(record)
    if out.get("kind") is not None and out["kind"] not in KINDS:
        raise ValueError(f"preprocessing kind {out['kind']!r} is not one of {list(KINDS)}")
    names = out.get("features")
    if names is not None:
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ValueError("preprocessing 'features' must be a list of column names")
        if len(set(names)) != len(names):
            raise ValueError("preprocessing 'features' names a column twice")
        out["features"] = list(names)
    width = len(names) if names is not None else None
    for key in ("mean", "std"):
        if key in out:
            out[key] = _numbers(out[key], key, width)
    if "std" in out and min(out["std"], default=1.0) <= 0:
        raise ValueError("preprocessing 'std' must be > 0")
    if "range" in out:
        out["range"] = _numbers(out["range"], "range", 2)
    for key in ("column_mean", "column_std"):
        if key in out:
            out[key] = _numbers(out[key], key)
    if "normalize" in out:
        out["normalize"] = normalization(out["normalize"])
    size = out.get("image_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError("preprocessing 'image_size' must be a positive integer")
    for key in ("id_columns", "outcome_columns"):  # outcome: a survival table's time/event, not inputs
        ids = out.get(key, [])
        if not isinstance(ids, (list, tuple)) or not all(isinstance(n, str) for n in ids):
            raise ValueError(f"preprocessing {key!r} must be a list of column names")
    return out


def standardization(record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mean, std)`` float32 to apply to raw inputs, or None."""
    if "mean" not in record or "std" not in record:
        return None
    return np.asarray(record["mean"], np.float32), np.asarray(record["std"], np.float32)


def out_of_range(record: Mapping[str, Any], lo: float, hi: float) -> str | None:
    """Why inputs spanning ``[lo, hi]`` are not on the training scale, or None when they are."""
    if "range" not in record:
        return None
    a, b = record["range"]
    slack = RANGE_SLACK * max(b - a, 1e-6)
    if lo < a - slack or hi > b + slack:
        return (
            f"values span [{lo:.4g}, {hi:.4g}] but the model was trained on inputs in [{a:.4g}, {b:.4g}]; "
            "scale them as the training data were"
        )
    return None

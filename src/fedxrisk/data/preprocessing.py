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

Image size and normalization settings belong here too (``image_size``, ``normalize``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

KINDS = ("features", "arrays", "images")
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
    return {"kind": "arrays", "range": [float(finite.min()), float(finite.max())]}


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
    ids = out.get("id_columns", [])
    if not isinstance(ids, (list, tuple)) or not all(isinstance(n, str) for n in ids):
        raise ValueError("preprocessing 'id_columns' must be a list of column names")
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

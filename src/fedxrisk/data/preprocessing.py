"""What a model's inputs went through before training, stored with the model and applied again later.

This module is the one place that writes and reads the ``preprocessing`` dict: a reader
builds it (:func:`features`, :func:`value_range`), ``run/folder.py`` stores it in
``model.pt`` (:func:`to_stored`), and ``inference.py`` reads it back (:func:`from_stored`), so
``predict`` and ``evaluate`` need no training data. Values are plain lists, numbers and
strings, which ``torch.load(weights_only=True)`` reads without running any code.

Every number is in ONE space, the raw inputs' (what a user's file holds): a reader that
standardizes goes through ``data.readers.base.standardize`` (:func:`standardized`), which records
the mean, std and range of the raw training rows, so ``predict`` checks and standardizes raw rows
with the same record (:func:`off_training_scale`, one check for every input format).

Keys (each optional; an unknown key is kept as is, so other settings can be added here):

``kind``         ``"features"`` (named columns) | ``"arrays"`` (an ``.npz``) | ``"images"``
``features``     the feature column names in the model's order (tabular CSV, heart_disease, breast_cancer)
``mean``/``std`` per-feature standardization of raw inputs, ``(x - mean) / std``
``id_columns``   columns of the training CSV that were identifiers, never features
``range``        ``[min, max]`` of the raw training inputs: inputs far outside are refused
``column_mean``/``column_std``  per-column scale of raw training rows taken as they are (an ``.npz``)
``label_names``  the data's class (or label) names; ``positive_class``: ``{"ids", "names"}`` scored 1
``sites``        the sites' names, site id order (a reader that knows them)

``image_size``   S of the S×S images the model was trained on (image datasets)
``channels``     their channel order as decoded: ``"RGB"`` or ``"L"`` (grey), values in [0, 1]
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
CHANNELS = ("RGB", "L")  # an image model's channel order (Pillow's modes), as its reader decoded them
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


def standardized(
    raw_train: np.ndarray, names: Sequence[str] | None = None, id_columns: Sequence[str] = ()
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """(record, mean, std) of features standardized with the RAW training rows' mean and std (+1e-8):
    the record holds ``names`` (None: an unnamed array, taken by position), mean, std and the range,
    all in raw space (``data.readers.base.standardize`` is the one path readers call)."""
    mean, std = raw_train.mean(0), raw_train.std(0) + 1e-8
    record = features(names, mean, std, id_columns) if names is not None else {
        "kind": "arrays", "mean": [float(v) for v in mean], "std": [float(v) for v in std]}  # fmt: skip
    found = value_range(raw_train).get("range")
    return {**record, **({"range": found} if found else {})}, mean, std


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
STANDARDIZED_RATIO = 2.0  # the rows sit this many times closer to 0 (in training stds) than to the raw means
STANDARDIZED_ROWS = 20  # rows needed before column means tell pre-standardized rows from raw ones


def off_scale(
    record: Mapping[str, Any], column_mean: np.ndarray, rows: int = STANDARDIZED_ROWS
) -> str | None:
    """Why rows whose columns average ``column_mean`` are not on the (raw) training scale, or None.

    Two readings of the rows are compared column by column, in training standard deviations:
    as raw values (distance ``|mean_in − mean| / std``) and as already standardized values (distance
    ``|mean_in|``, training rows averaging 0 there). The rows are refused when the raw reading puts
    the columns a median > :data:`OFF_SCALE` stds away, or (from :data:`STANDARDIZED_ROWS` ``rows`` on:
    a few raw rows, e.g. one patient with every 0/1 column at 0, can sit near 0 too) an RMS > 1 std
    away and :data:`STANDARDIZED_RATIO` times further than the standardized reading (pre-standardized
    rows, which a median alone misses where most columns are 0/1); the message names the furthest
    columns."""
    keys = ("column_mean", "column_std") if "column_mean" in record else ("mean", "std")  # arrays | features
    if keys[0] not in record or keys[1] not in record or len(record[keys[0]]) != len(column_mean):
        return None
    mean, std = np.asarray(record[keys[0]]), np.asarray(record[keys[1]])
    varying = std > 0
    if not varying.any():
        return None
    as_raw = np.abs(column_mean[varying] - mean[varying]) / std[varying]
    as_standardized = np.abs(column_mean[varying])
    z, rms_raw = float(np.median(as_raw)), float(np.sqrt(np.mean(as_raw**2)))
    nearer_zero = rms_raw > 1.0 and rms_raw > STANDARDIZED_RATIO * np.sqrt(np.mean(as_standardized**2))
    if z <= OFF_SCALE and not (nearer_zero and rows >= STANDARDIZED_ROWS):
        return None
    names = np.asarray(record.get("features") or [f"column {j}" for j in range(len(column_mean))])[varying]
    worst = np.argsort(-as_raw)[:3]
    shown = ", ".join(f"{names[j]} ({as_raw[j]:.1f})" for j in worst)
    return (
        f"the columns average a median {z:.1f} training standard deviations away from the training data's "
        f"(furthest: {shown}); they look pre-standardized or rescaled: give the raw values the model was "
        "trained on"
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
    if out.get("channels") not in (None, *CHANNELS):
        raise ValueError(f"preprocessing 'channels' must be one of {list(CHANNELS)}")
    # outcome_columns: a survival table's time/event columns, neither inputs nor identifiers
    for key in ("id_columns", "outcome_columns", "label_names", "sites"):
        if not _strings(out.get(key, [])):
            raise ValueError(f"preprocessing {key!r} must be a list of names")
    positive = out.get("positive_class")
    if positive is not None and not (
        isinstance(positive, Mapping)
        and isinstance(positive.get("ids"), (list, tuple))
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in positive["ids"])
        and (positive.get("names") is None or _strings(positive["names"]))
    ):
        raise ValueError(
            "preprocessing 'positive_class' must be {'ids': [class ids], 'names': [names] or None}"
        )
    return out


def _strings(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value)


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


def off_training_scale(
    record: Mapping[str, Any], lo: float, hi: float, column_mean: np.ndarray | None = None, rows: int = 0
) -> str | None:
    """The one scale check of input rows against a model's record, for every input format: why raw
    inputs spanning ``[lo, hi]`` (``rows`` rows whose columns average ``column_mean``) are not on the
    raw training scale, or None. The range and the column statistics are both raw-space
    (:func:`standardized`)."""
    if why := out_of_range(record, lo, hi):
        return why
    return None if column_mean is None else off_scale(record, column_mean, rows)

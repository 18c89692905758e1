"""The data types every reader returns and every later step uses, at the bottom of the data package.

A reader returns a :class:`LabeledData` (inputs and integer class labels with a
fixed train/test split); :func:`binarize` turns it into the :class:`BinaryData`
task the AUC objectives need; :func:`split` is the fixed stratified split of the
bundled sets. Imports nothing of :mod:`fedxrisk.data`: lazy inputs
(:class:`~fedxrisk.data.lazy.LazySamples`) are recognised as "not an ndarray".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

SPLIT_SEED = 0  # the test split never depends on the run's seed
TEST_FRACTION = 0.3


@dataclass
class LabeledData:
    """Multi-class data with a fixed split; ``y`` holds integer class ids 0..C-1.

    Multi-label data (e.g. five chest X-ray findings) has ``y`` of shape ``[N, L]``
    in {0, 1} and ``num_classes = L``. ``groups_train`` holds per-sample ids used
    by natural partitions (``source``: site/folder index, ``patient``: patient id);
    ``groups_test`` the same ids of the test samples, where a reader knows them.
    ``x_val``/``y_val``: a validation split the data come with (MedMNIST's official
    one), kept apart from training and test; None when there is none.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    groups_train: dict[str, np.ndarray] = field(default_factory=dict)
    label_names: tuple[str, ...] = ()
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    groups_test: dict[str, np.ndarray] = field(default_factory=dict)
    default_positive: tuple[int, ...] | None = None  # the reader knows the positive class(es)
    preprocessing: dict[str, Any] = field(default_factory=dict)  # data/preprocessing.py, kept with the model
    source_names: tuple[
        str, ...
    ] = ()  # the name of each source id (groups['source']), where the reader knows it

    @property
    def multilabel(self) -> bool:
        return self.y_train.ndim == 2

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


@dataclass
class BinaryData:
    """A binary task: float inputs, labels in {0, 1}, original classes kept for partitions;
    the validation split (``x_val``/``y_val``) when the data come with one."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes_train: np.ndarray
    positive_classes: tuple[int, ...]
    groups_train: dict[str, np.ndarray] = field(default_factory=dict)
    label_names: tuple[str, ...] = ()
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    groups_test: dict[str, np.ndarray] = field(default_factory=dict)
    preprocessing: dict[str, Any] = field(default_factory=dict)
    source_names: tuple[str, ...] = ()  # the name of each source id, where the reader knows it
    groups_val: dict[str, np.ndarray] = field(default_factory=dict)  # carved validation rows' groups (time)

    def __post_init__(self) -> None:
        for split in ("train", "test", "val"):
            y = getattr(self, f"y_{split}")
            if y is None:
                continue
            values = torch.unique(y).tolist()
            if not set(values) <= {0.0, 1.0}:
                raise ValueError(
                    f"{self.name}: {split} labels must be binary (0/1); found values "
                    f"{values[:10]}. Pass positive_classes to binarize multi-class labels."
                )
        if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
            raise ValueError(f"{self.name}: inputs and labels differ in length")
        if (self.x_val is None) != (self.y_val is None) or (
            self.x_val is not None and len(self.x_val) != len(self.y_val)  # type: ignore[arg-type]
        ):
            raise ValueError(f"{self.name}: validation inputs and labels differ in length")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_labels(self) -> int:
        """1 for a binary task, L for multi-label data (``y`` of shape ``[N, L]``)."""
        return self.y_train.shape[1] if self.y_train.dim() == 2 else 1

    @property
    def pos_ratio(self) -> float | list[float]:
        """Positive ratio of the training labels (one per label for multi-label data)."""
        if self.y_train.dim() == 2:
            return self.y_train.mean(0).tolist()
        return float(self.y_train.mean())


def split(name: str, x: np.ndarray, y: np.ndarray, num_classes: int) -> LabeledData:
    """A fixed stratified train/test split (:data:`TEST_FRACTION`, seed :data:`SPLIT_SEED`)."""
    from sklearn.model_selection import train_test_split

    xtr, xte, ytr, yte = train_test_split(x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y)
    return LabeledData(name, xtr, ytr, xte, yte, num_classes)


def default_positive_classes(num_classes: int) -> tuple[int, ...]:
    """The papers' convention: the second half of the classes is positive."""
    return tuple(range(num_classes // 2, num_classes))


def _named(names: Sequence[str]) -> bool:
    """Class names that are words, not the ids 0, 1, …: the order says nothing about which is positive."""
    return any(not n.strip().lstrip("-").isdigit() for n in names)


def resolve_positive(data: LabeledData, positive_classes: Sequence[int | str] | None) -> tuple[int, ...]:
    """Class ids of ``positive_classes`` (ids or class names), or the default for ``data``.

    The default is the reader's (``default_positive``), else the upper half of the class ids;
    a two-class set whose classes are names (folders, a manifest's label values) has no
    default: which one is positive must be said.
    """
    names = list(data.label_names) if len(data.label_names) == data.num_classes else []
    if not positive_classes:
        if data.default_positive is not None:
            return data.default_positive
        if data.num_classes == 2 and names and _named(names):
            raise ValueError(
                f"{data.name}: the classes are {names[0]!r} and {names[1]!r}; say which one is positive, "
                f"e.g. --set data.positive_classes='[\"{names[1]}\"]'"
            )
        return default_positive_classes(data.num_classes)
    pos = []
    for c in positive_classes:
        if isinstance(c, str) and c in names:
            pos.append(names.index(c))
        elif isinstance(c, str) and not c.strip().lstrip("-").isdigit():
            known = ", ".join(map(repr, names)) if names else f"ids 0..{data.num_classes - 1} (no names)"
            raise ValueError(f"positive class {c!r} is not a class of {data.name} (classes: {known})")
        else:
            pos.append(int(c))
    bad = [c for c in pos if not 0 <= c < data.num_classes]
    if bad:
        raise ValueError(f"positive classes {bad} do not exist in {data.name} (0..{data.num_classes - 1})")
    return tuple(pos)


def describe_positive(data: BinaryData) -> str:
    """One line naming the positive class(es), e.g. ``positive class: lesion (id 0); negative: normal``."""
    if not data.positive_classes:
        labels = ", ".join(data.label_names) if data.label_names else f"{data.num_labels} labels"
        return f"multi-label: each label is positive where it is 1 ({labels})"
    names = list(data.label_names) if data.label_names else []
    if len(names) <= max(data.positive_classes, default=0):
        names = []
    label = lambda c: f"{names[c]} (id {c})" if names else f"id {c}"
    pos = ", ".join(label(c) for c in data.positive_classes)
    neg = [c for c in range(len(names)) if c not in data.positive_classes]
    rest = f"; negative: {', '.join(names[c] for c in neg)}" if names and len(neg) <= 8 else ""
    return f"positive class: {pos}{rest}"


def positive_record(data: BinaryData) -> dict[str, Any] | None:
    """The positive class(es) as recorded in summary.json / evaluation.json (None: multi-label)."""
    if not data.positive_classes:
        return None
    names = list(data.label_names) if len(data.label_names) > max(data.positive_classes) else []
    return {
        "ids": list(data.positive_classes),
        "names": [names[c] for c in data.positive_classes] if names else None,
    }


def binarize(data: LabeledData, positive_classes: Sequence[int | str] | None = None) -> BinaryData:
    """Label ``positive_classes`` (ids or names) 1 and every other class 0 (train and test alike).

    Multi-label data is already binary per label and passes through unchanged.
    """
    if data.multilabel:
        return _multilabel_binary(data, positive_classes)
    pos = resolve_positive(data, positive_classes)
    if len(set(pos)) == data.num_classes:
        raise ValueError(f"positive classes {list(pos)} leave no negative class in {data.name}")

    def to01(y: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.isin(y, pos).astype(np.float32))

    return BinaryData(
        name=data.name,
        x_train=_inputs(data.x_train),
        y_train=to01(data.y_train),
        x_test=_inputs(data.x_test),
        y_test=to01(data.y_test),
        classes_train=data.y_train.copy(),
        positive_classes=pos,
        groups_train=dict(data.groups_train),
        label_names=data.label_names,
        preprocessing=dict(data.preprocessing),
        source_names=tuple(data.source_names),
        **_validation(data, to01),
    )


def _inputs(x: np.ndarray) -> torch.Tensor:
    """Inputs as a float32 tensor; lazy inputs (:mod:`fedxrisk.data.lazy`) stay lazy."""
    if not isinstance(x, np.ndarray):
        return x  # LazySamples: decoded when sampled
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def _validation(data: LabeledData, labels: Callable[[np.ndarray], torch.Tensor]) -> dict[str, Any]:
    """The validation split (labels mapped like the others) and the test groups, for :class:`BinaryData`."""
    out: dict[str, Any] = {"groups_test": dict(data.groups_test)}
    if data.x_val is not None and data.y_val is not None:
        out |= {"x_val": _inputs(data.x_val), "y_val": labels(data.y_val)}
    return out


def _multilabel_binary(data: LabeledData, positive_classes: Sequence[int | str] | None) -> BinaryData:
    if positive_classes:
        raise ValueError(
            f"{data.name} is multi-label ({data.num_classes} labels, each binary); "
            "positive_classes applies to multi-class data only"
        )

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    return BinaryData(
        name=data.name,
        x_train=_inputs(data.x_train),
        y_train=tensor(data.y_train),
        x_test=_inputs(data.x_test),
        y_test=tensor(data.y_test),
        classes_train=np.zeros(len(data.y_train), dtype=np.int64),
        positive_classes=(),
        groups_train=dict(data.groups_train),
        label_names=data.label_names,
        preprocessing=dict(data.preprocessing),
        source_names=tuple(data.source_names),
        **_validation(data, tensor),
    )


def site_name(source_names: Sequence[str], source: int) -> str:
    """The name of source id ``source`` (a hospital, a CSV ``source`` value, a site folder), else
    ``site K``."""
    source = int(source)
    return str(source_names[source]) if 0 <= source < len(source_names) else f"site {source}"

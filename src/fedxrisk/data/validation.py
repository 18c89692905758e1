"""Validation splits carved from the clients' training shards (for tuning; never the test set)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from fedxrisk.data.federated import FederatedData
from fedxrisk.data.lazy import is_lazy
from fedxrisk.errors import ConfigError


def hold_out(data: FederatedData, seed: int, fraction: float = 0.2) -> FederatedData:
    """``fraction`` of every client's shard held out; the result's *test* set is that
    held-out union, so any evaluation of the returned data measures validation metrics.

    The real test set is dropped from the returned data: code tuning on it cannot reach it.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction}")
    rng = np.random.default_rng([seed, 99])
    shards, held = [], []
    for shard in data.shards:
        perm = rng.permutation(shard)
        cut = int(len(shard) * fraction)
        held.append(perm[:cut])
        shards.append(np.sort(perm[cut:]))
    val = torch.from_numpy(np.concatenate(held))
    binary = replace(data.data, x_test=data.data.x_train[val], y_test=data.data.y_train[val])
    return FederatedData(binary, shards, data.augment)


def hold_out_instances(
    pool: list[np.ndarray], seed: int, fraction: float = 0.2
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split every class of a few-shot class pool into (training, validation) instances:
    validation tasks then use the training classes' held-out instances."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction}")
    rng = np.random.default_rng([seed, 98])
    train, val = [], []
    for cls in pool:
        perm = rng.permutation(len(cls))
        cut = int(len(cls) * fraction)
        val.append(cls[np.sort(perm[:cut])])
        train.append(cls[np.sort(perm[cut:])])
    return train, val


OFFICIAL = "official"  # data.validation: the dataset's own validation split
AUTO = "auto"  # the dataset's own split when it has one, else DEFAULT_FRACTION carved
DEFAULT_FRACTION = 0.2


def _strata(y: torch.Tensor) -> np.ndarray:
    """The class of each sample for stratification (multi-label: any positive label)."""
    y = y.numpy()
    return (y.reshape(len(y), -1).max(1) > 0).astype(np.int64)


CARVE_TAG = 15  # seeds client k's generator (seed, CARVE_TAG, k); keys the record hash with the seed


def _record_bytes(x: Any, y: torch.Tensor) -> Callable[[int], bytes]:
    """Row i's content as bytes: its features and label (a file-backed lazy sample: its file's
    name, or its row of the source's array), the same wherever the record sits in the dataset."""
    labels = y.reshape(len(y), -1).numpy()
    if is_lazy(x):
        source, rows = x.source, x.rows
        array = getattr(source, "array", None)
        if array is not None:
            return lambda i: np.asarray(array[rows[i]]).tobytes() + labels[i].tobytes()
        return lambda i: source.identifier(int(rows[i])).encode() + labels[i].tobytes()
    flat = x.reshape(len(x), -1).numpy()
    return lambda i: flat[i].tobytes() + labels[i].tobytes()


def record_uniforms(data: FederatedData, rows: np.ndarray, seed: int) -> np.ndarray:
    """One uniform in [0, 1) per record ``rows`` of ``x_train``: a BLAKE2b hash of the record's
    content keyed by ``(seed, CARVE_TAG)`` alone, so a record's value depends on nothing else."""
    content = _record_bytes(data.data.x_train, data.data.y_train)
    key = f"fedxrisk-carve:{seed}:{CARVE_TAG}".encode()
    digests = [hashlib.blake2b(content(int(i)), key=key, digest_size=8).digest() for i in rows]
    return np.array([int.from_bytes(d, "little") for d in digests], dtype=np.float64) / 2.0**64


def carve_validation(data: FederatedData, fraction: float, seed: int) -> FederatedData:
    """Per client and per class, ``round(fraction · n)`` of the client's n samples of the class become
    its validation data: at least one when n ≥ 2, at most n − 1 (a class a client holds stays in its
    training data), none when n = 1 — so every site holding a class validates on it.

    The result trains on the rest: the held samples leave ``x_train`` (shards re-indexed) and form
    ``x_val``/``y_val``; ``val_shards[k]`` are client k's positions in ``x_val``. The test set is
    untouched. Client k draws from its own generator, seeded by ``(seed, CARVE_TAG, k)``, so its
    split depends on its own shard only (a site can carve it alone); this is the split
    ``benchmarks/evidence/study.py`` made before the run layer had one, so its results reproduce. The
    quotas couple a client's records (removing one can move others across the split), which only
    instance-level DP cares about: it carves with :func:`carve_records` instead.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"data.validation must lie in (0, 1) (or be {OFFICIAL!r}/{AUTO!r}), got {fraction}")
    strata = _strata(data.data.y_train)
    kept, held = [], []
    for k, shard in enumerate(data.shards):
        rng = np.random.default_rng([seed, CARVE_TAG, k])
        out = []
        for c in (0, 1):
            members = rng.permutation(shard[strata[shard] == c])
            n = len(members)
            out.append(members[: min(max(1, round(n * fraction)), n - 1) if n >= 2 else 0])
        val = np.sort(np.concatenate(out))
        held.append(val)
        kept.append(np.setdiff1d(shard, val))
    return _move_to_validation(data, kept, held)


def carve_records(data: FederatedData, fraction: float, seed: int) -> FederatedData:
    """Instance-level DP's carve: every training record independently joins its client's validation
    data with probability ``fraction``: it does when :func:`record_uniforms` gives it a value below
    ``fraction``.

    The decision is a keyed hash of the record's own content (key: the run's seed, fixed before
    any data are seen), so removing or adding one record moves no other record across the split:
    neighbouring datasets stay neighbours, as instance-level DP needs (docs/privacy.md). There is
    deliberately no per-class quota nor "at least one positive" guard: either would couple the
    records. A client may thus hold no validation positive (or no validation at all); selection
    pools every client's validation, and a pool with one class reads NaN. A client left with no
    training record is refused (one line).

    The result trains on the rest: the held samples leave ``x_train`` (shards re-indexed) and form
    ``x_val``/``y_val``, as :func:`carve_validation`'s. A site carves its own shard alone.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"data.validation must lie in (0, 1) (or be {OFFICIAL!r}/{AUTO!r}), got {fraction}")
    kept, held = [], []
    for k, shard in enumerate(data.shards):
        shard = np.asarray(shard)
        chosen = record_uniforms(data, shard, seed) < fraction
        if len(shard) and chosen.all():
            raise ConfigError(
                f"data.validation = {fraction:g} holds out all {len(shard)} records of client {k}, leaving it "
                "nothing to train on; lower data.validation or give the client more data"
            )
        held.append(np.sort(shard[chosen]))
        kept.append(np.sort(shard[~chosen]))
    return _move_to_validation(data, kept, held)


def _move_to_validation(data: FederatedData, kept: list[np.ndarray], held: list[np.ndarray]) -> FederatedData:
    b = data.data
    train = np.sort(np.concatenate(kept))
    rows = torch.from_numpy(train)
    val = np.concatenate(held)
    vrows = torch.from_numpy(val)
    starts = np.cumsum([0, *(len(h) for h in held)])
    binary = replace(
        b,
        x_train=b.x_train[rows],
        y_train=b.y_train[rows],
        classes_train=b.classes_train[train],
        groups_train={k: v[train] for k, v in b.groups_train.items()},
        x_val=b.x_train[vrows],
        y_val=b.y_train[vrows],
        groups_val={k: v[val] for k, v in b.groups_train.items()},  # survival: the held-out times
    )
    shards = [np.searchsorted(train, s) for s in kept]
    val_shards = [np.arange(starts[k], starts[k + 1]) for k in range(len(held))]
    return FederatedData(binary, shards, data.augment, data.stream, val_shards)


def split_official(data: FederatedData, seed: int) -> FederatedData:
    """The dataset's own validation split (``x_val``), dealt to the clients per class in near-equal
    random parts (seeded by ``(seed, 96)``); the training shards are unchanged."""
    b = data.data
    if b.x_val is None or b.y_val is None:
        raise ValueError(f"data.validation = {OFFICIAL!r}: {b.name} has no validation split of its own")
    rng = np.random.default_rng([seed, 96])
    strata = _strata(b.y_val)
    parts: list[list[np.ndarray]] = [[] for _ in data.shards]
    for c in (0, 1):
        members = rng.permutation(np.flatnonzero(strata == c))
        for k, part in enumerate(np.array_split(members, len(data.shards))):
            parts[k].append(part)
    val_shards = [np.sort(np.concatenate(p)) for p in parts]
    return FederatedData(b, data.shards, data.augment, data.stream, val_shards)


def with_validation(
    data: FederatedData, validation: float | str, seed: int, per_record: bool = False
) -> FederatedData:
    """``data`` with per-client validation data for ``data.validation`` (0: none, a fraction:
    :func:`carve_validation`, or with ``per_record`` — instance-level DP — :func:`carve_records`;
    ``"official"``: :func:`split_official`, ``"auto"``: official when the dataset has a split, else
    :data:`DEFAULT_FRACTION` carved)."""
    if validation == AUTO:
        validation = OFFICIAL if data.data.x_val is not None else DEFAULT_FRACTION
    if validation == OFFICIAL:
        return split_official(data, seed)
    if isinstance(validation, str):
        raise ValueError(
            f"data.validation: expected a fraction, {OFFICIAL!r} or {AUTO!r}, got {validation!r}"
        )
    if validation == 0:
        return data
    return (carve_records if per_record else carve_validation)(data, float(validation), seed)

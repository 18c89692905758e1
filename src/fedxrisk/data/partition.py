"""Partitions of a training set over K clients (ALGORITHMS.md §3).

Each function returns one array of sample indices per client.

- ``iid``: a uniformly random equal split.
- ``class``: the papers' imbalanced-heterogeneous (IH) split: positive classes
  and negative classes are each divided into K groups and client k receives
  group k of both, so no class is shared. When K exceeds the number of
  classes on one side, each class is split over a group of clients instead.
- ``dirichlet``: label skew; each class's samples are split over clients with
  proportions drawn from Dirichlet(α·1).
"""

from __future__ import annotations

import numpy as np

PARTITIONS = ("iid", "class", "dirichlet")


def iid_partition(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(part) for part in np.array_split(rng.permutation(n), num_clients)]


def _classes_to_clients(
    classes: np.ndarray, sample_classes: np.ndarray, num_clients: int, rng: np.random.Generator
) -> list[list[np.ndarray]]:
    """Assign the samples of ``classes`` to clients: disjoint class groups when possible."""
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    if num_clients <= len(classes):
        for k, group in enumerate(np.array_split(classes, num_clients)):
            parts[k].append(np.flatnonzero(np.isin(sample_classes, group)))
    else:  # more clients than classes: each class split over its own group of clients
        for c, clients in zip(classes, np.array_split(np.arange(num_clients), len(classes))):
            members = rng.permutation(np.flatnonzero(sample_classes == c))
            for k, share in zip(clients, np.array_split(members, len(clients))):
                parts[k].append(share)
    return parts


def class_partition(
    y: np.ndarray, classes: np.ndarray, num_clients: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Split positive and negative classes each into K groups (the papers' "IH" split)."""
    pos_classes = np.unique(classes[y == 1])
    neg_classes = np.unique(classes[y == 0])
    pos = _classes_to_clients(pos_classes, np.where(y == 1, classes, -1), num_clients, rng)
    neg = _classes_to_clients(neg_classes, np.where(y == 0, classes, -1), num_clients, rng)
    return [np.sort(np.concatenate(p + n)).astype(np.int64) for p, n in zip(pos, neg)]


def dirichlet_partition(
    classes: np.ndarray, num_clients: int, concentration: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Label skew: class c's samples split with proportions ~ Dirichlet(concentration·1)."""
    if concentration <= 0:
        raise ValueError(f"dirichlet concentration must be > 0, got {concentration}")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in np.unique(classes):
        members = rng.permutation(np.flatnonzero(classes == c))
        shares = rng.dirichlet(np.full(num_clients, concentration))
        cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
        for k, share in enumerate(np.split(members, cuts)):
            parts[k].append(share)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def partition(
    kind: str,
    y: np.ndarray,
    classes: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    dirichlet_alpha: float = 0.5,
) -> list[np.ndarray]:
    """Dispatch on ``kind`` and check that every client received data."""
    if num_clients < 1:
        raise ValueError(f"the number of clients must be ≥ 1, got {num_clients}")
    if num_clients > len(y):
        raise ValueError(f"{num_clients} clients but only {len(y)} training samples")
    if kind == "iid":
        parts = iid_partition(len(y), num_clients, rng)
    elif kind == "class":
        parts = class_partition(y, classes, num_clients, rng)
    elif kind == "dirichlet":
        parts = dirichlet_partition(classes, num_clients, dirichlet_alpha, rng)
    else:
        raise ValueError(f"unknown partition {kind!r}; choose one of {list(PARTITIONS)}")
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(
            f"partition {kind!r} left clients {empty[:10]} with no samples "
            f"({len(y)} samples, {num_clients} clients); use fewer clients"
        )
    return parts

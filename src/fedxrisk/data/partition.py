"""Partitions of a training set over K clients (ALGORITHMS.md §3).

Each function returns one array of sample indices per client.

- ``iid``: a uniformly random equal split.
- ``class``: the papers' imbalanced-heterogeneous (IH) split: positive classes
  and negative classes are each divided into K groups and client k receives
  group k of both, so no class is shared. When K exceeds the number of
  classes on one side, each class is split over a group of clients instead.
- ``dirichlet``: label skew; each class's samples are split over clients with
  proportions drawn from Dirichlet(α·1). A draw that leaves a client empty is followed
  by the next draw of the same seeded stream (up to 100 more): every seed gives a split,
  and a seed whose first draw was full gives the same split as before.
- ``source``: natural silos, one client per source (site folder, CSV column
  value); the number of clients must equal the number of sources.
- ``patient``: the CODASCA paper's ChestXray-IH split: sources are divided into
  K ≥ #sources clients by patient id; a client holds one source only and no
  patient appears in two clients.
"""

from __future__ import annotations

import numpy as np

PARTITIONS = ("iid", "class", "dirichlet", "source", "patient")
DIRICHLET_REDRAWS = 100  # draws after the first while a client is empty: every seed is usable, none changes


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


def _groups(groups: dict[str, np.ndarray] | None, key: str, kind: str) -> np.ndarray:
    if not groups or key not in groups:
        raise ValueError(
            f"partition {kind!r} needs a per-sample {key!r} id: use a dataset that records it "
            "(sites, manifest with a source/patient column, chestxray_ih, npz with source_train/patient_train)"
        )
    return groups[key]


def source_partition(sources: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """One client per source (in sorted source-id order)."""
    ids = np.unique(sources)
    if len(ids) != num_clients:
        raise ValueError(
            f"partition 'source' gives one client per source: the data has {len(ids)} sources, "
            f"so set clients={len(ids)} (got {num_clients}); use 'patient' for more clients than sources"
        )
    return [np.flatnonzero(sources == s).astype(np.int64) for s in ids]


def clients_per_source(sizes: np.ndarray, num_clients: int) -> np.ndarray:
    """Clients per source proportional to its size (largest remainder), at least one each."""
    if num_clients < len(sizes):
        raise ValueError(
            f"partition 'patient' needs at least one client per source: {len(sizes)} sources, {num_clients} clients"
        )
    quota = num_clients * sizes / sizes.sum()
    counts = np.maximum(1, np.floor(quota)).astype(np.int64)
    while counts.sum() < num_clients:  # first source with the largest unmet quota
        counts[np.argmax(quota - counts)] += 1
    while counts.sum() > num_clients:  # only when the minimum of one pushed the total over
        spare = np.where(counts > 1, quota - counts, np.inf)
        counts[np.argmin(spare)] -= 1
    return counts


def patient_partition(
    sources: np.ndarray, patients: np.ndarray, num_clients: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """ChestXray-IH: each source's patients shuffled and split over that source's clients."""
    ids = np.unique(sources)
    counts = clients_per_source(np.array([np.sum(sources == s) for s in ids]), num_clients)
    parts = []
    for s, n in zip(ids, counts):
        members = np.flatnonzero(sources == s)
        people = rng.permutation(np.unique(patients[members]))
        if n > len(people):
            raise ValueError(f"source {s} has {len(people)} patients, too few for its {n} clients")
        for group in np.array_split(people, n):
            parts.append(members[np.isin(patients[members], group)].astype(np.int64))
    return parts


def partition(
    kind: str,
    y: np.ndarray,
    classes: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    dirichlet_alpha: float = 0.5,
    groups: dict[str, np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Dispatch on ``kind`` and check that every client received data."""
    if num_clients < 1:
        raise ValueError(f"the number of clients must be ≥ 1, got {num_clients}")
    if num_clients > len(y):
        raise ValueError(f"{num_clients} clients but only {len(y)} training samples")
    if kind in ("class", "dirichlet") and y.ndim != 1:
        raise ValueError(f"partition {kind!r} splits by class; multi-label data needs iid, source or patient")
    if kind == "iid":
        parts = iid_partition(len(y), num_clients, rng)
    elif kind == "source":
        parts = source_partition(_groups(groups, "source", kind), num_clients)
    elif kind == "patient":
        sources = groups["source"] if groups and "source" in groups else np.zeros(len(y), dtype=np.int64)
        parts = patient_partition(sources, _groups(groups, "patient", kind), num_clients, rng)
    elif kind == "class":
        parts = class_partition(y, classes, num_clients, rng)
    elif kind == "dirichlet":
        parts = dirichlet_partition(classes, num_clients, dirichlet_alpha, rng)
        for _ in range(DIRICHLET_REDRAWS):  # a client left empty: the next draw of the same seed's stream
            if all(len(p) for p in parts):
                break
            parts = dirichlet_partition(classes, num_clients, dirichlet_alpha, rng)
    else:
        raise ValueError(f"unknown partition {kind!r}; choose one of {list(PARTITIONS)}")
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(
            f"partition {kind!r} left clients {empty[:10]} with no samples "
            f"({len(y)} samples, {num_clients} clients"
            + (f", {DIRICHLET_REDRAWS + 1} Dirichlet draws" if kind == "dirichlet" else "")
            + "); use fewer clients"
        )
    return parts

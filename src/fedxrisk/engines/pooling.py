"""The server side of ``comm.pool``: merge per-sample records without revealing their origin.

FeDXL's clients send per-sample scores (and u) of the samples they used. A plain
gather would hand every client the other clients' records in client order, so
each score would be attributable to its client, and a slot marked "not of this
class" would reveal which clients lack a class. ``pool`` instead:

1. takes each client's leaves ``[n, ...]`` of a *group* with a validity mask ``[n]``
   (the mask goes up to the server and never comes down);
2. keeps the valid entries of all clients and shuffles them with a permutation
   drawn from ``(seed, key, group)`` — the same on every engine, so engines agree;
3. returns the same shuffled pool ``[N, ...]`` (N = valid entries of all clients)
   to every client.

Every engine calls :func:`merge_pool` on the stacked records (simulation: its
clients; distributed: after one all_gather; Flower: on the server).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from fedxrisk.tree import Tree, tmap


def pool_permutation(seed: int, key: int, group: str, n: int) -> torch.Tensor:
    """A permutation of ``range(n)`` fixed by the run seed, the call's key and the group name."""
    entropy = [abs(int(seed)), int(key), zlib.crc32(group.encode())]
    state = int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1)
    return torch.randperm(n, generator=torch.Generator().manual_seed(state))


def merge_pool(
    groups: dict[str, Tree], valid: dict[str, torch.Tensor], seed: int, key: int
) -> dict[str, Tree]:
    """Stacked records (leaves ``[K, n, ...]``, masks ``[K, n]``) → per group the valid entries of
    all clients in a seeded random order (leaves ``[N, ...]``)."""
    out = {}
    for name, tree in groups.items():
        keep = valid[name].reshape(-1) != 0  # client-major
        order = pool_permutation(seed, key, name, int(keep.sum())).to(keep.device)
        out[name] = tmap(lambda t, keep=keep, order=order: t.reshape(-1, *t.shape[2:])[keep][order], tree)
    return out

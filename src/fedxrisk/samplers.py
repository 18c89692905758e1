"""Batch samplers for a ``torch.utils.data.DataLoader``: the batches a run draws for one client.

``DataLoader(dataset, batch_sampler=DualSampler(labels, batch_size=32, positives=8))`` gives
LibAUC's DualSampler layout (P positives first, then B − P negatives; a rare class is cycled),
drawn by the same generator as ``data.positives_per_batch = P`` in a run
(:class:`fedxrisk.data.sampler.ClassSampler`): client ``client`` of a run with seed ``seed``
sees exactly these index lists, one per local step. :class:`ShuffleSampler` is the plain
batches of a run (successive random permutations). Positions index the client's own data
in its shard order (``FederatedData.client_view(k)``).

An epoch is ``len(sampler)`` batches; the stream continues across epochs, as a run's does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from fedxrisk.classaware import sampled_pos_ratio
from fedxrisk.data.sampler import ClassSampler, ClientSampler

__all__ = ["DualSampler", "ShuffleSampler"]


class ShuffleSampler:
    """Batches of ``batch_size`` positions walking through random permutations of ``n`` samples."""

    def __init__(self, n: int, batch_size: int, seed: int = 0, client: int = 0):
        if n < 1:
            raise ValueError(f"need at least one sample, got n = {n}")
        self.n, self.batch_size = n, batch_size
        self._sampler: ClientSampler = ClientSampler([n], batch_size, seed, clients=[client])

    def __len__(self) -> int:
        return max(1, self.n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(len(self)):
            yield self._sampler.next()[0].tolist()

    def state_dict(self) -> dict[str, Any]:
        return self._sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sampler.load_state_dict(state)


class DualSampler(ShuffleSampler):
    """Class-aware batches: ``positives`` positives first, then ``batch_size − positives`` negatives.

    Give ``positives`` (LibAUC's ``num_pos``) or ``sampling_rate`` (P = int(rate·B)). The AUC losses'
    p under these batches is :attr:`sampling_rate` = P/B (:mod:`fedxrisk.classaware`).
    """

    def __init__(
        self,
        labels: Sequence[float] | np.ndarray | torch.Tensor,
        batch_size: int,
        positives: int | None = None,
        sampling_rate: float | None = None,
        seed: int = 0,
        client: int = 0,
    ):
        if (positives is None) == (sampling_rate is None):
            raise ValueError("give exactly one of positives (per batch) and sampling_rate")
        if positives is None:
            positives = int(sampling_rate * batch_size)  # type: ignore[operator]
        y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels).reshape(-1)
        if not set(np.unique(y).tolist()) <= {0.0, 1.0}:
            raise ValueError("DualSampler needs binary labels in {0, 1}")
        self.n, self.batch_size, self.positives = len(y), batch_size, positives
        self._sampler = ClassSampler([y], batch_size, positives, seed, clients=[client])
        self._pos, self._neg = int((y == 1).sum()), int((y == 0).sum())

    @property
    def sampling_rate(self) -> float:
        """P / B: the positive share of every batch (the p the AUC losses use)."""
        return sampled_pos_ratio(self.positives, self.batch_size)

    def __len__(self) -> int:
        """LibAUC's epoch: enough batches to see the larger class once."""
        n_neg = self.batch_size - self.positives
        return max(1, self._pos // self.positives, self._neg // n_neg)

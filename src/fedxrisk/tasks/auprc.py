"""Online AUPRC maximization as a conditional problem (FCSG paper §5.3, eq. 6; ALGORITHMS.md §1.6).

Outer samples ξ⁺ are positives of the client's data, inner samples ξ are drawn
from all of the client's data: ``batch`` returns the engine's mini-batch (the
inner samples, m = batch size) plus b positives drawn by a second per-client
sampler over the client's positives, in the conditional layout of
:mod:`fedxrisk.objectives.conditional`.
"""

from __future__ import annotations

import numpy as np
import torch

from fedxrisk.data.federated import FederatedData, every_client, make_federated
from fedxrisk.data.loading import load_dataset
from fedxrisk.data.sampler import ClientSampler
from fedxrisk.data.types import binarize
from fedxrisk.objectives.conditional import check_sample


def table2_federated(
    dataset: str, num_clients: int, seed: int = 0, removed: float = 0.8, partition: str = "iid"
) -> FederatedData:
    """The paper's Table 2 protocol: the first half of the classes negative, the rest
    positive; ``removed`` (80%) of the training positives dropped; test set unchanged."""
    if not 0.0 <= removed < 1.0:
        raise ValueError(f"removed must lie in [0, 1), got {removed}")
    data = binarize(load_dataset(dataset))
    pos = float(data.y_train.sum())
    neg = len(data.y_train) - pos
    kept = (1.0 - removed) * pos
    return make_federated(data, num_clients, partition, kept / (kept + neg), seed)


class AUPRCData:
    """A :class:`FederatedData` seen as conditional samples for the AP surrogate.

    Batch layout per client: ``xi = {"x": [b, ...]}`` (positives), ``eta = {"x":
    [b, m, ...], "y": [b, m]}`` (the engine's mini-batch, the same m samples
    for every positive since P(η | ξ) is the client's data distribution), ``xi_id`` and
    ``eta_of``. Every client must hold at least one positive.
    """

    def __init__(self, fed: FederatedData, outer_batch: int = 8, seed: int = 0):
        if outer_batch < 1:
            raise ValueError(f"outer_batch (b) must be ≥ 1, got {outer_batch}")
        self.fed = fed
        y = fed.data.y_train.numpy()
        self._positives = [shard[y[shard] == 1] for shard in fed.shards]
        empty = [k for k, p in enumerate(self._positives) if len(p) == 0]
        if empty:
            raise ValueError(f"clients {empty} hold no positive: AUPRC's outer samples are positives")
        self.outer = ClientSampler([len(p) for p in self._positives], outer_batch, seed, stream=7)
        width = max(len(p) for p in self._positives)
        table = np.zeros((len(self._positives), width), dtype=np.int64)
        for k, p in enumerate(self._positives):
            table[k, : len(p)] = p
        self._table = torch.from_numpy(table)

    @property
    def num_clients(self) -> int:
        return self.fed.num_clients

    @property
    def shard_sizes(self) -> list[int]:
        return self.fed.shard_sizes

    def client_pos_ratio(self, k: int) -> float:
        return self.fed.client_pos_ratio(k)

    def batch(
        self, positions: np.ndarray, device: torch.device | str = "cpu", rows: torch.Tensor | None = None
    ) -> dict:
        every_client(rows, type(self).__name__)
        inner = self.fed.batch(positions, device)
        rows = torch.arange(self.num_clients)[:, None]
        pos_index = self._table[rows, torch.from_numpy(self.outer.next())]  # [K, b] global indices
        k, b = pos_index.shape
        m = positions.shape[1]
        x_in = inner["x"]
        sample = {
            "xi": {"x": self.fed.data.x_train[pos_index].to(device)},
            "eta": {
                "x": x_in.unsqueeze(1).expand(k, b, *x_in.shape[1:]),
                "y": inner["y"].unsqueeze(1).expand(k, b, m),
            },
            "xi_id": pos_index.to(device),
            "eta_of": pos_index.unsqueeze(-1).expand(k, b, m).to(device),
        }
        check_sample(sample, batch_dims=1)
        return sample

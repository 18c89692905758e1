"""Invariant logistic regression (FCSG paper §5.1; ALGORITHMS.md §1.8), drawn online per client.

ξ = (a, b): a ~ N(0, σ1² I_d), b = sign(aᵀx*) for one fixed random x*;
η | ξ ~ N(a, σ2² I_d), m inner samples per outer sample. Every client draws
its own samples from its own generator (the authors' code drew identical data
on every client; we do not).
"""

from __future__ import annotations

import numpy as np
import torch

from fedxrisk.data.federated import every_client
from fedxrisk.objectives.conditional import check_sample
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree


class InvariantLRData:
    """Online source of conditional samples ``xi = {"a", "b"}``, ``eta = {"x": [b, m, d]}``."""

    def __init__(
        self,
        num_clients: int = 16,
        dim: int = 10,
        sigma1: float = 1.0,
        sigma2: float = 1.0,
        m: int = 10,
        outer_batch: int = 1,
        seed: int = 0,
    ):
        if m < 1:
            raise ValueError(f"m (inner samples per outer sample) must be ≥ 1, got {m}")
        if outer_batch < 1 or num_clients < 1 or dim < 1:
            raise ValueError("outer_batch, num_clients and dim must be ≥ 1")
        if sigma1 <= 0 or sigma2 < 0:
            raise ValueError(f"need sigma1 > 0 and sigma2 ≥ 0, got {sigma1}, {sigma2}")
        self.dim, self.sigma1, self.sigma2, self.m, self.b = dim, sigma1, sigma2, m, outer_batch
        self.x_star = np.random.default_rng([seed, 0]).normal(size=dim)
        self.rngs = [np.random.default_rng([seed, 2, k]) for k in range(num_clients)]
        self.calls = 0

    @property
    def num_clients(self) -> int:
        return len(self.rngs)

    @property
    def shard_sizes(self) -> list[int]:
        return [self.b] * self.num_clients  # nominal: samples are drawn fresh

    def client_pos_ratio(self, k: int) -> float:
        return 0.5

    def outer_samples(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        a = rng.normal(0.0, self.sigma1, size=(n, self.dim))
        return a, np.where(a @ self.x_star >= 0, 1.0, -1.0)

    def batch(
        self, positions: np.ndarray, device: torch.device | str = "cpu", rows: torch.Tensor | None = None
    ) -> dict:
        every_client(rows, type(self).__name__)
        a, b, eta = [], [], []
        for rng in self.rngs:
            ak, bk = self.outer_samples(rng, self.b)
            eta.append(ak[:, None, :] + rng.normal(0.0, self.sigma2, size=(self.b, self.m, self.dim)))
            a.append(ak)
            b.append(bk)
        ids = torch.arange(self.b).expand(self.num_clients, self.b) + self.calls * self.b
        self.calls += 1

        def t(v) -> torch.Tensor:
            return torch.as_tensor(np.stack(v), dtype=torch.float32, device=device)

        sample = {
            "xi": {"a": t(a), "b": t(b)},
            "eta": {"x": t(eta)},
            "xi_id": ids.to(device),
            "eta_of": ids.unsqueeze(-1).expand(self.num_clients, self.b, self.m).to(device),
        }
        check_sample(sample, batch_dims=1)
        return sample


def invariant_accuracy(
    problem: Problem, params: Tree, buffers: Tree, data: InvariantLRData, n: int = 50_000, seed: int = 1
) -> float:
    """Accuracy of sign(aᵀx) against b on ``n`` fresh outer samples (the paper's test)."""
    a, b = data.outer_samples(np.random.default_rng([seed, 99]), n)
    with torch.no_grad():
        s = problem.logits(params, buffers, torch.as_tensor(a, dtype=torch.float32))[0].numpy()
    return float(np.mean(np.where(s >= 0, 1.0, -1.0) == b))

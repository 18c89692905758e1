"""LocalSGDM / FedAvg with momentum on cross-entropy (ALGORITHMS.md §2.1).

Each client runs momentum SGD (PyTorch convention: m ← μ·m + g, w ← w − η·m);
every I steps the model and the momentum are averaged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fedxrisk.algorithms.base import (
    Algorithm,
    Batch,
    ClientInfo,
    Collective,
    RoundContext,
    State,
    StepContext,
    model_payload,
    register,
    with_model,
)
from fedxrisk.objectives import bce_loss
from fedxrisk.problem import Problem
from fedxrisk.tree import tmap, zeros_like


@register
@dataclass
class LocalSGDM(Algorithm):
    """FedAvg with local momentum SGD on binary cross-entropy."""

    name = "localsgdm"
    needs_both_classes = False  # cross-entropy: one-class clients are ordinary
    communicates = ("w", "m")
    own_state: ClassVar[tuple[str, ...]] = ("loss",)  # per client; the rest: the broadcast
    default_lr = 0.3  # selected on validation in docs/evidence.md (digits, MNIST-1D; 1.0 diverges)

    problem: Problem
    momentum: float = 0.9
    weight_decay: float = 0.0

    def check_hyperparameters(self) -> None:
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be ≥ 0, got {self.weight_decay}")

    def init(self, client: ClientInfo) -> State:
        w, buffers = self.problem.init_model()
        return {"w": w, "buffers": buffers, "m": zeros_like(w), "loss": torch.zeros(())}

    def _loss(self, w, buffers, batch: Batch):
        logits, new_buffers = self.problem.logits(w, buffers, batch["x"])
        return bce_loss(logits, batch["y"]), new_buffers

    def sample_loss(self, params, state: State, batch: Batch):
        """The mean binary cross-entropy of ``batch`` (one term per sample)."""
        return self._loss(params, state["buffers"], batch)

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        g, (loss, buffers) = self.gradient(state, batch)
        g = tmap(lambda gi, wi: gi + self.weight_decay * wi, g, state["w"])
        m = tmap(lambda mi, gi: self.momentum * mi + gi, state["m"], g)
        w = tmap(lambda wi, mi: wi - ctx.lr * mi, state["w"], m)
        return dict(state, w=w, m=m, buffers=buffers, loss=loss)

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        avg = comm.mean({**model_payload(state, self.problem), "m": state["m"]})
        return dict(with_model(state, avg), m=avg["m"])

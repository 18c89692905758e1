"""Ditto (Li, Hu, Beirami & Smith, ICML 2021, Alg. 1) on binary cross-entropy.

The global model w is trained exactly as FedAvg with local momentum (``localsgdm``, whose
numbers it reproduces). Each site also keeps a personal model v_k, never sent, trained on
the same batches on its own loss plus the proximal term of eq. (2):

    min_v  F_k(v) + λ/2 ‖v − w^t‖²,       w^t: the global model received at the round's start.

The step on v is gradient descent on F_k with the λ-term taken implicitly (a proximal step),

    v ← (v − η ∇F_k(v) + ηλ w^t) / (1 + ηλ),

which is the paper's step to first order in ηλ and stable for every λ ≥ 0: λ = 0 trains each
site alone; λ → ∞ gives v = w^t, the FedAvg global model. A site is evaluated with v
(:meth:`personal_model`), the run's global model is w.

Ditto is provided for cross-entropy only: for CODA+/CODASCA the personal problem would be a
min-max problem of its own (v with personal a, b, α), which the paper does not analyse;
``model.personal = 'head'`` or ``'bn'`` personalizes those instead (algorithms/personal.py).

Instance-level DP refuses Ditto (``touches_labels``): v's step is the plain gradient of the batch
mean, outside DP-SGD's clipped, noised sum, and a site's v is evaluated and released.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.func import grad_and_value

from fedxrisk.algorithms.base import Batch, ClientInfo, Collective, RoundContext, State, StepContext, register
from fedxrisk.algorithms.fedavg import LocalSGDM
from fedxrisk.tree import Tree, tmap


@register
@dataclass
class Ditto(LocalSGDM):
    """FedAvg (local momentum SGD) for w, plus a λ-proximal personal model v per site (eq. 2)."""

    name = "ditto"
    touches_labels = {"personal model's step (v)": None}  # autograd of the batch mean: no DP form
    lam: float = 1.0  # λ of eq. (2): the pull of the personal model towards the global one

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.lam >= 0 and math.isfinite(self.lam)):
            raise ValueError(f"lam must be a finite number ≥ 0, got {self.lam}")

    def init(self, client: ClientInfo) -> State:
        state = super().init(client)
        copy = lambda t: tmap(torch.clone, t)  # noqa: E731
        return dict(state, v=copy(state["w"]), v_buffers=copy(state["buffers"]), ref=copy(state["w"]))

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        """The FedAvg step on w, then v ← (v − η(∇F_k(v) + wd·v) + ηλ w^t) / (1 + ηλ)."""
        new = super().local_step(state, batch, ctx)
        g, (_, v_buffers) = grad_and_value(self._loss, has_aux=True)(state["v"], state["v_buffers"], batch)
        lr, pull = ctx.lr, ctx.lr * self.lam
        v = tmap(
            lambda vi, gi, ri: (vi - lr * (gi + self.weight_decay * vi) + pull * ri) / (1 + pull),
            state["v"], g, state["ref"],
        )  # fmt: skip
        return dict(new, v=v, v_buffers=v_buffers)

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        """FedAvg's round for w and m; the new global model becomes every site's w^t."""
        state = super().communicate(state, comm, ctx)
        return dict(state, ref=tmap(torch.clone, state["w"]))

    def personal_model(self, state: State) -> tuple[Tree, Tree]:
        """A site's own model: (v, its buffers)."""
        return state["v"], state["v_buffers"]

"""Local Pair: the FeDXL losses on each client's own pairs only, the baseline of the FeDXL paper."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.func import grad

from fedxrisk.algorithms.base import Batch, ClientInfo, Collective, RoundContext, State, StepContext, register
from fedxrisk.algorithms.pairwise_base import GRAD_SCALES, PairwiseBase, _masked_mean, log_u_in_order
from fedxrisk.objectives.pairwise import check_lambda


@register
@dataclass
class LocalPair(PairwiseBase):
    """Local Pair baseline: the same loss on local pairs only (no passive parts, no pools).

    ``objective="auroc"``: ∇ mean_{i,j local} ℓ(s_i, s_j) (FeDXL1's loss);
    ``objective="pauc"``: KL-DRO with u_i tracked against the local negatives
    only (FeDXL2's loss, its log-space u, in-order duplicate updates and
    ``grad_scale``). Every I steps w (and m, if ``beta < 1``) are averaged. A
    client whose shard lacks a class has no local pair and takes zero gradient steps.
    """

    name = "localpair"
    couples_samples = "its pairwise loss couples positives and negatives of the client"
    communicates = ("w", "m")  # m only with momentum (beta < 1)
    default_lr = 1.0

    objective: str = "auroc"
    lam: float = 1.0
    gamma: float = 0.1
    grad_scale: str = "objective"

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        if self.objective not in ("auroc", "pauc"):
            raise ValueError(f"objective must be 'auroc' or 'pauc', got {self.objective!r}")
        check_lambda(self.lam)
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma (u's moving-average rate) must lie in (0, 1], got {self.gamma}")
        if self.grad_scale not in GRAD_SCALES:
            raise ValueError(f"grad_scale must be one of {GRAD_SCALES}, got {self.grad_scale!r}")

    def init(self, client: ClientInfo) -> State:
        state = self._init_model()
        if self.objective == "pauc":
            state["log_u"] = torch.zeros(max(client.max_samples, client.num_samples))
        return state

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        b1, lam = self.positives_per_batch, self.lam
        scale = lam if self.grad_scale == "objective" else 1.0
        vpos, vneg = self._masks(batch)
        pauc = self.objective == "pauc"
        idx = batch["local_index"][:b1]
        log_u_old = state["log_u"][idx] if pauc else None

        def surrogate(w):
            scores, buffers = self._scores(w, state["buffers"], batch["x"])
            pairs = self._pairs(scores[:b1], scores[b1:])  # [B1, B2], both ends active
            if not pauc:
                mask = vpos[:, None] * vneg[None, :]
                value = (pairs * mask).sum() / mask.sum().clamp_min(1)
                return value, (value, value, buffers)  # no u: the second slot is unused
            z = pairs / lam
            n_neg = vneg.sum()
            log_inner = torch.logsumexp(torch.where(vneg > 0, z.detach(), -math.inf), 1) - torch.log(
                n_neg.clamp_min(1)
            )
            ok = vpos * (n_neg > 0)
            log_u_new = log_u_in_order(log_u_old, log_inner, idx, ok, self.gamma)
            weights = torch.exp(z.detach() - log_u_new[:, None]) * vneg / n_neg.clamp_min(1)
            value = _masked_mean(lam * log_u_new, ok)
            return _masked_mean(scale * (weights * z).sum(1), ok), (value, log_u_new, buffers)

        g, (value, log_u_new, buffers) = grad(surrogate, has_aux=True)(state["w"])
        out = dict(state, **self._descend(state, g, ctx.lr), buffers=buffers, loss=value.detach())
        if pauc:
            out["log_u"] = state["log_u"].scatter(0, idx, log_u_new)
        return out

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        return self._average(state, comm)

"""Cross-entropy baselines of the LocalSCGDAM paper: FedProx, SCAFFOLD, LocalSGDM_RL.

- FedProx (Li et al., MLSys 2020): local SGD on L_CE(w) + (μ/2)‖w − w_r‖², w_r the
  round's global model; average w.
- SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates, full
  participation: w ← w − η(∇L_CE − c_k + c); at the round end
  c_k⁺ = c_k − c + (w_r − w_k)/(Iη), c = mean_k c_k⁺, w_{r+1} = w_r + η_g(mean_k w_k − w_r).
- LocalSGDM_RL (Wang et al., AAAI 2021; ALGORITHMS.md §1.7): LocalSGDM on the ratio
  loss, Ra re-estimated every round from the averaged model on an auxiliary batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.func import grad, grad_and_value

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
from fedxrisk.algorithms.fedavg import LocalSGDM
from fedxrisk.objectives.compositional import ce_loss
from fedxrisk.objectives.ratio import gradient_ratios, ratio_loss
from fedxrisk.problem import Problem
from fedxrisk.tree import clone, tmap, zeros_like


def _ce_gradient(problem: Problem, state: State, batch: Batch):
    """(∇_w L_CE, L_CE, buffers) at the client's model."""
    g, (loss, buffers) = grad_and_value(ce_loss, argnums=1, has_aux=True)(
        problem, state["w"], state["buffers"], batch
    )
    return g, loss, buffers


@register
@dataclass
class FedProx(Algorithm):
    """FedProx: local SGD with the proximal term (μ/2)‖w − w_r‖² toward the round's global model."""

    name = "fedprox"
    needs_both_classes = False  # cross-entropy: one-class clients are ordinary
    communicates = ("w",)

    problem: Problem
    mu: float = 0.01

    def check_hyperparameters(self) -> None:
        if self.mu < 0:
            raise ValueError(f"mu (the proximal coefficient) must be ≥ 0, got {self.mu}")

    def init(self, client: ClientInfo) -> State:
        w, buffers = self.problem.init_model()
        return {"w": w, "buffers": buffers, "ref": clone(w), "loss": torch.zeros(())}

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        """w ← w − η(∇L_CE(w) + μ(w − w_r))."""
        g, loss, buffers = _ce_gradient(self.problem, state, batch)
        w = tmap(lambda wi, gi, ri: wi - ctx.lr * (gi + self.mu * (wi - ri)), state["w"], g, state["ref"])
        return dict(state, w=w, buffers=buffers, loss=loss)

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        state = with_model(state, comm.mean(model_payload(state, self.problem)))
        return dict(state, ref=clone(state["w"]))


@register
@dataclass
class SCAFFOLD(Algorithm):
    """SCAFFOLD with option-II control variates and server step ``eta_g`` (full participation)."""

    name = "scaffold"
    needs_both_classes = False  # cross-entropy: one-class clients are ordinary
    communicates = ("w", "c")
    own_state: ClassVar[tuple[str, ...]] = ("loss", "c_local")  # per client; the rest: the broadcast

    problem: Problem
    eta_g: float = 1.0

    def check_hyperparameters(self) -> None:
        if self.eta_g <= 0:
            raise ValueError(f"eta_g (the server step) must be > 0, got {self.eta_g}")

    def init(self, client: ClientInfo) -> State:
        w, buffers = self.problem.init_model()
        return {
            "w": w,
            "buffers": buffers,
            "c_local": zeros_like(w),
            "c": zeros_like(w),
            "start": clone(w),
            "loss": torch.zeros(()),
        }

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        """w ← w − η(∇L_CE(w) − c_k + c)."""
        g, loss, buffers = _ce_gradient(self.problem, state, batch)
        w = tmap(
            lambda wi, gi, ck, c: wi - ctx.lr * (gi - ck + c), state["w"], g, state["c_local"], state["c"]
        )
        return dict(state, w=w, buffers=buffers, loss=loss)

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        scale = 1.0 / (ctx.window * ctx.lr)
        c_local = tmap(
            lambda ck, c, s, w: ck - c + (s - w) * scale,
            state["c_local"],
            state["c"],
            state["start"],
            state["w"],
        )
        avg = comm.mean({**model_payload(state, self.problem), "c": c_local})
        w = tmap(lambda s, m: s + self.eta_g * (m - s), state["start"], avg["w"])
        state = with_model(state, dict(avg, w=w))
        return dict(state, c_local=c_local, c=avg["c"], start=clone(w))


@register
@dataclass
class LocalSGDMRL(LocalSGDM):
    """LocalSGDM on the ratio loss (§1.7): CE weighted by ``ra_alpha + ra_beta·Ra_y``.

    Every round, after averaging, each client computes on ``round_batch_size``
    auxiliary samples of its shard the per-class sums of the last layer's BCE
    gradient at the averaged model; one mean gives the per-class mean gradients
    over all auxiliary samples, from which every client computes the same Ra.
    Per-class means make the estimate class-balanced whatever the class counts.
    Deviation: the paper's server holds its own auxiliary set; here the
    auxiliary samples come from the clients' shards (no extra data needed).
    Ra starts at [1, 1] (both classes weighted 1 + β) before the first estimate.

    Safeguard (ours): Ra is capped at ``ra_max``. The formula is unbounded: once one
    class is fitted its gradient → 0 and the other class's Ra → ∞; uncapped, Ra
    swung between 1e-15 and 1e14 within a few rounds on digits and training diverged
    (docs/scgdam.md). ``ra_max=None`` removes the cap.
    """

    name = "localsgdm_rl"
    couples_samples = (
        "its class gradient sums of a sampled batch leave the client every round, outside the local step"
    )
    communicates = ("w", "m", "ra")

    ra_alpha: float = 1.0
    ra_beta: float = 0.1
    round_batch_size: int = 32
    ra_max: float | None = 10.0
    last_layer: str | None = None  # parameter name; None: the last parameter with ≥ 2 dims

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        if self.ra_alpha < 0 or self.ra_beta < 0:
            raise ValueError("ra_alpha and ra_beta must be ≥ 0")
        if self.ra_max is not None and self.ra_max <= 0:
            raise ValueError(f"ra_max must be > 0 or None, got {self.ra_max}")
        if self.round_batch_size < 1:
            raise ValueError(f"round_batch_size must be ≥ 1, got {self.round_batch_size}")

    def __post_init__(self) -> None:
        super().__post_init__()
        names = [n for n, p in self.problem.model.named_parameters() if p.dim() >= 2]
        if self.last_layer is None:
            if not names:
                raise ValueError("the model has no weight matrix to serve as the last layer")
            self.last_layer = names[-1]
        elif self.last_layer not in dict(self.problem.model.named_parameters()):
            raise ValueError(f"last_layer {self.last_layer!r} is not a parameter of the model")

    def init(self, client: ClientInfo) -> State:
        return dict(super().init(client), ra=torch.ones(2))

    def _loss(self, w, buffers, batch: Batch):
        logits, new_buffers = self.problem.logits(w, buffers, batch["x"])
        return ratio_loss(logits, batch["y"], batch["ra"], self.ra_alpha, self.ra_beta), new_buffers

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        return super().local_step(state, dict(batch, ra=state["ra"]), ctx)

    def _class_gradient_sums(self, w, buffers, batch: Batch) -> dict[str, torch.Tensor]:
        """Σ over positives (negatives) of the last layer's BCE gradient, and the counts."""
        y = batch["y"]

        def class_loss(weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            logits, _ = self.problem.logits({**w, self.last_layer: weight}, buffers, batch["x"])
            return (F.binary_cross_entropy_with_logits(logits, y, reduction="none") * mask).sum()

        weight = w[self.last_layer]
        return {
            "pos": grad(class_loss)(weight, y),
            "neg": grad(class_loss)(weight, 1 - y),
            "n_pos": y.sum(),
            "n_neg": (1 - y).sum(),
        }

    def _ratios(self, sums: dict[str, torch.Tensor]) -> torch.Tensor:
        g_pos = sums["pos"] / sums["n_pos"].clamp_min(1)
        g_neg = sums["neg"] / sums["n_neg"].clamp_min(1)
        ra = gradient_ratios(g_neg, g_pos)
        return ra if self.ra_max is None else ra.clamp_max(self.ra_max)

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        state = super().communicate(state, comm, ctx)
        if ctx.round_batch is None:
            return state
        sums = comm.mean(
            comm.per_client(self._class_gradient_sums, state["w"], state["buffers"], ctx.round_batch)
        )
        return dict(state, ra=comm.per_client(self._ratios, sums))

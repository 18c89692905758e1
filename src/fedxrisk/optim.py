"""PESG: the proximal epoch stochastic gradient descent-ascent of CODA+'s local step, for one site.

One call of :meth:`PESG.step` is FDAM paper Alg. 2's local step (ALGORITHMS.md §2.2) on the
gradients of a :class:`fedxrisk.losses.AUCLoss` already back-propagated::

    v ← v − η·(clip(∇_v F) + wd·v + γ(v − v0))        v = (w, a, b), γ = ``epoch_decay``
    α ← Π(α + η·∇_α F)   (or the closed form 2(m + b − a) − 2α of AUCM, ``dual_step="closed_form"``)

and :meth:`PESG.update_regularizer` is Alg. 1's stage end: η ← η / decay_factor, v0 ← the stage's
average iterate, and (``restart="average"``, the paper) the iterate restarts from that average.
With ``momentum`` μ > 0 the primal direction d runs through PyTorch's heavy ball (buf ← μ·buf + d,
v ← v − η·buf); LibAUC's PESG weights the other way (buf ← (1 − μ)·buf + μ·d).

Everything the optimizer keeps — the reference point v0, the iterate sums, the momentum buffers —
is in ``optimizer.state`` (saved by ``state_dict``); the loss holds only its declared parameters
a, b, α, which the optimizer reads from ``loss_fn`` and lists in its own parameter groups
(``role`` = ``"model"``, ``"primal"``, ``"dual"``). Model buffers (BatchNorm statistics) are not
restarted at a stage end, unlike CODA+ on a model with running statistics.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from fedxrisk.losses import AUCLoss, AUCMLoss

__all__ = ["PESG"]


class PESG(torch.optim.Optimizer):
    """Proximal stochastic gradient descent on (w, a, b), ascent on α (CODA+ with one client).

    Args:
        params: the model's parameters (or its parameter groups; a, b and α form two more groups).
        loss_fn: an :class:`~fedxrisk.losses.AUCSquareLoss` or :class:`~fedxrisk.losses.AUCMLoss`.
        lr: step size η.
        momentum: heavy-ball μ on the primal direction (0: none, as CODA+).
        weight_decay: wd on w, a, b.
        epoch_decay: γ, the proximal pull towards the stage's reference point (CODA+'s ``prox``).
        clip_grad: clip the model's gradients elementwise to [−c, c] (not ∇a, ∇b); None: no clipping.
        dual_step: ``"gradient"`` (α's autograd gradient) or ``"closed_form"`` (AUCM only).
        dual_order: ``"simultaneous"`` or ``"sequential"`` (α's closed form at the new a, b).
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        loss_fn: AUCLoss,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        epoch_decay: float = 0.0,
        clip_grad: float | None = None,
        dual_step: str = "gradient",
        dual_order: str = "simultaneous",
    ):
        if not isinstance(loss_fn, AUCLoss):
            raise TypeError(f"loss_fn must be AUCSquareLoss or AUCMLoss, got {type(loss_fn).__name__}")
        if lr <= 0 or momentum < 0 or weight_decay < 0 or epoch_decay < 0:
            raise ValueError("lr must be > 0; momentum, weight_decay and epoch_decay ≥ 0")
        if dual_step not in ("gradient", "closed_form"):
            raise ValueError(f"dual_step must be 'gradient' or 'closed_form', got {dual_step!r}")
        if dual_step == "closed_form" and not isinstance(loss_fn, AUCMLoss):
            raise ValueError("dual_step='closed_form' is AUCM's α step; it needs loss_fn=AUCMLoss")
        if dual_order not in ("simultaneous", "sequential"):
            raise ValueError(f"dual_order must be 'simultaneous' or 'sequential', got {dual_order!r}")
        if dual_order == "sequential" and dual_step != "closed_form":
            raise ValueError("dual_order='sequential' needs dual_step='closed_form'")
        self.loss_fn = loss_fn
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay, epoch_decay=epoch_decay,
            clip_grad=clip_grad, dual_step=dual_step, dual_order=dual_order,
        )  # fmt: skip
        given = list(params)
        if given and isinstance(given[0], dict):  # the model's own parameter groups (e.g. per-layer lr)
            model_groups = [{**g, "role": "model"} for g in given]
        else:
            model_groups = [{"params": given, "role": "model"}]
        groups = [
            *model_groups,
            {"params": loss_fn.primal, "role": "primal"},
            {"params": loss_fn.dual, "role": "dual"},
        ]
        super().__init__(groups, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].update(ref=p.detach().clone(), sum=torch.zeros_like(p), count=0)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        """One descent step on the model, a and b and one ascent step on α (gradients from ``backward``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        primal = [g for g in self.param_groups if g["role"] != "dual"]
        dual = next(g for g in self.param_groups if g["role"] == "dual")
        new_a_b = {}
        for group in primal:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g, c = p.grad, group["clip_grad"]
                if c is not None and group["role"] == "model":
                    g = g.clamp(-c, c)
                state = self.state[p]
                d = g + group["weight_decay"] * p + group["epoch_decay"] * (p - state["ref"])
                if group["momentum"]:
                    buf = state.get("momentum_buffer")
                    d = state["momentum_buffer"] = (
                        d.clone() if buf is None else buf.mul_(group["momentum"]).add_(d)
                    )
                new_a_b[p] = p - group["lr"] * d
        alpha = self.loss_fn.alpha
        if dual["dual_step"] == "closed_form":
            a, b = self.loss_fn.a, self.loss_fn.b
            if dual["dual_order"] == "sequential":
                a, b = new_a_b.get(a, a), new_a_b.get(b, b)
            direction = self.loss_fn.alpha_direction(a, b)  # type: ignore[attr-defined]  (AUCMLoss)
        else:
            direction = alpha.grad if alpha.grad is not None else torch.zeros_like(alpha)
        new_alpha = self.loss_fn.project_alpha(alpha + dual["lr"] * direction)
        for p, value in new_a_b.items():
            p.copy_(value)
        alpha.copy_(new_alpha)
        for group in self.param_groups:  # the stage's iterates, for update_regularizer's average
            for p in group["params"]:
                state = self.state[p]
                state["sum"].add_(p)
                state["count"] += 1
        return loss

    @torch.no_grad()
    def update_regularizer(self, decay_factor: float = 3.0, restart: str = "average") -> None:
        """End a stage (FDAM Alg. 1 line 3): η ← η / ``decay_factor``; v0 ← the stage's average
        iterate; ``restart="average"`` (paper) also restarts v and α there, ``"last"`` (the authors'
        code, LibAUC) keeps the current iterate."""
        if restart not in ("average", "last"):
            raise ValueError(f"restart must be 'average' or 'last', got {restart!r}")
        for group in self.param_groups:
            group["lr"] /= decay_factor
            for p in group["params"]:
                state = self.state[p]
                if state["count"]:
                    average = state["sum"] / state["count"]
                    if restart == "average":
                        p.copy_(average)
                    state["ref"] = average  # a new tensor: p's later steps leave it as it is
                state["sum"].zero_()
                state["count"] = 0

"""Federated conditional stochastic optimization: FCSG, FCSG-M, Acc-FCSG-M (FCSG paper,
Wu et al., NeurIPS 2023, Alg. 1–2; ALGORITHMS.md §2.8) and the baselines Local-SCGD and
Local-SCGDM (Gao, Li & Huang, ICML 2022).

All minimize a :class:`~fedxrisk.objectives.conditional.ConditionalObjective`
(default: the AP surrogate of §1.6, so ``fedxrisk run --algorithm fcsg`` works on
plain binary data). A batch is either a conditional sample (``xi``/``eta``,
from a data source in :mod:`fedxrisk.tasks`) or a plain ``{x, y}`` mini-batch
that the objective turns into one (:meth:`ConditionalObjective.from_batch`).

Mapping Alg. 1 onto the contract. The state holds the current point x_t
(``w``) and the direction u_t that produced it. A local step is Alg. 1
lines 12–15 followed by line 10 of the next iteration::

    u_{t+1} = est(x_t; B_t)                                     (FCSG, line 14)
    u_{t+1} = (1 − β) u_t + β est(x_t; B_t)                     (FCSG-M, line 15)
    u_{t+1} = est(x_t; B_t) + (1 − β)(u_t − est(x_{t−1}; B_t))  (Acc-FCSG-M, Alg. 2 line 14)
    x_{t+1} = x_t − α u_{t+1}

so the round's ``communicate`` averaging (x, u) is exactly lines 7–8:
u = mean u and x = mean(x_{t−1} − α u). Acc-FCSG-M evaluates x_t and x_{t−1}
on the same samples B_t, and x_{t−1} is the client's own previous point (not
averaged), as in Alg. 2.

Initialization (line 2): the first ``init_batches`` local steps of the run
estimate u_1 at x_0 from B = ``init_batches`` × b outer samples (x stays at x_0
until the last of them, which takes the first step x_1 = x_0 − α u_1). With the
default ``init_batches = 1``, B = b.

Communication: FCSG sends only x. Its u is recomputed from scratch at every
step, so averaging it (line 7) cannot change any iterate: x's average already
equals mean(x_{t−1} − α u_t). FCSG-M and Acc-FCSG-M send x and u, twice the
bytes — the extra cost the paper's Limitation paragraph names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
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
from fedxrisk.objectives.conditional import (
    APSurrogate,
    ConditionalObjective,
    Sample,
    csg_estimate,
    sample_sizes,
)
from fedxrisk.problem import Problem
from fedxrisk.tree import leaves, tmap, zeros_like


def _check_beta(name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must lie in (0, 1], got {value}")


@dataclass
class _Conditional(Algorithm):
    """Shared pieces: the objective, the sample, the model payload."""

    problem: Problem
    objective: ConditionalObjective | None = None  # None: the AP surrogate with ``margin``
    margin: float = 0.6

    monitor = "val_ap"  # the AP objective
    default_lr = 0.1
    couples_samples = "conditional: its inner function is a mean over samples, so one sample moves every term"

    def check_hyperparameters(self) -> None:
        if self.objective is not None and not isinstance(self.objective, ConditionalObjective):
            raise TypeError(f"objective must be a ConditionalObjective, got {type(self.objective).__name__}")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._objective = self.objective if self.objective is not None else APSurrogate(self.margin)
        running = [k for k, v in self.problem.model.named_buffers() if v.is_floating_point()]
        if running and not self._objective.updates_buffers:
            raise ValueError(
                f"{self.name}: the model has running statistics {running[:3]}, which "
                f"{type(self._objective).__name__} does not update; use a model without them "
                "(e.g. BatchNorm with track_running_stats=False)"
            )

    def _sample(self, batch: Batch) -> Sample:
        sample = batch if "xi" in batch else self._objective.from_batch(batch)
        sample_sizes(sample)
        return sample

    def _estimate(self, params, state: State, sample: Sample):
        return csg_estimate(self._objective, self.problem, params, state["buffers"], sample)

    def _buffers(self, state: State, sample: Sample):
        """Running statistics after this step's training-mode forward pass at x_t."""
        return self._objective.updated_buffers(self.problem, state["w"], state["buffers"], sample)

    def payload(self, state: State) -> dict[str, Any]:
        """What a round averages besides the model."""
        return {}

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        """Average the model (with float buffers under the ``average`` policy) and :meth:`payload`."""
        extra = self.payload(state)
        avg = comm.mean({**model_payload(state, self.problem), **extra})
        return {**with_model(state, avg), **{k: avg[k] for k in extra}}


@register
@dataclass
class FCSG(_Conditional):
    """FCSG (Alg. 1, line 14): local steps along the biased CSG estimate; x averaged every q steps."""

    name = "fcsg"
    communicates = ("w",)

    init_batches: int = 1

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        if self.init_batches < 1:
            raise ValueError(f"init_batches must be ≥ 1, got {self.init_batches}")

    def init(self, client: ClientInfo) -> State:
        w, buffers = self.problem.init_model()
        return {"w": w, "buffers": buffers, "u": zeros_like(w), "loss": torch.zeros(())}

    def direction(self, state: State, est, sample: Sample) -> Any:
        """u_{t+1} from the estimate at x_t (line 14)."""
        return est

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        sample = self._sample(batch)
        est, value = self._estimate(state["w"], state, sample)
        buffers = self._buffers(state, sample)
        if ctx.step < self.init_batches:  # line 2: u_1 = mean of the B / b initial estimates
            u = tmap(lambda ui, e: ui + (e - ui) / (ctx.step + 1), state["u"], est)
            if ctx.step < self.init_batches - 1:
                return dict(state, u=u, loss=value, buffers=buffers)
        else:
            u = self.direction(state, est, sample)
        w = tmap(lambda x, d: x - ctx.lr * d, state["w"], u)  # line 10
        new = dict(state, w=w, u=u, loss=value, buffers=buffers)
        if "w_prev" in state:  # Acc-FCSG-M keeps x_{t-1}
            new["w_prev"] = state["w"]
        return new


@register
@dataclass
class FCSGM(FCSG):
    """FCSG-M (Alg. 1, line 15): momentum u_{t+1} = (1 − β)u_t + β·est; x and u averaged."""

    name = "fcsg_m"
    default_lr = 1.0  # selected on validation in docs/evidence.md (digits, MNIST-1D); 0.1 under-trains
    communicates = ("w", "u")

    beta: float = 0.1

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        _check_beta("beta", self.beta)

    def direction(self, state: State, est, sample: Sample) -> Any:
        return tmap(lambda u, e: (1 - self.beta) * u + self.beta * e, state["u"], est)

    def payload(self, state: State) -> dict[str, Any]:
        """Lines 7–8: u is averaged with x."""
        return {"u": state["u"]}


@register
@dataclass
class AccFCSGM(FCSGM):
    """Acc-FCSG-M (Alg. 2, line 14): STORM-style u_{t+1} = est(x_t) + (1 − β)(u_t − est(x_{t−1})),
    both estimates on the same samples B_t."""

    name = "acc_fcsg_m"
    default_lr = 0.1  # not in the evidence study: keeps the family's rate

    def init(self, client: ClientInfo) -> State:
        state = super().init(client)
        return dict(state, w_prev=tmap(torch.clone, state["w"]))

    def direction(self, state: State, est, sample: Sample) -> Any:
        est_prev, _ = self._estimate(state["w_prev"], state, sample)
        return tmap(lambda e, u, ep: e + (1 - self.beta) * (u - ep), est, state["u"], est_prev)


@register
@dataclass
class LocalSCGD(_Conditional):
    """Local-SCGD (federated SCGD; Gao et al. 2022): a moving-average inner state

        y_{t+1} = (1 − γ) y_t + γ · mean_i ĝ_i(x_t),   ĝ_i = 1/m Σ_j g_ηij(x_t, ξ_i)
        d_t = 1/b Σ_i (∂ĝ_i(x_t))ᵀ ∇f_ξi(y_i) + ∇r(x_t),   x_{t+1} = x_t − α d_t

    with x and y averaged every round. Where each outer sample's gradient is taken
    (``inner_state``):

    - ``"per_task"`` (default; the FCSG authors' baseline code): y_i = (1 − γ) y_t + γ ĝ_i,
      each task at its own point; y_{t+1} = mean_i y_i.
    - ``"shared"``: y_i = y_{t+1} for every i, the compositional view that ignores how
      the inner distribution depends on ξ (the FCSG paper's argument, §5.2).

    The first step sets y from the first batch (γ = 1), so ``per_task`` then equals FCSG.
    """

    name = "local_scgd"
    communicates = ("w", "y")
    couples_samples = (
        "compositional/conditional: its inner function is a mean over samples, so one sample moves every term"
    )

    gamma: float = 0.5  # weight of the new inner estimate ("inner state momentum")
    inner_state: str = "per_task"  # "per_task" (FCSG authors' code) | "shared"

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        _check_beta("gamma", self.gamma)
        if self.inner_state not in ("per_task", "shared"):
            raise ValueError(f"inner_state must be 'per_task' or 'shared', got {self.inner_state!r}")

    def init(self, client: ClientInfo) -> State:
        w, buffers = self.problem.init_model()
        y = self._objective.inner_init(self.problem, w)
        return {"w": w, "buffers": buffers, "y": y, "loss": torch.zeros(())}

    def compositional_gradient(self, state: State, sample: Sample, gamma: float):
        """(d_t, y_{t+1}, mean_i f_ξi(y_i)) on one sample."""
        obj, problem, buffers = self._objective, self.problem, state["buffers"]
        xi, eta = sample["xi"], sample["eta"]
        b, _ = sample_sizes(sample)
        weight = sample.get("xi_weight")
        if weight is None:
            device = next(leaf for _, leaf in leaves(eta)).device
            weight = torch.full((b,), 1.0 / b, device=device)
        else:
            weight = weight / weight.sum().clamp_min(1e-12)

        def wmean(v: torch.Tensor) -> torch.Tensor:  # weighted mean over the outer axis
            return (v * weight.reshape(weight.shape + (1,) * (v.dim() - 1))).sum(0)

        g_now = obj.inner_mean(problem, state["w"], buffers, xi, eta)
        y = tmap(lambda yi, g: (1 - gamma) * yi + gamma * wmean(g), state["y"], g_now)
        if self.inner_state == "per_task":  # y_i = (1 − γ) y_t + γ ĝ_i
            y_rows = tmap(lambda yi, g: (1 - gamma) * yi.unsqueeze(0) + gamma * g, state["y"], g_now)
        else:  # y_i = y_{t+1}
            y_rows = tmap(lambda v: v.unsqueeze(0).expand(b, *v.shape), y)
        # c_i = w_i ∇f_ξi(y_i), one row per outer sample
        c, f_value = grad_and_value(lambda yy: (obj.outer(problem, yy, xi) * weight).sum())(y_rows)

        def surrogate(params):  # Σ_i <ĝ_i(x), c_i> + r(x): its gradient is d_t
            g = obj.inner_mean(problem, params, buffers, xi, eta)
            dots = tmap(lambda gi, ci: (gi * ci).sum(), g, c)
            return sum(t for _, t in leaves(dots)) + obj.regularizer(problem, params)

        return grad(surrogate)(state["w"]), y, f_value

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        sample = self._sample(batch)
        d, y, value = self.compositional_gradient(state, sample, 1.0 if ctx.step == 0 else self.gamma)
        return self.update(dict(state, buffers=self._buffers(state, sample)), d, y, value, ctx)

    def update(self, state: State, d, y, value, ctx: StepContext) -> State:
        w = tmap(lambda x, di: x - ctx.lr * di, state["w"], d)
        return dict(state, w=w, y=y, loss=value)

    def payload(self, state: State) -> dict[str, Any]:
        return {"y": state["y"]}


@register
@dataclass
class LocalSCGDM(LocalSCGD):
    """Local-SCGDM: Local-SCGD with momentum v_{t+1} = (1 − β) v_t + β d_t, x_{t+1} = x_t − α v_{t+1};
    x, y and v averaged every round (the first step sets v = d)."""

    name = "local_scgdm"
    communicates = ("w", "y", "v")

    beta: float = 0.1

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        _check_beta("beta", self.beta)

    def init(self, client: ClientInfo) -> State:
        state = super().init(client)
        return dict(state, v=zeros_like(state["w"]))

    def update(self, state: State, d, y, value, ctx: StepContext) -> State:
        beta = 1.0 if ctx.step == 0 else self.beta
        v = tmap(lambda vi, di: (1 - beta) * vi + beta * di, state["v"], d)
        w = tmap(lambda x, vi: x - ctx.lr * vi, state["w"], v)
        return dict(state, w=w, y=y, v=v, loss=value)

    def payload(self, state: State) -> dict[str, Any]:
        return {"y": state["y"], "v": state["v"]}

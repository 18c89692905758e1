"""LocalSCGDAM and LocalSGDAM (federated compositional deep AUC paper; ALGORITHMS.md §2.6).

LocalSCGDAM (Alg. 1) solves min_x max_y f(g(x), y) with x = (w, a, b), y = α,
g(x) = x − ρ(∇_w L_CE, 0, 0) and f the AUC min-max loss
(:mod:`fedxrisk.objectives.compositional`). Each client keeps x, y, the inner
estimate h and the momenta u (for x) and v (for y); all five are averaged
every p steps (p = the engine's window).

Conventions and deviations (also in docs/scgdam.md):

- η is the schedule's learning rate; the step on x is γ_x·η·u and on y γ_y·η·v,
  the moving averages use αη, β_xη, β_yη (``alpha_h``, ``beta_x``, ``beta_y``),
  which must lie in (0, 1): checked by :meth:`validate_schedule` before training.
- ξ_t = ζ_t: the inner g and the outer f use the same mini-batch.
- The initialisation h_0, u_0, v_0 needs a batch ξ_0 before iteration 0; the
  engine gives one batch per step, so the first local step computes h_0, u_0,
  v_0 on its batch and then runs iteration t = 0 on the same batch (ξ_0 = ξ_1).
  Communication then happens exactly when mod(t + 1, p) = 0, as in Alg. 1.
- ∇gᵀz is an exact Hessian-vector product by default; ``first_order=True``
  takes ∇g ≈ I (the named first-order variant).
- With ``loss="aucm"`` α is projected onto α ≥ 0 after its step (Alg. 1 uses the
  square loss, α free, and has no projection).
- ``prior`` (issue 42): the p of each site's outer function f^(k) (eq. 1's "prior probability of
  the positive class") is the site's own training share p_k by default (``"site"``), so f^(k) is
  the AUC min-max loss of the site's distribution D^(k), as eq. (4) defines f^(k). The paper's
  experiments give every device the same ratio, where the two readings agree. ``"run"`` is the
  previous behaviour: the run's p (``pos_ratio_mode``, the pooled share by default) at every site.
  Why: eq. (4) averages the sites' f^(k) with equal weights, so with one pooled p the saddle point
  is α* = (p(1−q̄)·s̄₋ − (1−p)·q̄·s̄₊)/(p(1−p)), q̄ the mean of the sites' positive shares. Under
  label skew small sites hold most of the positive share (16 Dirichlet(0.5) sites at 1 % positives:
  q̄ ≈ 5p), so α* < −1, the term 2(1 + α)(p·s·1[y=0] − (1−p)·s·1[y=1]) changes sign and minimizing
  it over w *lowers* the positives' scores: test AUROC 0.05–0.27 on 3 of 4 seeds (cover, 0.96 %:
  0.053 and 0.266; test ``test_localscgdam_does_not_invert_at_one_percent_positives``). With p_k each
  site's α*_k = E_k[s|y=0] − E_k[s|y=1] ∈ [−1, 1] and their p_k(1−p_k)-weighted mean is too. Class-aware
  batches (p = P/B) and ``pos_ratio_mode = "batch"`` still set p per batch under either prior.
- ``stabilize`` (issue 33): the steps of a, b and α are capped at 1/ℓ, ℓ their exact curvature
  on the batch, and a, b, α are projected onto [0, 1], [0, 1] and α's interval after each step,
  as in CODA+ (why: :mod:`fedxrisk.objectives.auc`); the network's step is unchanged. On by
  default for LocalSGDAM, whose heavy-ball step η/(1 − μ) = 10 on a made label-skewed runs
  crawl (campaign, Dirichlet 0.5: test AUROC 0.81 → 0.93). Off by default for LocalSCGDAM:
  its step γ_x·η = 1 is below 2/ℓ_a and Alg. 1 as written ends higher there (0.93 against 0.86).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.func import grad_and_value

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
from fedxrisk.algorithms.schedule import Schedule
from fedxrisk.objectives import AUC_LOSSES, alpha_bounds, auxiliary_scales
from fedxrisk.objectives.compositional import auc_outer, inner_map, inner_map_with_vjp
from fedxrisk.problem import Problem
from fedxrisk.tree import tmap, zeros_like


def _x(state: State) -> dict[str, Any]:
    return {"w": state["w"], "a": state["a"], "b": state["b"]}


def _ema(old, new, rate: float):
    """(1 − rate)·old + rate·new, leaf-wise (Alg. 1 lines 3–4)."""
    return tmap(lambda o, n: (1 - rate) * o + rate * n, old, new)


def stabilized(x: dict[str, Any], alpha, batch: Batch, p, lr: float, old: dict[str, Any] | None, loss: str,
               margin: float):  # fmt: skip
    """x's a, b and α after a step of size ``lr`` taken from ``old`` (x, α before it): each block's
    move scaled by min(1, 1/(lr·ℓ)) on this batch, then projected onto its bounded domain."""
    scales = auxiliary_scales(batch["y"], p, lr)
    a = old["a"] + scales["a"] * (x["a"] - old["a"])
    b = old["b"] + scales["b"] * (x["b"] - old["b"])
    alpha = old["alpha"] + scales["alpha"] * (alpha - old["alpha"])
    x = dict(x, a=a.clamp(0.0, 1.0), b=b.clamp(0.0, 1.0))
    return x, alpha.clamp(*alpha_bounds(loss, margin))


PRIORS = ("site", "run")


def _check_loss(loss: str) -> None:
    if loss not in AUC_LOSSES:
        raise ValueError(f"loss must be one of {sorted(AUC_LOSSES)}, got {loss!r}")


@register
@dataclass
class LocalSCGDAM(Algorithm):
    """Local stochastic compositional gradient descent ascent with momentum (paper Alg. 1)."""

    name = "localscgdam"
    couples_samples = (
        "compositional: its inner function is a mean over samples, so one sample moves every term"
    )
    communicates = ("w", "a", "b", "alpha", "h", "u", "v")
    default_lr = 0.1  # η; the steps are γ_x·η and γ_y·η

    problem: Problem
    rho: float = 0.1  # ρ, the inner cross-entropy step of eq. (2)
    gamma_x: float = 10.0  # γ_x
    gamma_y: float = 10.0  # γ_y
    beta_x: float = 5.0  # β_x: u's moving-average rate is β_x·η (0.5 at the default η)
    beta_y: float = 5.0  # β_y
    alpha_h: float = 9.0  # the paper's α: h's rate is α·η (0.9 at the default η); not the dual α = y
    loss: str = "square"  # "square" (paper eq. 1) | "aucm"
    margin: float = 1.0  # AUCM margin
    first_order: bool = False  # ∇g ≈ I instead of the exact Hessian-vector product
    stabilize: bool = False  # a, b, α: steps ≤ 1/curvature, projected onto their domains (module doc)
    prior: str = "site"  # p of f^(k): "site" (the site's own positive share) | "run" (module doc)

    def check_hyperparameters(self) -> None:
        if self.prior not in PRIORS:
            raise ValueError(
                f"prior must be one of {PRIORS} (the p of each site's AUC loss), got {self.prior!r}"
            )
        if self.rho <= 0:
            raise ValueError(f"rho (the inner cross-entropy step ρ) must be > 0, got {self.rho}")
        for name in ("gamma_x", "gamma_y", "beta_x", "beta_y", "alpha_h"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        _check_loss(self.loss)
        if self.margin < 0:
            raise ValueError(f"margin must be ≥ 0, got {self.margin}")

    def validate_schedule(self, schedule: Schedule) -> None:
        """Alg. 1's input conditions αη, β_xη, β_yη ∈ (0, 1), for every stage's η."""
        for stage in schedule.stages:
            check_rates(stage.lr, alpha_h=self.alpha_h, beta_x=self.beta_x, beta_y=self.beta_y)

    # -- state ---------------------------------------------------------------
    def init(self, client: ClientInfo) -> State:
        w, buffers = self.problem.init_model()
        zero = torch.zeros(self.problem.label_shape)  # one a, b, α per label (multi-label data)
        x = {"w": w, "a": zero.clone(), "b": zero.clone()}
        return {
            **x,
            "alpha": zero.clone(),
            "h": zeros_like(x),  # set from the first batch (Alg. 1 initialisation)
            "u": zeros_like(x),
            "v": zero.clone(),
            "buffers": buffers,
            "p": torch.tensor(self._prior(client)),
            "loss": torch.zeros(()),
        }

    def _prior(self, client: ClientInfo) -> float | list[float]:
        """The p of this site's f^(k): its own positive share (``prior = "site"``) or the run's."""
        if self.prior == "site" and self.problem.sampled_pos_ratio is None:
            return client.pos_ratio
        return self.problem.client_pos_ratio(client.pos_ratio)

    # -- the stochastic (compositional) gradients ------------------------------
    def inner(self, x, buffers, batch: Batch):
        """g(x; ξ), z ↦ ∇g(x; ξ)ᵀz, and the buffers after the forward pass."""
        if self.first_order:
            value, new_buffers = inner_map(self.problem, x, buffers, batch, self.rho)
            return value, (lambda z: z), new_buffers
        return inner_map_with_vjp(self.problem, x, buffers, batch, self.rho)

    def outer_gradients(self, h, alpha, buffers, p, batch: Batch):
        """(∇_g f(h, y; ζ), ∇_y f(h, y; ζ), f)."""
        (gz, galpha), (f, _) = grad_and_value(auc_outer, argnums=(1, 2), has_aux=True)(
            self.problem, h, alpha, buffers, p, batch, self.loss, self.margin
        )
        return gz, galpha, f

    def compositional_gradient(self, state: State, batch: Batch):
        """At h = g(x; ξ): (∇g(x)ᵀ∇_g f(g(x), y), ∇_y f, f) — the one-batch gradient of
        :func:`~fedxrisk.objectives.compositional.compositional_auc_loss` (tests compare the two)."""
        h, jt, _ = self.inner(_x(state), state["buffers"], batch)
        gz, galpha, f = self.outer_gradients(h, state["alpha"], state["buffers"], state["p"], batch)
        return jt(gz), galpha, f

    def _initialize(self, state: State, batch: Batch) -> State:
        """h_0 = g(x_0; ξ_0), u_0 = ∇g(x_0; ξ_0)ᵀ∇_g f(h_0, y_0; ζ_0), v_0 = ∇_y f(h_0, y_0; ζ_0)."""
        h, jt, _ = self.inner(_x(state), state["buffers"], batch)
        gz, galpha, _ = self.outer_gradients(h, state["alpha"], state["buffers"], state["p"], batch)
        return dict(state, h=h, u=jt(gz), v=galpha)

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        """Alg. 1 lines 2–4 (iteration t = ctx.step)."""
        eta = ctx.lr
        if ctx.step == 0:
            state = self._initialize(state, batch)
        # line 2: x_{t+1} = x_t − γ_x η u_t,  y_{t+1} = y_t + γ_y η v_t
        x = tmap(lambda xi, ui: xi - self.gamma_x * eta * ui, _x(state), state["u"])
        alpha = state["alpha"] + self.gamma_y * eta * state["v"]
        if self.loss == "aucm":
            alpha = alpha.clamp_min(0.0)
        if self.stabilize:
            p = self.problem.batch_p(state["p"], batch["y"])
            old = {"a": state["a"], "b": state["b"], "alpha": state["alpha"]}
            x, alpha = stabilized(x, alpha, batch, p, self.gamma_x * eta, old, self.loss, self.margin)
        # line 3: h_{t+1} = (1 − αη) h_t + αη g(x_{t+1}; ξ_{t+1})
        g_value, jt, buffers = self.inner(x, state["buffers"], batch)
        h = _ema(state["h"], g_value, self.alpha_h * eta)
        # line 4: u_{t+1}, v_{t+1} from ∇g(x_{t+1})ᵀ∇_g f(h_{t+1}, y_{t+1}) and ∇_y f(h_{t+1}, y_{t+1})
        gz, galpha, f = self.outer_gradients(h, alpha, state["buffers"], state["p"], batch)
        u = _ema(state["u"], jt(gz), self.beta_x * eta)
        v = (1 - self.beta_y * eta) * state["v"] + self.beta_y * eta * galpha
        return dict(state, **x, alpha=alpha, h=h, u=u, v=v, buffers=buffers, loss=f)

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        """Alg. 1 lines 5–6: h, u, v, x, y ← their client averages (one packed mean)."""
        payload = {**model_payload(state, self.problem), "a": state["a"], "b": state["b"]}
        payload.update(alpha=state["alpha"], h=state["h"], u=state["u"], v=state["v"])
        avg = comm.mean(payload)
        return dict(
            with_model(state, avg),
            a=avg["a"],
            b=avg["b"],
            alpha=avg["alpha"],
            h=avg["h"],
            u=avg["u"],
            v=avg["v"],
        )


def check_rates(lr: float, **rates: float) -> None:
    """Raise if some rate·η lies outside (0, 1) (Alg. 1's αη, β_xη, β_yη ∈ (0, 1))."""
    for name, rate in rates.items():
        if not 0.0 < rate * lr < 1.0:
            raise ValueError(
                f"{name}·η must lie in (0, 1); got {name}={rate} and learning rate η={lr} "
                f"(product {rate * lr:g}). Lower the learning rate or {name}."
            )


@register
@dataclass
class LocalSGDAM(Algorithm):
    """Local momentum SGDA on the AUC min-max loss (Sharma et al. 2022; the paper's baseline).

    PyTorch momentum convention on both sides: m_x ← μ m_x + ∇_x F, x ← x − η m_x;
    m_y ← μ m_y + ∇_y F, y ← y + η m_y. Every p steps x, y and both momenta are averaged.
    """

    name = "localsgdam"
    communicates = ("w", "a", "b", "alpha", "m_x", "m_y")
    default_lr = 1.0  # like CoDA: sigmoid scores make the AUC loss's gradients small

    problem: Problem
    momentum: float = 0.9
    loss: str = "square"
    margin: float = 1.0
    stabilize: bool = True  # a, b, α: steps ≤ 1/curvature, projected onto their domains (module doc)

    def check_hyperparameters(self) -> None:
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {self.momentum}")
        _check_loss(self.loss)
        if self.margin < 0:
            raise ValueError(f"margin must be ≥ 0, got {self.margin}")

    def init(self, client: ClientInfo) -> State:
        w, buffers = self.problem.init_model()
        zero = torch.zeros(self.problem.label_shape)  # one a, b, α per label (multi-label data)
        x = {"w": w, "a": zero.clone(), "b": zero.clone()}
        return {
            **x,
            "alpha": zero.clone(),
            "m_x": zeros_like(x),
            "m_y": zero.clone(),
            "buffers": buffers,
            "p": torch.tensor(self.problem.client_pos_ratio(client.pos_ratio)),
            "loss": torch.zeros(()),
        }

    def _objective(self, x, alpha, buffers, p, batch: Batch):
        return auc_outer(self.problem, x, alpha, buffers, p, batch, self.loss, self.margin)

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        (gx, galpha), (f, buffers) = grad_and_value(self._objective, argnums=(0, 1), has_aux=True)(
            _x(state), state["alpha"], state["buffers"], state["p"], batch
        )
        m_x = tmap(lambda m, g: self.momentum * m + g, state["m_x"], gx)
        m_y = self.momentum * state["m_y"] + galpha
        x = tmap(lambda xi, m: xi - ctx.lr * m, _x(state), m_x)
        alpha = state["alpha"] + ctx.lr * m_y
        if self.loss == "aucm":
            alpha = alpha.clamp_min(0.0)
        if self.stabilize:  # the heavy ball's effective step is η/(1 − μ)
            p = self.problem.batch_p(state["p"], batch["y"])
            old = {"a": state["a"], "b": state["b"], "alpha": state["alpha"]}
            lr = ctx.lr / (1 - self.momentum)
            x, alpha = stabilized(x, alpha, batch, p, lr, old, self.loss, self.margin)
        return dict(state, **x, alpha=alpha, m_x=m_x, m_y=m_y, buffers=buffers, loss=f)

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        payload = {**model_payload(state, self.problem), "a": state["a"], "b": state["b"]}
        payload.update(alpha=state["alpha"], m_x=state["m_x"], m_y=state["m_y"])
        avg = comm.mean(payload)
        return dict(
            with_model(state, avg), a=avg["a"], b=avg["b"], alpha=avg["alpha"], m_x=avg["m_x"], m_y=avg["m_y"]
        )

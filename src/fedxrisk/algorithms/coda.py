"""Federated deep AUC maximization: CODA+ and CODASCA here, CoDA and NPA in coda_baselines.py.

FDAM paper (Yuan et al., ICML 2021), Algorithms 1–4; ALGORITHMS.md §2.2–2.5. Primal variable
v = (w, a, b), dual variable α, objective F = AUC square loss (eq. 2) or AUCM. A stage s solves the
proximal subproblem (eq. 5) ``min_v max_α f(v, α) + (γ/2)‖v − v0_s‖²`` with γ = ``prox``.

Two forms (``form``), each option overridable on its own:

- ``"paper"`` (default): AUC square loss, gradient ascent on α, no clipping,
  the next stage restarts from the stage's average iterate (Alg. 2's output),
  CODASCA's control variates from the iterates (eq. 6).
- ``"code"``: the authors' released script: AUCM loss, α's closed-form step 2(m + b − a) − 2α clamped to
  [0, 999] and taken after the primal step (with the updated a, b: ``dual_order="sequential"``), the
  network's gradients clipped to [−1, 1] (not ∇a, ∇b: ``clip_scope="network"``), weight decay 1e-5, the
  model continues from its last iterate while the prox reference becomes each client's own stage average
  (``prox_reference="local"``); CODASCA's control variates are the mean raw (unclipped) gradients, with
  the α variate accumulating the closed-form direction the α step uses (``alpha_variate="direction"``),
  and they are never reset at stage ends (``reset_variates=False``).

Where the paper speaks, ``"paper"`` follows it (simultaneous primal-dual step, global prox reference,
Alg. 4's zero variates at each stage start); where it does not (clipping scope, the α variate of a
closed-form step), both forms follow the code.

A restart from the stage average also restarts the float buffers (BatchNorm running statistics) from
their stage average, averaged over clients under ``average`` and per client under ``local``.

``stabilize`` (on in ``"paper"``, off in ``"code"``): Lemma 1's η ≤ 1/(4ℓ) held for a, b, α
by scaling their steps to min(η, 1/ℓ) with ℓ their exact curvature on the batch (under
instance-level DP its bound over every batch, from the public p: no label read), and a, b, α
projected onto the intervals holding the saddle point (a, b ∈ [0, 1], α ∈ [−1, 1]); the
network's step is the paper's. Why, and the NaN it prevents: :mod:`fedxrisk.objectives.auc`.

Deviation (documented): CODASCA's theory returns a random round's iterate per stage; we use the
stage's average iterate, as CODA+ does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

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
from fedxrisk.objectives import AUC_LOSSES, alpha_bounds, aucm_alpha_direction, auxiliary_scales
from fedxrisk.problem import Problem
from fedxrisk.tree import tmap, zeros_like

FORMS: dict[str, dict[str, Any]] = {
    "paper": dict(
        loss="square", restart="average", dual_step="gradient", clip_grad=None,
        weight_decay=0.0, control_variate="iterates", dual_order="simultaneous",
        prox_reference="global", reset_variates=True, stabilize=True,
    ),
    "code": dict(
        loss="aucm", restart="last", dual_step="closed_form", clip_grad=1.0,
        weight_decay=1e-5, control_variate="gradients", dual_order="sequential",
        prox_reference="local", reset_variates=False, stabilize=False,
    ),
}  # fmt: skip
ALPHA_MAX = 999.0  # the authors' clamp for AUCM's α


def _primal(state: State) -> dict[str, Any]:
    return {"w": state["w"], "a": state["a"], "b": state["b"]}


@register
@dataclass
class CODAPlus(Algorithm):
    """CODA+ (FDAM paper Alg. 1–2): stage-wise local SGDA with periodic averaging of v and α."""

    name = "codaplus"
    communicates = ("w", "a", "b", "alpha")
    uses_pos_ratio = True  # the AUC losses weigh the classes by p
    touches_labels = {"aux_scales": "curvature_bounds(p): the curvatures' bounds over any batch"}
    acts_at_stage_end, restarts_w = True, ("restart", "average")  # the stage restart (CoDA, NPA too)
    default_lr = 3.0  # sigmoid scores: square-loss gradients small (factor p(1 − p)); docs/benchmarks.md
    lr_pos_budget: ClassVar[float] = 0.27  # default_lr × p(1 − p) at p = 0.1, where 3.0 was chosen
    own_state: ClassVar[tuple[str, ...]] = ("loss", "p", "ref", "iterate_sum", "iterate_count")

    @classmethod
    def default_lr_for(cls, pos_ratio: float) -> float:
        """``default_lr``, lowered so that lr·p(1 − p) stays at its value for p = 0.1 (docs/tune.md):
        3.0 at p ≤ 0.105 (or ≥ 0.895); 1.09 at the heart hospitals' p = 0.55, where 3.0 diverges."""
        spread = pos_ratio * (1.0 - pos_ratio)
        if spread <= 0 or cls.lr_pos_budget / spread >= cls.default_lr * 0.95:  # within 5 %: kept (a
            return cls.default_lr  # validation split moving p from 0.100 to 0.101 changes nothing)
        return cls.lr_pos_budget / spread

    problem: Problem
    form: str = "paper"
    prox: float = 2e-3  # γ of eq. (5); the authors' code uses 1/500
    margin: float = 1.0  # AUCM margin m
    loss: str | None = None  # "square" | "aucm"
    restart: str | None = None  # "average" | "last"
    dual_step: str | None = None  # "gradient" | "closed_form"
    clip_grad: float | None = None
    weight_decay: float | None = None
    clip_scope: str = "network"  # "network" (code: ∇w only) | "all" (∇w, ∇a, ∇b)
    dual_order: str | None = None  # "simultaneous" (paper) | "sequential" (code: α after v, at the new a, b)
    prox_reference: str | None = None  # "global" (paper: v0 = mean stage average) | "local" (code: own)
    stabilize: bool | None = None  # a, b, α: steps ≤ 1/curvature, projected onto their bounded domains

    def check_hyperparameters(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {sorted(FORMS)}, got {self.form!r}")
        explicit_order = self.dual_order is not None
        for key, value in FORMS[self.form].items():
            if hasattr(self, key) and getattr(self, key) is None:
                setattr(self, key, value)
        self._check_choice("loss", sorted(AUC_LOSSES))
        self._check_choice("restart", ["average", "last"])
        self._check_choice("dual_step", ["gradient", "closed_form"])
        self._check_choice("clip_scope", ["network", "all"])
        self._check_choice("dual_order", ["simultaneous", "sequential"])
        self._check_choice("prox_reference", ["global", "local"])
        if self.dual_step == "closed_form" and self.loss != "aucm":
            raise ValueError("dual_step='closed_form' is AUCM's α step; it needs loss='aucm'")
        if self.dual_order == "sequential" and self.dual_step != "closed_form":
            if explicit_order:
                raise ValueError(
                    "dual_order='sequential' needs dual_step='closed_form' (α's step at the new a, b)"
                )
            self.dual_order = "simultaneous"  # a gradient α step is taken at the same point as v's
        if self.prox < 0 or self.weight_decay < 0 or self.margin < 0:
            raise ValueError("prox, weight_decay and margin must be ≥ 0")
        if self.clip_grad is not None and self.clip_grad <= 0:
            raise ValueError(f"clip_grad must be > 0 or None, got {self.clip_grad}")

    def _check_choice(self, key: str, allowed: list[str]) -> None:
        if getattr(self, key) not in allowed:
            raise ValueError(f"{key} must be one of {allowed}, got {getattr(self, key)!r}")

    # -- state ---------------------------------------------------------------
    def init(self, client: ClientInfo) -> State:
        w, buffers = self.problem.init_model()
        zero = torch.zeros(self.problem.label_shape)  # one a, b, α per label
        v = {"w": w, "a": zero.clone(), "b": zero.clone()}
        iterate_sum = {**zeros_like(v), "alpha": zero.clone()}  # for the stage average
        if _float_buffers(buffers):  # BatchNorm statistics restart with the weights
            iterate_sum["buffers"] = zeros_like(_float_buffers(buffers))
        return {
            **v,
            "alpha": zero.clone(),
            "buffers": buffers,
            "p": torch.tensor(self.problem.client_pos_ratio(client.pos_ratio)),
            "ref": tmap(torch.clone, v),  # v0 of the current stage
            "iterate_sum": iterate_sum,
            "iterate_count": torch.zeros(()),
            "loss": torch.zeros(()),
        }

    # -- the stochastic gradients of F_k -------------------------------------
    def _objective(self, v, alpha, buffers, p, batch: Batch):
        logits, new_buffers = self.problem.logits(v["w"], buffers, batch["x"])
        s = torch.sigmoid(logits)
        p = self.problem.batch_p(p, batch["y"])
        args = (s, batch["y"], v["a"], v["b"], alpha, p)
        f = AUC_LOSSES[self.loss](*args, self.margin) if self.loss == "aucm" else AUC_LOSSES[self.loss](*args)
        return f, new_buffers

    def sample_loss(self, params, state: State, batch: Batch):
        """F of eq. (2) (or AUCM) on ``batch`` at params = {v, α}: a mean of one term per sample
        given the state's p."""
        return self._objective(params["v"], params["alpha"], state["buffers"], state["p"], batch)

    def sample_params(self, state: State) -> dict[str, Any]:
        """(v, α): DP-SGD clips the gradient in all of them jointly."""
        return {"v": _primal(state), "alpha": state["alpha"]}

    def gradients(self, state: State, batch: Batch):
        """(∇_v F, ∇_α F, F, buffers) at the client's current (v, α) on ``batch``."""
        g, (f, buffers) = self.gradient(state, batch)
        return g["v"], g["alpha"], f, buffers

    def aux_scales(self, state: State, batch: Batch, lr: float) -> dict[str, Any] | None:
        """min(1, 1/(η·ℓ)) for a, b and α on this batch (``stabilize``), else None; ``label_free``
        (instance-level DP): ℓ's bound over every batch, from the public p, no label read."""
        if not self.stabilize:
            return None
        y = None if self.label_free else batch["y"]
        p = state["p"] if self.label_free else self.problem.batch_p(state["p"], batch["y"])
        extra = self.prox + self.weight_decay  # the prox and decay terms add to a's and b's curvature
        return auxiliary_scales(y, p, lr, extra, self.dual_step == "closed_form")

    def primal_direction(self, state: State, gv, scales: dict[str, Any] | None = None) -> dict[str, Any]:
        """clip(∇_v F) + wd·v + γ(v − v0): the primal descent direction of stage s
        (``clip_scope``: clip ∇w only, as the authors' code, or all of ∇v); a's and b's scaled."""
        if self.clip_grad is not None:
            clip = lambda g: g.clamp(-self.clip_grad, self.clip_grad)  # noqa: E731
            gv = tmap(clip, gv) if self.clip_scope == "all" else dict(gv, w=tmap(clip, gv["w"]))
        d = tmap(
            lambda g, v, v0: g + self.weight_decay * v + self.prox * (v - v0),
            gv, _primal(state), state["ref"],
        )  # fmt: skip
        if scales is not None:
            d.update(a=scales["a"] * d["a"], b=scales["b"] * d["b"])
        return d

    def dual_point(self, state: State, dv, lr: float) -> State:
        """Where α's step is taken: the current (a, b), or after the primal step (sequential)."""
        if self.dual_order == "simultaneous":
            return state
        return dict(state, a=state["a"] - lr * dv["a"], b=state["b"] - lr * dv["b"])

    def dual_direction(self, state: State, galpha: torch.Tensor, scales=None) -> torch.Tensor:
        if self.dual_step == "closed_form":
            galpha = aucm_alpha_direction(state["a"], state["b"], state["alpha"], self.margin)
        return galpha if scales is None else scales["alpha"] * galpha

    def project_alpha(self, alpha: torch.Tensor) -> torch.Tensor:
        """``stabilize``: α onto [−1, 1] (square) or [0, 1 + m] (AUCM); else AUCM's α clamped to
        [0, 999] as in the authors' code and the square loss's α free."""
        if self.stabilize:
            return alpha.clamp(*alpha_bounds(self.loss, self.margin))
        return alpha.clamp(0.0, ALPHA_MAX) if self.loss == "aucm" else alpha

    def project_scores(self, v: dict[str, Any]) -> dict[str, Any]:
        """``stabilize``: a, b onto [0, 1], where the class-mean scores they estimate lie."""
        if not self.stabilize:
            return v
        return dict(v, a=v["a"].clamp(0.0, 1.0), b=v["b"].clamp(0.0, 1.0))

    def apply_step(self, state: State, dv, dalpha, lr: float, f, buffers) -> State:
        """v ← v − η·dv, α ← α + η·dα, and accumulate the iterates for the stage average."""
        v = self.project_scores(tmap(lambda x, d: x - lr * d, _primal(state), dv))
        alpha = self.project_alpha(state["alpha"] + lr * dalpha)
        point = {**v, "alpha": alpha}
        if "buffers" in state["iterate_sum"]:
            point["buffers"] = _float_buffers(buffers)
        total = tmap(lambda acc, x: acc + x, state["iterate_sum"], point)
        return dict(
            state, **v, alpha=alpha, buffers=buffers, loss=f,
            iterate_sum=total, iterate_count=state["iterate_count"] + 1,
        )  # fmt: skip

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        """Alg. 2: v ← v − η(∇_v F_k + γ(v − v0)),  α ← α + η ∇_α F_k."""
        gv, galpha, f, buffers = self.gradients(state, batch)
        scales = self.aux_scales(state, batch, ctx.lr)
        dv = self.primal_direction(state, gv, scales)
        dalpha = self.dual_direction(self.dual_point(state, dv, ctx.lr), galpha, scales)
        return self.apply_step(state, dv, dalpha, ctx.lr, f, buffers)

    # -- communication ---------------------------------------------------------
    def round_payload(self, state: State, ctx: RoundContext) -> dict[str, Any]:
        """What a round averages: the model, a, b, α, and at stage ends the stage average
        (when it restarts the model or becomes the global prox reference)."""
        payload = {**model_payload(state, self.problem), "a": state["a"], "b": state["b"]}
        payload["alpha"] = state["alpha"]
        if ctx.stage_end and (self.restart == "average" or self.prox_reference == "global"):
            average = _stage_average(state)
            if "buffers" in average and not (
                self.restart == "average" and self.problem.buffer_policy == "average"
            ):
                del average["buffers"]  # local statistics, or no restart: nothing to average
            payload["stage_average"] = average
        return payload

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        """Average v and α every I steps (Alg. 2, "communicate"); end the stage if due."""
        avg = comm.mean(self.round_payload(state, ctx))
        state = dict(with_model(state, avg), a=avg["a"], b=avg["b"], alpha=avg["alpha"])
        return self.end_stage(state, avg, comm, ctx) if ctx.stage_end else state

    def end_stage(self, state: State, avg: dict[str, Any], comm: Collective, ctx: RoundContext) -> State:
        """Alg. 1 line 3: the stage output becomes the next stage's v0 (and start point)."""
        own = _stage_average(state)
        stage_avg = avg.get("stage_average", own)
        ref = {k: (stage_avg if self.prox_reference == "global" else own)[k] for k in ("w", "a", "b")}
        if self.restart == "average":
            restart = {k: stage_avg[k].clone() for k in ("a", "b", "alpha")}
            state = dict(state, w=tmap(torch.clone, stage_avg["w"]), **restart)
            if "buffers" in own:  # running statistics restart from their stage average too
                buffers = stage_avg.get("buffers", own["buffers"])
                state["buffers"] = {**state["buffers"], **tmap(torch.clone, buffers)}
        return dict(
            state, ref=ref,
            iterate_sum=zeros_like(state["iterate_sum"]),
            iterate_count=torch.zeros_like(state["iterate_count"]),
        )  # fmt: skip


def _expand(count: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-client count ``[K]`` against a stacked leaf ``[K, ...]``."""
    return count.reshape(count.shape + (1,) * (like.dim() - count.dim()))


def _stage_average(state: State) -> dict[str, Any]:
    """This client's average of the stage's iterates (and float buffers)."""
    return tmap(lambda s: s / _expand(state["iterate_count"], s), state["iterate_sum"])


def _float_buffers(buffers: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in buffers.items() if v.is_floating_point()}


@register
@dataclass
class CODASCA(CODAPlus):
    """CODASCA (FDAM paper Alg. 3–4): CODA+ with control variates on v and α and a server step η_g."""

    name = "codasca"
    communicates = ("w", "a", "b", "alpha", "c")
    own_state: ClassVar[tuple[str, ...]] = (*CODAPlus.own_state, "c_local")

    eta_g: float = 1.0  # server extrapolation; theory √K, tuned in {0.99, 0.999, 1, 1.1}
    control_variate: str | None = None  # "iterates" (eq. 6) | "gradients" (code: mean raw gradient)
    alpha_variate: str = "direction"  # gradients variate of α: "direction" of α's step (code) | "gradient"
    reset_variates: bool | None = None  # zero variates at stage starts (paper Alg. 4) or never (code)

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        self._check_choice("control_variate", ["iterates", "gradients"])
        self._check_choice("alpha_variate", ["direction", "gradient"])
        if self.eta_g <= 0:
            raise ValueError(f"eta_g must be > 0, got {self.eta_g}")

    def init(self, client: ClientInfo) -> State:
        state = super().init(client)
        shape = self.problem.label_shape
        control = {
            "w": zeros_like(state["w"]),
            "a": torch.zeros(shape),
            "b": torch.zeros(shape),
            "alpha": torch.zeros(shape),
        }
        state.update(c_local=control, c=zeros_like(control), start=self._point(state))
        if self.control_variate == "gradients":
            state["grad_sum"] = zeros_like(control)
        return state

    @staticmethod
    def _point(state: State) -> dict[str, Any]:
        return tmap(torch.clone, {**_primal(state), "alpha": state["alpha"]})

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        """v ← v − η_l(∇_v F^s_k − c_v^k + c_v),  α ← α + η_l(∇_α F^s_k − c_α^k + c_α)."""
        gv, galpha, f, buffers = self.gradients(state, batch)
        c_local, c, scales = state["c_local"], state["c"], self.aux_scales(state, batch, ctx.lr)
        dv = tmap(
            lambda d, ck, cg: d - ck + cg,
            self.primal_direction(state, gv, scales),
            {k: c_local[k] for k in ("w", "a", "b")},
            {k: c[k] for k in ("w", "a", "b")},
        )
        direction = self.dual_direction(self.dual_point(state, dv, ctx.lr), galpha, scales)
        new = self.apply_step(state, dv, direction - c_local["alpha"] + c["alpha"], ctx.lr, f, buffers)
        if self.control_variate == "gradients":  # unclipped ∇v; α: the step's direction or ∇_α F
            if scales is not None:
                gv = dict(gv, a=scales["a"] * gv["a"], b=scales["b"] * gv["b"])
            raw = {**gv, "alpha": direction if self.alpha_variate == "direction" else galpha}
            new["grad_sum"] = tmap(lambda acc, g: acc + g, state["grad_sum"], raw)
        return new

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        """Eq. (6) control variates, averaging, then v_r = v_{r−1} + η_g(v̄_r − v_{r−1})."""
        start, point = state["start"], {**_primal(state), "alpha": state["alpha"]}
        if self.control_variate == "iterates":  # c^k − c + (v_{r−1} − v^k)/(I η_l), sign flipped for α
            scale = 1.0 / (ctx.window * ctx.lr)
            drift = tmap(lambda s, x: (s - x) * scale, start, point)
            drift["alpha"] = -drift["alpha"]
            c_local = tmap(lambda ck, cg, d: ck - cg + d, state["c_local"], state["c"], drift)
        else:
            c_local = tmap(lambda g: g / ctx.window, state["grad_sum"])
            state = dict(state, grad_sum=zeros_like(state["grad_sum"]))
        payload = self.round_payload(state, ctx)
        payload["c"] = c_local
        avg = comm.mean(payload)
        new_point = tmap(
            lambda s, m: s + self.eta_g * (m - s), start, {k: avg[k] for k in ("w", "a", "b", "alpha")}
        )
        new_point = self.project_scores(dict(new_point, alpha=self.project_alpha(new_point["alpha"])))
        model = dict(avg, w=new_point["w"])
        state = dict(
            with_model(state, model),
            a=new_point["a"],
            b=new_point["b"],
            alpha=new_point["alpha"],
            c_local=c_local,
            c=avg["c"],
        )
        if ctx.stage_end:
            state = self.end_stage(state, avg, comm, ctx)
            if self.reset_variates:  # Alg. 4 starts every stage with zero control variates
                state.update(c_local=zeros_like(c_local), c=zeros_like(c_local))
        return dict(state, start=self._point(state))

"""Conditional stochastic objectives and the biased CSG estimator (FCSG paper §3, eq. 3).

A conditional stochastic objective is

    F(x) = E_ξ f_ξ( E_{η|ξ} g_η(x, ξ) ) + r(x)

with an outer sample ξ, inner samples η drawn from P(η | ξ), an inner
function g (any tree of tensors) and a scalar outer function f. A *sample*
is a dict:

- ``xi``: a tree whose leaves have a leading outer axis ``[b, ...]``;
- ``eta``: a tree whose leaves have leading axes ``[b, m, ...]``: the m inner
  samples drawn for outer sample i sit in row i;
- optional ``xi_weight`` ``[b]``: weights of the outer samples (a weighted mean
  replaces the plain mean; used to mask outer samples, e.g. the positives of a
  mixed mini-batch);
- optional ``xi_id`` ``[b]`` and ``eta_of`` ``[b, m]``: which outer sample each
  inner sample was drawn for; :func:`check_sample` requires
  ``eta_of[i, j] == xi_id[i]``.

The biased estimator of Hu et al. (2020), used by every FCSG algorithm, is the
gradient of the empirical objective built from b outer and m inner samples::

    F^(x) = 1/b Σ_i f_ξi( 1/m Σ_j g_ηij(x, ξi) ) + r(x)
    ∇F^(x) = 1/b Σ_i (1/m Σ_j ∇g_ηij(x, ξi))ᵀ ∇f_ξi(1/m Σ_j g_ηij(x, ξi)) + ∇r(x)

Objectives are used with any model through its functional form
(``problem.model`` called with :func:`torch.func.functional_call`). BatchNorm
running statistics are tracked only by objectives that set ``updates_buffers``
(the AP surrogate); the algorithms reject models with running statistics otherwise.

Three objectives of the paper are defined here: the average-precision
surrogate (§5.3, ALGORITHMS.md §1.6), invariant logistic regression
(§5.1, §1.8) and MAML (§5.2, §1.9).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, grad_and_value, vmap

from fedxrisk.problem import Problem
from fedxrisk.tree import Tree, leaves, tmap

Sample = dict[str, Any]


class ConditionalObjective:
    """Interface: ``inner`` (g, per inner sample), ``outer`` (f), optional ``regularizer`` (r).

    Subclasses implement :meth:`inner` and :meth:`outer`; they may override
    :meth:`inner_mean` with a cheaper exact form (MAML averages gradients with
    one backward pass) and :meth:`inner_init` (the shape of one outer sample's
    inner value, for the moving-average inner state of Local-SCGD).
    """

    def inner(self, problem: Problem, params: Tree, buffers: Tree, xi: Tree, eta: Tree) -> Tree:
        """g_ηij(x, ξi) for every pair: a tree with leaves ``[b, m, ...]``."""
        raise NotImplementedError

    def inner_mean(self, problem: Problem, params: Tree, buffers: Tree, xi: Tree, eta: Tree) -> Tree:
        """1/m Σ_j g_ηij(x, ξi): a tree with leaves ``[b, ...]``."""
        return tmap(lambda v: v.mean(1), self.inner(problem, params, buffers, xi, eta))

    def outer(self, problem: Problem, y: Tree, xi: Tree) -> torch.Tensor:
        """f_ξi(y_i) for every outer sample: ``[b]``."""
        raise NotImplementedError

    def regularizer(self, problem: Problem, params: Tree) -> torch.Tensor:
        """r(x), a deterministic term outside the nested expectation (default 0)."""
        return torch.zeros(())

    def inner_init(self, problem: Problem, params: Tree) -> Tree:
        """A value shaped like one outer sample's inner mean (start of an inner state)."""
        raise NotImplementedError

    updates_buffers: bool = False  # whether :meth:`updated_buffers` tracks running statistics

    def updated_buffers(self, problem: Problem, params: Tree, buffers: Tree, sample: Sample) -> Tree:
        """Model buffers (BatchNorm running statistics) after a training-mode forward pass on
        the step's data at ``params``; the default leaves them unchanged."""
        return buffers

    def from_batch(self, batch: dict[str, torch.Tensor]) -> Sample:
        """Build a sample from a plain ``{x, y}`` mini-batch, where the objective allows it."""
        raise ValueError(
            f"{type(self).__name__} needs conditional batches with 'xi' and 'eta' "
            "(use a conditional data source from fedxrisk.tasks)"
        )


# -- samples: checks and the estimator ---------------------------------------------------------


def _lead(tree: Tree, name: str, ndim: int) -> tuple[int, ...]:
    """The common leading ``ndim`` sizes of a tree's leaves; an error if they differ."""
    shapes = {path: tuple(t.shape[:ndim]) for path, t in leaves(tree)}
    if not shapes:
        raise ValueError(f"conditional sample: '{name}' holds no tensors")
    for path, t in leaves(tree):
        if t.dim() < ndim:
            raise ValueError(f"conditional sample: {name}.{path} has shape {tuple(t.shape)}; "
                             f"expected at least {ndim} leading axes")  # fmt: skip
    distinct = set(shapes.values())
    if len(distinct) > 1:
        raise ValueError(f"conditional sample: leaves of '{name}' disagree on leading axes: {shapes}")
    return distinct.pop()


def sample_sizes(sample: Sample, batch_dims: int = 0) -> tuple[int, int]:
    """(b, m) of a sample, checking shapes only (safe inside ``vmap``).

    ``batch_dims`` leading axes (e.g. the client axis of a stacked batch) come
    before the outer axis and must agree between ``xi`` and ``eta``.
    """
    if "xi" not in sample or "eta" not in sample:
        raise ValueError(f"conditional sample needs 'xi' and 'eta', got keys {sorted(sample)}")
    xi_lead = _lead(sample["xi"], "xi", batch_dims + 1)
    eta_lead = _lead(sample["eta"], "eta", batch_dims + 2)
    if eta_lead[: batch_dims + 1] != xi_lead:
        raise ValueError(
            f"conditional sample: inner samples have leading shape {eta_lead[: batch_dims + 1]} "
            f"but outer samples {xi_lead}; row i of 'eta' must hold the inner samples of outer sample i"
        )
    b, m = eta_lead[batch_dims], eta_lead[batch_dims + 1]
    if b < 1:
        raise ValueError("conditional sample: no outer sample (b = 0)")
    if m < 1:
        raise ValueError(f"conditional sample: m = {m} inner samples per outer sample; need m ≥ 1")
    if "xi_weight" in sample and tuple(sample["xi_weight"].shape) != xi_lead:
        raise ValueError(f"xi_weight has shape {tuple(sample['xi_weight'].shape)}, expected {xi_lead}")
    return b, m


def check_sample(sample: Sample, batch_dims: int = 0) -> tuple[int, int]:
    """Shapes (:func:`sample_sizes`) and, when given, that every inner sample was drawn
    for its own outer sample (``eta_of[..., i, j] == xi_id[..., i]``). Call outside ``vmap``."""
    b, m = sample_sizes(sample, batch_dims)
    has_of, has_id = "eta_of" in sample, "xi_id" in sample
    if has_of != has_id:
        raise ValueError("conditional sample: give both 'xi_id' and 'eta_of' or neither")
    if has_of:
        of, ids = sample["eta_of"], sample["xi_id"]
        lead = tuple(ids.shape)
        if tuple(of.shape) != lead + (m,):
            raise ValueError(f"eta_of has shape {tuple(of.shape)}, expected {lead + (m,)}")
        bad = (of != ids.unsqueeze(-1)).nonzero()
        if len(bad):
            pos = tuple(bad[0].tolist())
            raise ValueError(
                f"inner sample {pos} was drawn for outer sample {int(of[pos])} but sits with outer "
                f"sample {int(ids[pos[:-1]])}: inner samples must come from P(η | ξ) of their own ξ"
            )
    return b, m


def csg_objective(
    objective: ConditionalObjective, problem: Problem, params: Tree, buffers: Tree, sample: Sample
) -> torch.Tensor:
    """The empirical objective F^(x; ξ, B) of eq. (3), averaged over the b outer samples."""
    y = objective.inner_mean(problem, params, buffers, sample["xi"], sample["eta"])
    values = objective.outer(problem, y, sample["xi"])
    weight = sample.get("xi_weight")
    mean = values.mean() if weight is None else (values * weight).sum() / weight.sum().clamp_min(1e-12)
    return mean + objective.regularizer(problem, params)


def csg_estimate(
    objective: ConditionalObjective, problem: Problem, params: Tree, buffers: Tree, sample: Sample
) -> tuple[Tree, torch.Tensor]:
    """(∇F^(x; ξ, B), F^(x; ξ, B)): the biased conditional stochastic gradient (FCSG paper §3)."""
    sample_sizes(sample)
    return grad_and_value(lambda p: csg_objective(objective, problem, p, buffers, sample))(params)


# -- AUPRC: the average-precision surrogate (§5.3; ALGORITHMS.md §1.6) --------------------------


SAME_BATCH = "same_batch"  # key in xi: eta's every row is the outer batch itself


class APSurrogate(ConditionalObjective):
    """Online AP surrogate: ξ = a positive z⁺, η = a sample z of the client's data.

    g_η(x, ξ) = [ℓ(x; z⁺, z)·1[y = 1], ℓ(x; z⁺, z)],  f(u) = −u₀ / u₁,
    ℓ = (max{s − h(z⁺) + h(z), 0})², h = sigmoid of the model's logit, s = ``margin``.
    """

    def __init__(self, margin: float = 0.6, eps: float = 1e-8):
        if margin < 0:
            raise ValueError(f"AP surrogate margin must be ≥ 0, got {margin}")
        self.margin, self.eps = margin, eps

    updates_buffers = True

    def inner(self, problem, params, buffers, xi, eta):
        x_pos, x_in = xi["x"], eta["x"]  # [b, ...], [b, m, ...]
        b, m = x_in.shape[:2]
        if SAME_BATCH in xi:  # from_batch: every row of eta is the outer batch, scored once (b = m)
            s_pos = torch.sigmoid(problem.logits(params, buffers, x_pos)[0])
            s_in = s_pos.unsqueeze(0).expand(b, m)
        else:  # one forward pass, so BatchNorm's batch statistics are shared by both score sets
            flat = torch.cat([x_pos, x_in.reshape(b * m, *x_in.shape[2:])])
            s = torch.sigmoid(problem.logits(params, buffers, flat)[0])
            s_pos, s_in = s[:b], s[b:].reshape(b, m)
        return self.pair_terms(s_pos, s_in, eta["y"])

    def pair_terms(self, s_pos: torch.Tensor, s_in: torch.Tensor, y_in: torch.Tensor) -> torch.Tensor:
        """g on scores: ``[ℓ·1[y = 1], ℓ]`` for positives ``s_pos`` ``[b]`` against ``s_in`` ``[b, m]``."""
        loss = torch.clamp(self.margin - s_pos[:, None] + s_in, min=0) ** 2
        return torch.stack([loss * y_in, loss], dim=-1)  # [b, m, 2]

    def updated_buffers(self, problem, params, buffers, sample):
        """Running statistics from the positives and the first row of inner samples (every
        row holds the same mini-batch in :class:`~fedxrisk.tasks.AUPRCData` and :meth:`from_batch`)."""
        x = torch.cat([sample["xi"]["x"], sample["eta"]["x"][0]])
        return problem.logits(tmap(torch.Tensor.detach, params), buffers, x)[1]

    def outer(self, problem, y, xi):
        return -y[..., 0] / (y[..., 1] + self.eps)

    def inner_init(self, problem, params):
        return torch.zeros(2)

    def from_batch(self, batch):
        """LibAUC's online form: the positives of the mini-batch are the outer samples
        (``xi_weight`` = y) and the whole mini-batch is every positive's inner sample set.
        ``xi[SAME_BATCH]`` tells :meth:`inner` so, which then scores the batch once instead
        of b + b² times (the same scores, and the same BatchNorm batch statistics)."""
        x, y = batch["x"], batch["y"]
        n = x.shape[0]
        eta = {"x": x.unsqueeze(0).expand(n, *x.shape), "y": y.unsqueeze(0).expand(n, n)}
        return {"xi": {"x": x, SAME_BATCH: y}, "eta": eta, "xi_weight": y}


# -- invariant logistic regression (§5.1; ALGORITHMS.md §1.8) ---------------------------------


class InvariantLogistic(ConditionalObjective):
    """ξ = (a, b), η | ξ ~ N(a, σ2² I): g_η(x, ξ) = ηᵀx, f_ξ(u) = log(1 + exp(−b·u)),
    r(x) = λ Σ_i γ x_i² / (1 + γ x_i²).

    The logistic loss is applied to the *mean* of the inner samples (the paper's
    formulation), not averaged over them as in the authors' code (§1.8).
    The model is any module mapping a vector η to a score ηᵀx (e.g. ``nn.Linear(d, 1, bias=False)``).
    """

    def __init__(self, lam: float = 1e-3, gamma: float = 10.0):
        self.lam, self.gamma = lam, gamma

    def inner(self, problem, params, buffers, xi, eta):
        eta_x = eta["x"]  # [b, m, d]
        out = problem.logits(params, buffers, eta_x.reshape(-1, eta_x.shape[-1]))[0]
        return out.reshape(eta_x.shape[:2])

    def outer(self, problem, y, xi):
        return F.softplus(-xi["b"] * y)

    def regularizer(self, problem, params):
        sq = [self.gamma * p**2 for p in params.values()]
        return self.lam * sum((s / (1 + s)).sum() for s in sq)

    def inner_init(self, problem, params):
        return torch.zeros(())


# -- MAML (§5.2; ALGORITHMS.md §1.9) ----------------------------------------------------------


def _class_logits(problem: Problem, params: Tree, x: torch.Tensor) -> torch.Tensor:
    return functional_call(problem.model, params, (x,))


class MAMLObjective(ConditionalObjective):
    """ξ = (task i, query set a), η = a support sample of task i:

    g_η(x, ξ) = x − λ ∇L_i(x; η),   f_ξ(y) = L_i(y; a),   L_i = cross-entropy over the N classes.

    One inner step of size ``inner_lr`` (λ = 0.4 in the paper); the outer gradient
    differentiates through it (second order). :meth:`inner_mean` uses the
    linearity 1/m Σ_j (x − λ∇L(x; η_j)) = x − λ∇(1/m Σ_j L(x; η_j)): one backward
    pass instead of m (tested against :meth:`inner`).
    Batches: ``xi = {"x": [b, Q, ...], "y": [b, Q]}``, ``eta = {"x": [b, m, ...], "y": [b, m]}``.
    """

    def __init__(self, inner_lr: float = 0.4):
        if inner_lr <= 0:
            raise ValueError(f"inner_lr must be > 0, got {inner_lr}")
        self.inner_lr = inner_lr

    def _loss(self, problem: Problem, params: Tree, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(_class_logits(problem, params, x), y.long())

    def adapt(self, problem: Problem, params: Tree, x: torch.Tensor, y: torch.Tensor) -> Tree:
        """One inner step x − λ ∇L(x; (x_s, y_s)) on one task's support set."""
        g = grad(lambda p: self._loss(problem, p, x, y))(params)
        return tmap(lambda p, gi: p - self.inner_lr * gi, params, g)

    def inner(self, problem, params, buffers, xi, eta):
        def one_task(x, y):  # [m, ...], [m]: one adapted model per support sample
            return vmap(lambda xj, yj: self.adapt(problem, params, xj[None], yj[None]))(x, y)

        return vmap(one_task)(eta["x"], eta["y"])

    def inner_mean(self, problem, params, buffers, xi, eta):
        return vmap(lambda x, y: self.adapt(problem, params, x, y))(eta["x"], eta["y"])

    def outer(self, problem, y, xi):
        return vmap(lambda p, x, t: self._loss(problem, p, x, t))(y, xi["x"], xi["y"])

    def inner_init(self, problem, params):
        return tmap(torch.zeros_like, params)

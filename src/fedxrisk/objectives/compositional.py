"""Compositional deep AUC (ALGORITHMS.md §1.3; LocalSCGDAM paper eq. 2–3).

    min_{w,a,b} max_α  L_AUC(w~, a, b, α)   with   w~ = w − ρ ∇_w L_CE(w)

written as f(g(x), y) with x = (w, a, b), y = α and the inner map
g(x; ξ) = x − ρ·(∇_w L_CE(w; ξ), 0, 0). The outer function f(z, α; ζ) is the
AUC min-max loss (square or AUCM, :mod:`fedxrisk.objectives.auc`) of the
model with parameters z_w, at a = z_a, b = z_b.

Points x, z are trees ``{"w": params, "a": scalar, "b": scalar}``. Every
function is pure (torch.func), so it runs per client and under ``vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.func import grad, vjp

from fedxrisk.objectives.auc import auc_square_loss, aucm_loss
from fedxrisk.objectives.ce import bce_loss
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree, tmap

Batch = dict[str, torch.Tensor]
Point = dict[str, Any]  # {"w": tree, "a": tensor, "b": tensor}


def ce_loss(problem: Problem, w: Tree, buffers: Tree, batch: Batch) -> tuple[torch.Tensor, Tree]:
    """L_CE(w; ξ) and the buffers after the forward pass."""
    logits, new_buffers = problem.logits(w, buffers, batch["x"])
    return bce_loss(logits, batch["y"]), new_buffers


def inner_map(problem: Problem, x: Point, buffers: Tree, batch: Batch, rho: float) -> tuple[Point, Tree]:
    """g(x; ξ) = (w − ρ∇_w L_CE(w; ξ), a, b) (eq. 3) and the buffers of the CE forward pass."""
    g_ce, new_buffers = grad(ce_loss, argnums=1, has_aux=True)(problem, x["w"], buffers, batch)
    return {"w": tmap(lambda w, d: w - rho * d, x["w"], g_ce), "a": x["a"], "b": x["b"]}, new_buffers


def inner_map_with_vjp(
    problem: Problem, x: Point, buffers: Tree, batch: Batch, rho: float
) -> tuple[Point, Callable[[Point], Point], Tree]:
    """g(x; ξ), the map z ↦ ∇g(x; ξ)ᵀ z, and the buffers.

    ∇g = I − ρ·blockdiag(∇²L_CE, 0, 0), so ∇gᵀ z = (z_w − ρ·∇²L_CE z_w, z_a, z_b): an exact
    Hessian-vector product, the vector–Jacobian product of ∇L_CE (reverse over reverse).
    """
    g_ce, hvp, new_buffers = vjp(
        lambda w: grad(ce_loss, argnums=1, has_aux=True)(problem, w, buffers, batch), x["w"], has_aux=True
    )
    value = {"w": tmap(lambda w, d: w - rho * d, x["w"], g_ce), "a": x["a"], "b": x["b"]}

    def transpose_jacobian(z: Point) -> Point:
        (hz,) = hvp(z["w"])
        return {"w": tmap(lambda zi, hi: zi - rho * hi, z["w"], hz), "a": z["a"], "b": z["b"]}

    return value, transpose_jacobian, new_buffers


def auc_outer(
    problem: Problem,
    z: Point,
    alpha: torch.Tensor,
    buffers: Tree,
    p: torch.Tensor,
    batch: Batch,
    loss: str = "square",
    margin: float = 1.0,
) -> tuple[torch.Tensor, Tree]:
    """f(z, α; ζ): the AUC min-max loss of the model z_w with a = z_a, b = z_b (paper eq. 1),
    and the buffers after the forward pass."""
    logits, new_buffers = problem.logits(z["w"], buffers, batch["x"])
    s = torch.sigmoid(logits)
    p = problem.batch_p(p, batch["y"])
    if loss == "square":
        return auc_square_loss(s, batch["y"], z["a"], z["b"], alpha, p), new_buffers
    if loss == "aucm":
        return aucm_loss(s, batch["y"], z["a"], z["b"], alpha, p, margin), new_buffers
    raise ValueError(f"loss must be 'square' or 'aucm', got {loss!r}")


def compositional_auc_loss(
    problem: Problem,
    x: Point,
    alpha: torch.Tensor,
    buffers: Tree,
    p: torch.Tensor,
    batch: Batch,
    rho: float,
    loss: str = "square",
    margin: float = 1.0,
) -> torch.Tensor:
    """f(g(x; ξ), α; ζ) on one batch (ξ = ζ): the AUC loss after one CE gradient step of size ρ.

    Differentiable twice, so ``torch.func.grad`` of it is the (biased, one-batch)
    compositional gradient ∇g(x)ᵀ∇_g f(g(x), α) by double backward.
    """
    if rho <= 0:
        raise ValueError(f"rho (the inner cross-entropy step ρ) must be > 0, got {rho}")
    z, _ = inner_map(problem, x, buffers, batch, rho)
    return auc_outer(problem, z, alpha, buffers, p, batch, loss, margin)[0]

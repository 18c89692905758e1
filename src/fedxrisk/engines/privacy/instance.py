"""Instance-level DP-SGD in the local step: per-sample clipping and Gaussian noise (DP-SGD,
Abadi et al. 2016) for objectives that are a mean of per-sample terms given their auxiliary
variables — cross-entropy (``localsgdm``) and the AUC square / AUCM min-max losses given
a, b, α (``codaplus``, ``codasca``).

:func:`instance_private` returns a copy of the algorithm whose gradient is replaced by

    ĝ = (Σ_i clip_C(∇ℓ_i) + σC·z) / B,   z ~ N(0, I),

with the per-sample gradients ∇ℓ_i from ``torch.func.vmap`` over the batch and, for the AUC
losses, the gradient in (w, a, b, α) clipped jointly. The algorithm's own code is unchanged:
LocalSGDM's loss becomes a surrogate whose gradient is ĝ; CODA+/CODASCA's ``gradients``
returns ĝ, so everything built from gradients (CODASCA's control variates, α's step) is
built from ĝ. Local steps may not draw random numbers, so z comes from the engine's
per-client uniform stream (``batch["uniform"]``, float32, mapped through the normal
quantile at the cell centres: a Gaussian discretised to 2^24 levels and truncated at ±5.4σ).

Refused with one line: pairwise losses (FeDXL, Local Pair), compositional and conditional
objectives (LocalSCGDAM, FCSG family), CoDA and LocalSGDM_RL (class sums leave the client
in ``communicate``), the other algorithms (not wired: their gradients are computed in their
own local steps), ``pos_ratio_mode = "batch"`` (p is the batch's ratio: samples coupled),
and models with BatchNorm (the batch statistics couple samples).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch.func import grad, vmap

from fedxrisk.errors import ConfigError
from fedxrisk.tree import Tree, leaves, tmap

SUPPORTED = ("localsgdm", "codaplus", "codasca")
PAIRWISE = "its pairwise loss couples positives and negatives"
INNER_MEAN = "its inner function is a mean over samples, so one sample moves every term"
COUPLED = {  # why per-sample clipping does not bound a sample's influence
    "fedxl1": PAIRWISE + " of all clients",
    "fedxl2": PAIRWISE + " of all clients",
    "localpair": PAIRWISE + " of the client",
    "localscgdam": "compositional: " + INNER_MEAN,
    "local_scgd": "compositional/conditional: " + INNER_MEAN,
    "local_scgdm": "compositional/conditional: " + INNER_MEAN,
    "fcsg": "conditional: " + INNER_MEAN,
    "fcsg_m": "conditional: " + INNER_MEAN,
    "acc_fcsg_m": "conditional: " + INNER_MEAN,
    "coda": "its class sums of a sampled batch leave the client at stage ends, outside the local step",
    "localsgdm_rl": "its class gradient sums of a sampled batch leave the client every round, outside the local step",
}


def unsupported_instance_reason(algorithm: Any) -> str | None:
    """Why per-sample DP-SGD cannot cover ``algorithm``, or None when it can."""
    name = getattr(algorithm, "name", type(algorithm).__name__)
    if name in COUPLED:
        return f"{name} is not covered by per-sample clipping ({COUPLED[name]})"
    if name not in SUPPORTED:
        return f"{name} is not wired for per-sample clipping yet (wired: {', '.join(SUPPORTED)})"
    problem = algorithm.problem
    if problem.pos_ratio_mode == "batch":
        return f"{name} with pos_ratio_mode 'batch': p is the batch's positive ratio, which couples samples"
    _, buffers = problem.init_model()
    if any(v.is_floating_point() for v in buffers.values()):
        return (
            f"{name} with a BatchNorm model: batch statistics couple samples; use a model without BatchNorm"
        )
    return None


def check_instance_dp(algorithm: Any) -> None:
    """Raise :class:`ConfigError` (one line) when instance-level DP cannot cover ``algorithm``."""
    reason = unsupported_instance_reason(algorithm)
    if reason is not None:
        raise ConfigError(f"instance-level DP: {reason}")


def standard_normals(uniform: torch.Tensor) -> torch.Tensor:
    """float32 U[0, 1) draws (multiples of 2^-24) → N(0, 1) at their cells' centres (float64)."""
    return torch.special.ndtri(uniform.double() + 2.0**-25)


def privatize(per_sample: Tree, uniform: torch.Tensor, clip: float, noise_multiplier: float) -> Tree:
    """Per-sample gradients (leaves ``[B, ...]``) → (Σ_i clip_C(g_i) + σC·z) / B, clipped jointly
    over the leaves; z from ``uniform`` (``[≥ d]``, d = coordinates of one gradient)."""
    flat = list(leaves(per_sample))
    b = flat[0][1].shape[0]
    norms = torch.stack([torch.linalg.vector_norm(t.reshape(b, -1), dim=1) for _, t in flat]).norm(dim=0)
    scale = (clip / norms.clamp_min(1e-30)).clamp(max=1.0)
    z = standard_normals(uniform)
    out, offset = {}, 0
    for path, t in flat:
        n = t[0].numel()
        noise = z[offset : offset + n].reshape(t.shape[1:])
        offset += n
        total = torch.tensordot(scale.to(t.dtype), t, dims=1)
        out[path] = (total + (noise_multiplier * clip * noise).to(t.dtype)) / b
    return _rebuild(per_sample, out)


def _rebuild(tree: Tree, flat: dict[str, torch.Tensor], prefix: str = "") -> Tree:
    if isinstance(tree, dict):
        return {k: _rebuild(v, flat, f"{prefix}{k}.") for k, v in tree.items()}
    return flat[prefix[:-1]]


def _sample(batch: dict[str, torch.Tensor], keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in keys}


class _InstanceDPCrossEntropy:
    """LocalSGDM with DP-SGD: its loss is a surrogate whose gradient is the private gradient."""

    def _loss(self, w, buffers, batch):
        base = super()._loss  # type: ignore[misc]
        fixed = tmap(torch.detach, w)

        def one(wi, x, y):
            return base(wi, buffers, {"x": x.unsqueeze(0), "y": y.unsqueeze(0)})[0]

        per_sample = vmap(grad(one), in_dims=(None, 0, 0))(fixed, batch["x"], batch["y"])
        g = privatize(per_sample, batch["uniform"], self.dp_clip, self.dp_noise_multiplier)
        value, new_buffers = base(fixed, buffers, _sample(batch, ("x", "y")))
        linear = sum((wi * gi.detach()).sum() for (_, wi), (_, gi) in zip(leaves(w), leaves(g), strict=True))
        return value.detach() + linear - linear.detach(), new_buffers


class _InstanceDPAUC:
    """CODA+/CODASCA with DP-SGD: ``gradients`` returns the private gradient in (w, a, b, α)."""

    def gradients(self, state, batch):
        from fedxrisk.algorithms.coda import _primal

        v, alpha, buffers, p = _primal(state), state["alpha"], state["buffers"], state["p"]

        def one(vi, ai, x, y):
            return self._objective(vi, ai, buffers, p, {"x": x.unsqueeze(0), "y": y.unsqueeze(0)})[0]

        gv, galpha = vmap(grad(one, argnums=(0, 1)), in_dims=(None, None, 0, 0))(
            v, alpha, batch["x"], batch["y"]
        )
        g = privatize({"v": gv, "alpha": galpha}, batch["uniform"], self.dp_clip, self.dp_noise_multiplier)
        f, new_buffers = self._objective(v, alpha, buffers, p, _sample(batch, ("x", "y")))
        return g["v"], g["alpha"], f, new_buffers


def _coordinates(algorithm: Any) -> int:
    w, _ = algorithm.problem.init_model()
    d = sum(t.numel() for _, t in leaves(w))
    if algorithm.name != "localsgdm":
        d += 3 * math.prod(algorithm.problem.label_shape)  # a, b, α
    return d


def instance_private(algorithm: Any, clip: float, noise_multiplier: float) -> Any:
    """A copy of ``algorithm`` taking DP-SGD local steps (per-sample clipping to ``clip``, noise
    std ``noise_multiplier·clip`` on the sum); raises :class:`ConfigError` where it cannot."""
    check_instance_dp(algorithm)
    if not clip > 0 or math.isinf(clip) or not noise_multiplier >= 0 or math.isinf(noise_multiplier):
        raise ConfigError(
            f"instance-level DP needs clip > 0 and noise_multiplier ≥ 0, got {clip}, {noise_multiplier}"
        )
    base = type(algorithm)
    mixin = _InstanceDPCrossEntropy if algorithm.name == "localsgdm" else _InstanceDPAUC
    private = copy.copy(algorithm)
    private.__class__ = type(f"InstanceDP{base.__name__}", (mixin, base), {"__module__": __name__})
    private.dp_clip, private.dp_noise_multiplier = float(clip), float(noise_multiplier)
    private.uniforms_per_step = _coordinates(algorithm)
    return private

"""Instance-level DP-SGD (Abadi et al. 2016, Alg. 1) as a wrapper of an unchanged algorithm.

An algorithm that takes its gradient from ``Algorithm.gradient`` declares its objective as a
mean of per-sample terms (``sample_loss`` in the variables ``sample_params``: w for
cross-entropy; (w, a, b, α) for the AUC square / AUCM losses of CODA+, CODASCA, NPA).
:func:`instance_private` returns a copy whose ``gradient_estimator`` is :class:`DPSGD`:

    ĝ = (Σ_{i ∈ batch} clip_C(∇ℓ_i) + σC·z) / (q_k n_k),   z ~ N(0, I),

per-sample gradients by ``torch.func.vmap`` over the batch, clipped jointly over all of
``sample_params``, the fixed denominator q_k n_k (not the realised batch size). Everything the
algorithm builds from its gradient (CODASCA's control variates, α's step) is built from ĝ.

What the engine supplies (local steps may not draw random numbers): Poisson batches
(``data.sampler.PoissonSampler``: each record independently at rate q_k = B / n_k, padded to a
fixed capacity, ``batch["mask"]``, ``batch["denominator"]`` = q_k n_k) and ``batch["noise"]``,
float64 N(0, 1) from the run's secret :class:`~fedxrisk.engines.privacy.noise.NoiseSource`
(53-bit uniforms, summed Box–Muller normals), one sub-stream per (step, client) — never from
the seeded data streams, so nothing a run writes regenerates it.

Refused with one line (:func:`unsupported_instance_reason`), from what the algorithm declares:
``couples_samples`` (pairwise, compositional and conditional losses, class sums sent in
``communicate``), no declared ``sample_loss``, a p that is not public (``pos_ratio_mode``
``batch`` or ``local``), class-aware batches, models with BatchNorm (batch statistics
couple samples), and a computation the algorithm declares in ``touches_labels`` (outside
``sample_loss``, reading labels) without a label-free form (Ditto's personal step).

No label reaches a step except through ĝ: the wrapper sets ``label_free`` (CODA+, CODASCA, NPA
then scale their a, b, α steps by the curvature bounds from the public p, not by the batch's label
share), and the empty slots of a padded batch are zeros (:func:`masked_dummies`), not copies of a
record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.func import grad_and_value, vmap

from fedxrisk.algorithms.base import Algorithm, ClientInfo, with_hooks
from fedxrisk.data.sampler import unpad
from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.errors import ConfigError
from fedxrisk.tree import Tree, leaves, tmap

NOISE_STREAM = 1 << 21  # the noise source's sub-stream key of instance-level noise
ENGINE_KEYS = ("mask", "noise", "denominator", "uniform")  # batch entries that are not per sample


def unsupported_instance_reason(algorithm: Any) -> str | None:
    """Why per-sample DP-SGD cannot cover ``algorithm``, or None when it can (read from what the
    algorithm and its problem declare)."""
    name = getattr(algorithm, "name", type(algorithm).__name__)
    if getattr(algorithm, "couples_samples", None):
        return f"{name} is not covered by per-sample clipping ({algorithm.couples_samples})"
    if not algorithm.declares_sample_loss():
        return f"{name} declares no per-sample loss (sample_loss) for DP-SGD to clip"
    for computation, label_free in getattr(algorithm, "touches_labels", {}).items():
        if label_free is None:
            return (
                f"{name}'s {computation} reads the batch's labels outside DP-SGD's clipped, noised "
                "gradient and has no label-free form"
            )
    if getattr(algorithm, "positives_per_batch", 0):
        return (
            "class-aware batches (positives_per_batch > 0) put each positive in far more steps than "
            "the sampling rate the accountant assumes; use plain (Poisson) batches"
        )
    problem = algorithm.problem
    if algorithm.uses_pos_ratio and problem.pos_ratio_mode in ("batch", "local"):
        return (
            f"{name} with pos_ratio_mode {problem.pos_ratio_mode!r}: the AUC loss's p is then computed "
            "from the training records (one record moves every sample's term); use 'global' with a "
            "public p (privacy.pos_ratio)"
        )
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


def privatize(
    per_sample: Tree,
    mask: torch.Tensor,
    noise: torch.Tensor,
    denominator: torch.Tensor | float,
    clip: float,
    noise_multiplier: float,
) -> Tree:
    """Per-sample gradients (leaves ``[S, ...]``, S slots of which ``mask`` marks the records) →
    (Σ_i mask_i·clip_C(g_i) + σC·z) / denominator, clipped jointly over the leaves; z = ``noise``
    (float64, ``[≥ d]``, d = coordinates of one gradient), added in float64."""
    flat = list(leaves(per_sample))
    s = flat[0][1].shape[0]
    norms = torch.stack([torch.linalg.vector_norm(t.reshape(s, -1), dim=1) for _, t in flat]).norm(dim=0)
    scale = (clip / norms.clamp_min(1e-30)).clamp(max=1.0) * mask.to(norms.dtype)
    out, offset = {}, 0
    for path, t in flat:
        n = t[0].numel()
        z = noise[offset : offset + n].reshape(t.shape[1:])
        offset += n
        total = torch.tensordot(scale.to(t.dtype), t, dims=1).double()
        out[path] = ((total + noise_multiplier * clip * z.double()) / denominator).to(t.dtype)
    return _rebuild(per_sample, out)


def _rebuild(tree: Tree, flat: dict[str, torch.Tensor], prefix: str = "") -> Tree:
    if isinstance(tree, dict):
        return {k: _rebuild(v, flat, f"{prefix}{k}.") for k, v in tree.items()}
    return flat[prefix[:-1]]


class DPSGD:
    """The DP-SGD gradient estimator (``Algorithm.gradient_estimator``): per-sample gradients of
    the declared loss, clipped to ``clip``, summed over the batch's records, Gaussian noise of
    std ``noise_multiplier·clip`` on the sum, divided by the fixed q_k n_k."""

    def __init__(self, clip: float, noise_multiplier: float):
        self.clip, self.noise_multiplier = float(clip), float(noise_multiplier)

    def __call__(
        self, loss: Callable[..., tuple[torch.Tensor, Tree]], params: Tree, batch: dict[str, torch.Tensor]
    ) -> tuple[Tree, tuple[torch.Tensor, Tree]]:
        samples = {k: v for k, v in batch.items() if k not in ENGINE_KEYS}

        def one(p: Tree, sample: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Tree]:
            return loss(p, tmap(lambda v: v.unsqueeze(0), sample))

        grads, (values, buffers) = vmap(grad_and_value(one, has_aux=True), in_dims=(None, 0))(params, samples)
        mask, denominator = batch["mask"], batch["denominator"]
        g = privatize(grads, mask, batch["noise"], denominator, self.clip, self.noise_multiplier)
        value = (values * mask).sum() / denominator.to(values.dtype)
        return g, (value, tmap(lambda b: b[0], buffers))  # buffers: no BatchNorm, so unchanged


def sample_coordinates(algorithm: Algorithm) -> int:
    """d: the coordinates of one per-sample gradient (all of ``sample_params``)."""
    state = algorithm.init(ClientInfo(0, 1, 0.5, 1))
    return sum(t.numel() for _, t in leaves(algorithm.sample_params(state)))


def instance_private(
    algorithm: Algorithm, clip: float, noise_multiplier: float, pos_ratio: float | None = None
) -> Algorithm:
    """A copy of ``algorithm`` taking DP-SGD local steps (per-sample clipping to ``clip``, noise
    std ``noise_multiplier·clip`` on the sum, Poisson batches); ``pos_ratio``: the public p its
    AUC loss uses (required when ``uses_pos_ratio``). Raises :class:`ConfigError` where it cannot."""
    check_instance_dp(algorithm)
    if not clip > 0 or math.isinf(clip) or not noise_multiplier >= 0 or math.isinf(noise_multiplier):
        raise ConfigError(
            f"instance-level DP needs clip > 0 and noise_multiplier ≥ 0, got {clip}, {noise_multiplier}"
        )
    problem = algorithm.problem
    if algorithm.uses_pos_ratio and pos_ratio is None:
        raise ConfigError(
            f"instance-level DP: {algorithm.name}'s AUC loss needs a public p (pos_ratio), not one counted "
            "from the records"
        )
    if pos_ratio is not None:
        labels = problem.num_labels
        problem = replace(problem, pos_ratio=float(pos_ratio) if labels == 1 else [float(pos_ratio)] * labels)
    public = with_hooks(algorithm, problem=problem)
    return with_hooks(
        public,
        gradient_estimator=DPSGD(clip, noise_multiplier),
        poisson_batches=True,
        noise_per_step=sample_coordinates(public),
        label_free=True,
    )


def poisson_batches(algorithm: Algorithm, source: Any, shard_sizes: Sequence[int]) -> tuple | None:
    """``make_samplers``'s ``poisson`` for an engine running ``algorithm``: (noise source — a secret
    one unless ``source`` is given —, every client's shard size) under DP-SGD, else None."""
    if not algorithm.poisson_batches:
        return None
    return (source if source is not None else NoiseSource.secret(), list(shard_sizes))


def private_batch(sim: Any, positions: np.ndarray, step: int, rows: Any = None) -> dict[str, torch.Tensor]:
    """The batch of one DP-SGD step of ``sim``'s clients (a ``Simulation``; ``rows``: the round's
    participants, None: all): the records of the padded Poisson ``positions``, ``mask``,
    ``denominator`` q_k n_k and ``noise`` for ``step``. Every engine builds its DP batches here."""
    positions, mask = unpad(positions)
    batch = masked_dummies(sim.local_data.batch(positions, sim.device, rows), torch.from_numpy(mask))
    batch["mask"] = torch.from_numpy(mask).to(sim.device)
    expected, clients = sim.sampler.expected, sim.clients
    if rows is not None:
        picked = rows.cpu().numpy()
        expected, clients = expected[picked], [clients[i] for i in picked]
    batch["denominator"] = torch.from_numpy(expected).to(sim.device)
    noise = step_noise(sim.sampler.source, step, clients, sim.algorithm.noise_per_step)
    return dict(batch, noise=noise.to(sim.device))


def masked_dummies(batch: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """``batch`` (leaves ``[K, S, ...]``) with every entry of an empty slot (``mask`` 0) set to
    zero: padding is a dummy no record's value reaches (gathered at position 0, then overwritten),
    so nothing a step computes, masked or not, can read the record that filled it."""
    keep = mask.to(torch.bool)

    def blank(v: torch.Tensor) -> torch.Tensor:
        rows = keep.to(v.device).reshape(*keep.shape, *[1] * (v.dim() - keep.dim()))
        return torch.where(rows, v, torch.zeros((), dtype=v.dtype, device=v.device))

    return {k: blank(v) for k, v in batch.items()}


def step_noise(source: Any, step: int, clients: Sequence[int], count: int) -> torch.Tensor:
    """``[K, count]`` float64 N(0, 1) for one local step of ``clients``, from ``source`` (a
    ``NoiseSource``), one sub-stream per (step, client): equal on every engine and rank."""
    return torch.stack(
        [torch.from_numpy(source.spawn(NOISE_STREAM, step, k).standard_normal(count)) for k in clients]
    )

"""Min-max AUC surrogates (ALGORITHMS.md §1.1, §1.2), and the safeguards of their auxiliary variables.

Scores ``s`` are in [0, 1] (a sigmoid of the model's logit), labels ``y`` in
{0, 1}. Every term is a mean over the *whole* mini-batch, not per class, as
in Ying et al. (2016) and the FDAM paper (eq. 2).

Multi-label: ``s`` and ``y`` of shape ``[B, L]`` with a, b, α, p of shape
``[L]`` give one loss per label (broadcast); the result is their mean over
labels. One label (``s`` of shape ``[B]``) is the scalar case unchanged.

**Why a, b and α need safeguards (issue 33).** F is quadratic in a, b and α with curvatures
known exactly on each batch (:func:`auxiliary_curvatures`): ∂²F/∂a² = 2(1 − p)·P/B. The papers'
analyses assume η ≤ 1/(4ℓ) (FDAM Lemma 1) and scores in [0, 1], so the saddle point has a, b ∈
[0, 1] (class-mean scores) and α ∈ [−1, 1]. With sigmoid scores the network's gradients carry a
factor s(1 − s) and need large steps (CODA+'s default η = 3), but a's does not: on a client whose
batches are mostly positive (label skew, or heart's Switzerland at 94 % positives)
η·ℓ_a ≈ 3·2·0.9 > 2, so |1 − η·ℓ_a| > 1 and a oscillates with growing amplitude; CODASCA's
control variates carry it to every client and the run is NaN within ~5 rounds. The remedy keeps
the paper's update and step wherever it is stable: the gradients of a, b, α are scaled by
min(1, 1/(η·ℓ)) (:func:`auxiliary_scales`; identical to the paper where η ≤ 1/ℓ, the block's
exact minimizing step otherwise), and a, b, α are projected onto [0, 1], [0, 1] and
:func:`alpha_bounds` (a projection onto a set holding the saddle point leaves it unchanged).
Under instance-level DP the batch's label share is private: ℓ is then :func:`curvature_bounds`,
its maximum over every batch, from the public p (docs/privacy.md).
"""

from __future__ import annotations

import torch


def auc_square_loss(
    s: torch.Tensor,
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    p: torch.Tensor | float,
) -> torch.Tensor:
    """AUC square loss in min-max form, FDAM paper eq. (2); α unconstrained.

    F = (1-p)(s-a)²·1[y=1] + p(s-b)²·1[y=0]
        + 2(1+α)(p·s·1[y=0] - (1-p)·s·1[y=1]) - p(1-p)α²
    """
    pos, neg = y, 1.0 - y
    f = (
        (1 - p) * (s - a) ** 2 * pos
        + p * (s - b) ** 2 * neg
        + 2 * (1 + alpha) * (p * s * neg - (1 - p) * s * pos)
    )
    return (f.mean(0) - p * (1 - p) * alpha**2).mean()


def aucm_loss(
    s: torch.Tensor,
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: torch.Tensor,
    p: torch.Tensor | float,
    margin: float = 1.0,
) -> torch.Tensor:
    """AUC-margin (AUCM) min-max loss of Yuan et al. (2021), ALGORITHMS.md §1.2; α ≥ 0.

    F = (1-p)(s-a)²·1[y=1] + p(s-b)²·1[y=0]
        + 2α(p(1-p)m + p·s·1[y=0] - (1-p)·s·1[y=1]) - p(1-p)α²
    """
    pos, neg = y, 1.0 - y
    f = (1 - p) * (s - a) ** 2 * pos + p * (s - b) ** 2 * neg + 2 * alpha * (p * s * neg - (1 - p) * s * pos)
    return (f.mean(0) + 2 * alpha * p * (1 - p) * margin - p * (1 - p) * alpha**2).mean()


def aucm_alpha_direction(
    a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, margin: float
) -> torch.Tensor:
    """The authors' closed-form α ascent direction 2(m + b - a) - 2α (§1.2 **code**)."""
    return 2 * (margin + b - a) - 2 * alpha


def auxiliary_curvatures(
    y: torch.Tensor, p: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """∂²F/∂a², ∂²F/∂b², −∂²F/∂α² of eq. (2) (and of AUCM) on a batch with labels ``y``:
    2(1−p)·P/B, 2p·N/B and 2p(1−p), per label. They are the exact smoothness constants ℓ of
    the auxiliary blocks; a client whose batches are mostly positive has a's curvature near 2(1−p)."""
    share = y.float().mean(0)
    p = torch.as_tensor(p, dtype=share.dtype)
    return 2 * (1 - p) * share, 2 * p * (1 - share), 2 * p * (1 - p) + 0 * share


def curvature_bounds(p: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The largest ℓ_a, ℓ_b, ℓ_α of :func:`auxiliary_curvatures` over every batch (positive share
    in [0, 1]): 2(1−p), 2p, 2p(1−p). Label-free: instance-level DP's stabilizer uses them, so
    the step ≤ 1/ℓ holds on any batch without reading a label (p public)."""
    p = torch.as_tensor(p)
    return 2 * (1 - p), 2 * p, 2 * p * (1 - p)


def stable_scale(lr: float, curvature: torch.Tensor) -> torch.Tensor:
    """min(1, 1/(η·ℓ)): scaling a block's gradient by it makes the step η·scale ≤ 1/ℓ, so a step on
    a quadratic of curvature ℓ contracts (|1 − η·scale·ℓ| < 1) instead of overshooting; 1 where
    the paper's condition η ≤ 1/ℓ already holds."""
    return 1.0 / torch.clamp(lr * curvature, min=1.0)


def auxiliary_scales(
    y: torch.Tensor | None,
    p: torch.Tensor | float,
    lr: float,
    extra: float = 0.0,
    closed_form: bool = False,
) -> dict[str, torch.Tensor]:
    """:func:`stable_scale` of a, b and α on this batch (labels ``y``; None: the label-free
    :func:`curvature_bounds`); ``extra``: curvature added to a's and b's (prox γ, weight decay);
    ``closed_form``: α's step is AUCM's 2(m + b − a) − 2α (curvature 2)."""
    l_a, l_b, l_alpha = auxiliary_curvatures(y, p) if y is not None else curvature_bounds(p)
    if closed_form:
        l_alpha = torch.full_like(l_alpha, 2.0)
    return {
        "a": stable_scale(lr, l_a + extra),
        "b": stable_scale(lr, l_b + extra),
        "alpha": stable_scale(lr, l_alpha),
    }


def alpha_bounds(loss: str, margin: float = 1.0) -> tuple[float, float]:
    """The interval holding α's optimum when scores lie in [0, 1]: α* = E[s|y=0] − E[s|y=1] ∈ [−1, 1]
    for the square loss, α* = max(0, m + E[s|y=0] − E[s|y=1]) ∈ [0, 1 + m] for AUCM."""
    return (-1.0, 1.0) if loss == "square" else (0.0, 1.0 + margin)

"""Min-max AUC surrogates (ALGORITHMS.md §1.1, §1.2).

Scores ``s`` are in [0, 1] (a sigmoid of the model's logit), labels ``y`` in
{0, 1}. Every term is a mean over the *whole* mini-batch, not per class, as
in Ying et al. (2016) and the FDAM paper (eq. 2).

Multi-label: ``s`` and ``y`` of shape ``[B, L]`` with a, b, α, p of shape
``[L]`` give one loss per label (broadcast); the result is their mean over
labels. One label (``s`` of shape ``[B]``) is the scalar case unchanged.
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

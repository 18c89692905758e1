"""Pairwise AUROC surrogates (ALGORITHMS.md §1.4) and one-way pAUC in KL-DRO form (§1.5).

A pairwise surrogate ℓ(s_i, s_j) scores a positive i against a negative j
through the difference d = s_i − s_j:

- ``squared_hinge`` (default): (m − d)_+², with m = 1 on sigmoid scores;
- ``square``: (m − d)²;
- ``logistic``: log(1 + exp(−d)) (the margin is not used).

The squared losses are meant for scores in [0, 1] (a sigmoid of the logit):
their margin m = 1 is the width of that range. The logistic surrogate accepts
any finite score. The KL-DRO objective exponentiates ℓ/λ, so it always needs
bounded scores in [0, 1] (otherwise exp overflows).

Two layers:

- :func:`pairwise_surrogate` is the raw ``[P, N]`` matrix of ℓ, pure tensor
  code with no value checks, safe inside ``torch.func.vmap`` (algorithms use it);
- :func:`pairwise_auc_loss` and :func:`pauc_kl_loss` are the objectives on plain
  tensors. They validate their scores with :func:`check_scores` (a value check,
  which cannot run under ``vmap``; pass ``validate=False`` there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Surrogate:
    """A pairwise surrogate as a function of d = s_pos − s_neg and the margin."""

    fn: Callable[[torch.Tensor, float], torch.Tensor]
    bounds: tuple[float, float] | None  # the valid score range; None: any finite score


SURROGATES: dict[str, Surrogate] = {
    "squared_hinge": Surrogate(lambda d, m: F.relu(m - d) ** 2, (0.0, 1.0)),
    "square": Surrogate(lambda d, m: (m - d) ** 2, (0.0, 1.0)),
    "logistic": Surrogate(lambda d, m: F.softplus(-d), None),
}
BOUNDED = (0.0, 1.0)  # the range KL-DRO needs whatever the surrogate


def check_surrogate(name: str) -> Surrogate:
    if name not in SURROGATES:
        raise ValueError(f"unknown pairwise surrogate {name!r}; choose one of {sorted(SURROGATES)}")
    return SURROGATES[name]


def check_lambda(lam: float) -> None:
    if not lam > 0:
        raise ValueError(f"the KL-DRO temperature lam (λ) must be > 0, got {lam}")


def check_scores(scores: torch.Tensor, bounds: tuple[float, float] | None, what: str = "scores") -> None:
    """Raise ``ValueError`` if ``scores`` hold NaN/inf or leave ``bounds`` (not under vmap)."""
    if scores.numel() == 0:
        return
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"{what} contain NaN or inf")
    if bounds is not None:
        lo, hi = float(scores.detach().min()), float(scores.detach().max())
        if lo < bounds[0] or hi > bounds[1]:
            raise ValueError(
                f"{what} must lie in [{bounds[0]}, {bounds[1]}] (apply a sigmoid to the logits); "
                f"found values in [{lo:.4g}, {hi:.4g}]"
            )


def pairwise_surrogate(
    s_pos: torch.Tensor, s_neg: torch.Tensor, surrogate: str = "squared_hinge", margin: float = 1.0
) -> torch.Tensor:
    """ℓ(s_pos[i], s_neg[j]) for every pair: shape ``[len(s_pos), len(s_neg)]``. No value checks."""
    return SURROGATES[surrogate].fn(s_pos[:, None] - s_neg[None, :], margin)


def _validate(s_pos, s_neg, surrogate: str, bounds) -> None:
    check_surrogate(surrogate)
    if s_pos.dim() != 1 or s_neg.dim() != 1:
        raise ValueError(f"scores must be 1-D, got shapes {tuple(s_pos.shape)} and {tuple(s_neg.shape)}")
    if len(s_pos) == 0 or len(s_neg) == 0:
        raise ValueError(f"need ≥ 1 positive and ≥ 1 negative score, got {len(s_pos)} and {len(s_neg)}")
    check_scores(s_pos, bounds, "positive scores")
    check_scores(s_neg, bounds, "negative scores")


def pairwise_auc_loss(
    s_pos: torch.Tensor,
    s_neg: torch.Tensor,
    surrogate: str = "squared_hinge",
    margin: float = 1.0,
    validate: bool = True,
) -> torch.Tensor:
    """Pairwise AUROC surrogate: mean over all (positive, negative) pairs of ℓ(s_i, s_j)."""
    if validate:
        _validate(s_pos, s_neg, surrogate, SURROGATES[surrogate].bounds if surrogate in SURROGATES else None)
    return pairwise_surrogate(s_pos, s_neg, surrogate, margin).mean()


def pauc_kl_loss(
    s_pos: torch.Tensor,
    s_neg: torch.Tensor,
    lam: float = 1.0,
    surrogate: str = "squared_hinge",
    margin: float = 1.0,
    validate: bool = True,
) -> torch.Tensor:
    """One-way partial AUROC, KL-DRO form (§1.5):

        F = (1/n+) Σ_i λ · log( (1/n−) Σ_j exp(ℓ(s_i, s_j) / λ) )

    λ → ∞ recovers the pairwise AUROC loss; small λ focuses on the hardest
    negatives of each positive (low false-positive rates). Scores in [0, 1].
    """
    check_lambda(lam)
    if validate:
        _validate(s_pos, s_neg, surrogate, BOUNDED)
    inner = pairwise_surrogate(s_pos, s_neg, surrogate, margin) / lam
    return (lam * (torch.logsumexp(inner, dim=1) - torch.log(torch.tensor(float(len(s_neg)))))).mean()

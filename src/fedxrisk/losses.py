"""The library's objectives as ``nn.Module`` losses for one's own training loop (LibAUC's style).

``loss = AUCMLoss(imratio=0.1); value = loss(torch.sigmoid(model(x)).squeeze(-1), y)``. Each
module owns its auxiliary variables and wraps the function the federated algorithms use:

- :class:`AUCSquareLoss` — CODA+'s AUC square loss, FDAM paper eq. (2): ``a``, ``b`` (primal)
  and ``α`` (dual, unconstrained) as parameters; :func:`fedxrisk.objectives.auc_square_loss`.
- :class:`AUCMLoss` — the AUC-margin loss of Yuan et al. (2021), α ≥ 0;
  :func:`fedxrisk.objectives.aucm_loss`.
- :class:`PartialAUCLoss` — one-way pAUC in KL-DRO form (FeDXL2's objective, ALGORITHMS.md §1.5):
  the mini-batch value :func:`fedxrisk.objectives.pairwise.pauc_kl_loss`, or with ``data_len`` the
  estimator with a moving average u per positive (Local Pair's, ``objective="pauc"``).
- :class:`APLoss` — the average-precision surrogate of the FCSG paper (§5.3), the biased
  mini-batch estimator of :class:`fedxrisk.objectives.conditional.APSurrogate` (LibAUC's online form).

Scores are in [0, 1] (apply a sigmoid to the logits); labels in {0, 1}. The min-max losses
are minimized in (model, a, b) and maximized in α: :class:`fedxrisk.optim.PESG` knows which is which
from :attr:`AUCLoss.primal` and :attr:`AUCLoss.dual`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedxrisk.algorithms.coda import ALPHA_MAX
from fedxrisk.algorithms.pairwise_base import log_u_in_order
from fedxrisk.objectives import auc_square_loss, aucm_alpha_direction, aucm_loss
from fedxrisk.objectives.conditional import APSurrogate
from fedxrisk.objectives.pairwise import pairwise_surrogate, pauc_kl_loss

__all__ = ["APLoss", "AUCLoss", "AUCMLoss", "AUCSquareLoss", "PartialAUCLoss"]


def _flat(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, 1]`` scores or labels (LibAUC's shape) as ``[B]``; one clear error on a mismatch."""
    if scores.dim() == 2 and scores.shape[1] == 1:
        scores = scores[:, 0]
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if scores.shape != labels.shape:
        raise ValueError(f"scores of shape {tuple(scores.shape)} and labels {tuple(labels.shape)} differ")
    return scores, labels.to(scores.dtype)


class AUCLoss(nn.Module):
    """Base of the min-max AUC losses: a, b, α (zeros, one per label) and the positive ratio p.

    ``imratio``: the p of the loss (LibAUC's name); None: each mini-batch's own positive share
    (LibAUC's ``auto``; under :class:`fedxrisk.samplers.DualSampler` that is P/B).
    """

    def __init__(self, imratio: float | None = None, num_labels: int = 1):
        super().__init__()
        if imratio is not None and not 0 < imratio < 1:
            raise ValueError(f"imratio (the positive ratio p) must lie in (0, 1), got {imratio}")
        shape = () if num_labels == 1 else (num_labels,)
        self.imratio = imratio
        self.a = nn.Parameter(torch.zeros(shape))
        self.b = nn.Parameter(torch.zeros(shape))
        self.alpha = nn.Parameter(torch.zeros(shape))

    @property
    def primal(self) -> list[nn.Parameter]:
        """The variables minimized with the model: a, b."""
        return [self.a, self.b]

    @property
    def dual(self) -> list[nn.Parameter]:
        """The variable maximized: α."""
        return [self.alpha]

    def p(self, labels: torch.Tensor) -> torch.Tensor | float:
        return self.imratio if self.imratio is not None else labels.mean(0)

    def project_alpha(self, alpha: torch.Tensor) -> torch.Tensor:
        """α's feasible set (free for the square loss)."""
        return alpha


class AUCSquareLoss(AUCLoss):
    """AUC square loss in min-max form (FDAM paper eq. 2), CODA+/CODASCA's default objective."""

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s, y = _flat(scores, labels)
        return auc_square_loss(s, y, self.a, self.b, self.alpha, self.p(y))


class AUCMLoss(AUCLoss):
    """AUC-margin min-max loss (Yuan et al. 2021; ALGORITHMS.md §1.2) with margin m; α ∈ [0, 999]."""

    def __init__(self, margin: float = 1.0, imratio: float | None = None, num_labels: int = 1):
        super().__init__(imratio, num_labels)
        if margin < 0:
            raise ValueError(f"margin must be ≥ 0, got {margin}")
        self.margin = margin

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s, y = _flat(scores, labels)
        return aucm_loss(s, y, self.a, self.b, self.alpha, self.p(y), self.margin)

    def project_alpha(self, alpha: torch.Tensor) -> torch.Tensor:
        return alpha.clamp(0.0, ALPHA_MAX)

    def alpha_direction(self, a: torch.Tensor | None = None, b: torch.Tensor | None = None) -> torch.Tensor:
        """The closed-form ascent direction 2(m + b − a) − 2α (the authors' code, PESG's α step),
        at this loss's a, b or at given ones (after the primal step, ``dual_order="sequential"``)."""
        a = self.a.detach() if a is None else a
        b = self.b.detach() if b is None else b
        return aucm_alpha_direction(a, b, self.alpha.detach(), self.margin)


class PartialAUCLoss(nn.Module):
    """One-way pAUC, KL-DRO form: mean over positives of λ·log mean_j exp(ℓ(s_i, s_j)/λ) (§1.5).

    Small λ focuses on the hardest negatives (low false-positive rates); λ → ∞ is the pairwise
    AUROC loss. ``surrogate``: ``squared_hinge`` (default), ``square`` or ``logistic``.

    Without ``data_len``: the mini-batch value :func:`~fedxrisk.objectives.pairwise.pauc_kl_loss`.
    With ``data_len`` (the size of the data set; call ``loss(scores, labels, index)`` with each
    sample's position): FeDXL2's / Local Pair's estimator, which keeps u_i ≈ mean_j exp(ℓ_ij/λ) per
    positive in the buffer ``log_u`` (u starts at 1), moves it by u ← (1 − γ)u + γ·(batch mean) at
    every call, and weighs each pair's gradient by exp(ℓ_ij/λ)/u_i; the value returned is the
    objective's estimate λ·mean_i log u_i, its gradient that of the estimator.
    """

    def __init__(
        self,
        lam: float = 1.0,
        surrogate: str = "squared_hinge",
        margin: float = 1.0,
        data_len: int | None = None,
        gamma: float = 0.1,
    ):
        super().__init__()
        self.lam, self.surrogate, self.margin, self.gamma = lam, surrogate, margin, gamma
        pauc_kl_loss(torch.ones(1), torch.zeros(1), lam, surrogate, margin)  # checks λ and the name now
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma (u's moving-average rate) must lie in (0, 1], got {gamma}")
        self.register_buffer("log_u", torch.zeros(data_len) if data_len else None)

    def forward(
        self, scores: torch.Tensor, labels: torch.Tensor, index: torch.Tensor | None = None
    ) -> torch.Tensor:
        s, y = _flat(scores, labels)
        if self.log_u is None:
            return pauc_kl_loss(s[y == 1], s[y == 0], self.lam, self.surrogate, self.margin)
        if index is None:
            raise ValueError(
                "PartialAUCLoss(data_len=...) needs each sample's index: loss(scores, labels, index)"
            )
        pos, neg, idx = s[y == 1], s[y == 0], torch.as_tensor(index).reshape(-1)[y == 1]
        if not len(pos) or not len(neg):
            return s.sum() * 0.0  # no pair in this batch: no step
        z = pairwise_surrogate(pos, neg, self.surrogate, self.margin) / self.lam
        log_inner = torch.logsumexp(z.detach(), 1) - math.log(len(neg))
        log_u = log_u_in_order(self.log_u[idx], log_inner, idx, torch.ones_like(pos), self.gamma)
        with torch.no_grad():
            self.log_u[idx] = log_u
        weighted = self.lam * (torch.exp(z.detach() - log_u[:, None]) * z).sum(1).mean() / len(neg)
        estimate = self.lam * log_u.mean()
        return weighted - weighted.detach() + estimate  # the estimator's gradient, the objective's value


class APLoss(nn.Module):
    """Average-precision surrogate (FCSG paper §5.3), mini-batch form: each positive of the batch is
    an outer sample, the whole batch its inner samples; ``-mean_i u_i⁺ / u_i`` with squared-hinge
    pairs of margin ``margin``. The value equals the FCSG algorithms' objective on the same batch."""

    def __init__(self, margin: float = 0.6, eps: float = 1e-8):
        super().__init__()
        self.surrogate = APSurrogate(margin, eps)

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s, y = _flat(scores, labels)
        n = len(s)
        u = self.surrogate.pair_terms(s, s.unsqueeze(0).expand(n, n), y.unsqueeze(0).expand(n, n)).mean(1)
        values = self.surrogate.outer(None, u, None)  # type: ignore[arg-type]  (outer reads only u)
        return (values * y).sum() / y.sum().clamp_min(1e-12)

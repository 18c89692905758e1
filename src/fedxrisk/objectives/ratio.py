"""Ratio loss (Wang et al., AAAI 2021; ALGORITHMS.md §1.7), for a single-logit binary model.

Cross-entropy with per-class weights α + β·Ra_c (α = 1, β = 0.1). Ra is
estimated from the global model on a class-balanced auxiliary set: for each
class c take the gradient ΔW_c of the last layer's weight on class-c samples;

    Ra_c = | mean over row c of (C − 1)·ΔW_c / (Σ_c' ΔW_c' − ΔW_c) |

Single-logit derivation (C = 2): a two-logit softmax head with z_1 − z_0 = ℓ
is our one-logit model. On class-c samples the gradient of row 1 is
(σ(ℓ) − 1[c = 1])·φ = the BCE gradient of the one-logit weight, and row 0's is
its negative. So with g_1 (g_0) the BCE gradient of the last layer's weight on
positive (negative) samples: Ra_1 = |mean_j g_1[j] / g_0[j]| and
Ra_0 = |mean_j g_0[j] / g_1[j]|. Entries whose denominator is below 1e-3 of
the row's largest (dead or nearly dead units, whose ratios would dominate the
mean) are left out of it (our choice; the paper does not say).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

RATIO_EPS = 1e-3  # entries with |denominator| ≤ RATIO_EPS·max|denominator| are left out


def ratio_loss(
    logits: torch.Tensor, y: torch.Tensor, ra: torch.Tensor, alpha: float = 1.0, beta: float = 0.1
) -> torch.Tensor:
    """Mean BCE with weight α + β·Ra_{y_i} per sample; ``ra = [Ra_0, Ra_1]`` (negatives, positives)."""
    weight = alpha + beta * (ra[1] * y + ra[0] * (1 - y))
    return F.binary_cross_entropy_with_logits(logits, y, weight=weight)


def _mean_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    valid = den.abs() > RATIO_EPS * den.abs().max().clamp_min(torch.finfo(den.dtype).tiny)
    ratios = torch.where(valid, num / torch.where(valid, den, torch.ones_like(den)), torch.zeros_like(num))
    return (ratios.sum() / valid.sum().clamp_min(1)).abs()


def gradient_ratios(g_neg: torch.Tensor, g_pos: torch.Tensor) -> torch.Tensor:
    """``[Ra_0, Ra_1]`` from the per-class mean last-layer gradients (C = 2, so C − 1 = 1)."""
    return torch.stack([_mean_ratio(g_neg, g_pos), _mean_ratio(g_pos, g_neg)])

"""Binary cross-entropy on logits (the FedAvg baselines' loss)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bce_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of logits against labels in {0, 1}."""
    return F.binary_cross_entropy_with_logits(logits, y)

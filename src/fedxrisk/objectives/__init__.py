"""Objectives: functions of scores, labels and dual/auxiliary variables."""

from fedxrisk.objectives.auc import (
    alpha_bounds,
    auc_square_loss,
    aucm_alpha_direction,
    aucm_loss,
    auxiliary_curvatures,
    auxiliary_scales,
    curvature_bounds,
    stable_scale,
)
from fedxrisk.objectives.ce import bce_loss

AUC_LOSSES = {"square": auc_square_loss, "aucm": aucm_loss}

__all__ = [
    "AUC_LOSSES",
    "alpha_bounds",
    "auc_square_loss",
    "aucm_alpha_direction",
    "aucm_loss",
    "auxiliary_curvatures",
    "auxiliary_scales",
    "bce_loss",
    "curvature_bounds",
    "stable_scale",
]

"""Objectives: functions of scores, labels and dual/auxiliary variables."""

from fedxrisk.objectives.auc import auc_square_loss, aucm_alpha_direction, aucm_loss
from fedxrisk.objectives.ce import bce_loss

AUC_LOSSES = {"square": auc_square_loss, "aucm": aucm_loss}

__all__ = ["AUC_LOSSES", "auc_square_loss", "aucm_alpha_direction", "aucm_loss", "bce_loss"]

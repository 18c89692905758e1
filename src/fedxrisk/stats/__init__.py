"""Uncertainty of ranking metrics: DeLong's AUROC variance and stratified bootstrap intervals."""

from fedxrisk.stats.bootstrap import bootstrap_intervals, weighted_ap, weighted_partial_auroc
from fedxrisk.stats.delong import delong, midranks, structural_components, wald_interval

__all__ = [
    "bootstrap_intervals",
    "delong",
    "midranks",
    "structural_components",
    "wald_interval",
    "weighted_ap",
    "weighted_partial_auroc",
]

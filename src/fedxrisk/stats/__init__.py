"""Uncertainty of ranking metrics: DeLong's AUROC variance and paired test, stratified bootstrap
intervals and paired bootstrap differences, and metrics from summed per-class score histograms."""

from fedxrisk.stats.bootstrap import (
    PairedBootstrap,
    bootstrap_intervals,
    paired_bootstrap,
    percentile_interval,
    weighted_ap,
    weighted_partial_auroc,
)
from fedxrisk.stats.compare import compare_models
from fedxrisk.stats.delong import (
    PairedDeLong,
    delong,
    delong_paired,
    midranks,
    structural_components,
    wald_interval,
)
from fedxrisk.stats.histogram import (
    histogram_ap,
    histogram_auroc,
    histogram_bounds,
    histogram_pauc,
    logit_edges,
    score_histogram,
)

__all__ = [
    "PairedBootstrap",
    "PairedDeLong",
    "bootstrap_intervals",
    "compare_models",
    "delong",
    "delong_paired",
    "histogram_ap",
    "histogram_auroc",
    "histogram_bounds",
    "histogram_pauc",
    "logit_edges",
    "midranks",
    "paired_bootstrap",
    "percentile_interval",
    "score_histogram",
    "structural_components",
    "wald_interval",
    "weighted_ap",
    "weighted_partial_auroc",
]

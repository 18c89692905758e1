"""One call for a study table: two models on the same test set, AUROC by DeLong, AP and pAUC by bootstrap."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fedxrisk.stats.bootstrap import paired_bootstrap, weighted_ap, weighted_partial_auroc
from fedxrisk.stats.delong import delong_paired


def compare_models(
    y: np.ndarray,
    scores1: np.ndarray,
    scores2: np.ndarray,
    resamples: int = 2000,
    seed: int | Sequence[int] = 0,
    max_fpr: float = 0.3,
    level: float = 0.95,
) -> dict[str, dict[str, float]]:
    """Model 1 minus model 2: ``{"auroc": …, "ap": …, "pauc": …}``, each a JSON-ready dict.

    ``auroc``: the fields of :class:`~fedxrisk.stats.delong.PairedDeLong` (paired DeLong test);
    ``ap``/``pauc``: those of :class:`~fedxrisk.stats.bootstrap.PairedBootstrap` (paired
    stratified bootstrap, ``resamples`` draws from ``seed``; pAUC normalized, FPR ≤ ``max_fpr``).
    """
    if not 0.0 < max_fpr <= 1.0:
        raise ValueError(f"max_fpr must lie in (0, 1], got {max_fpr}")
    metrics = {"ap": weighted_ap, "pauc": lambda y, s, c: weighted_partial_auroc(y, s, c, max_fpr)}
    boot = paired_bootstrap(y, scores1, scores2, metrics, resamples, seed, level)
    out = {"auroc": dataclasses.asdict(delong_paired(y, scores1, scores2, level))}
    out |= {name: dataclasses.asdict(result) for name, result in boot.items()}
    return out

"""Imbalance by dropping positives (ALGORITHMS.md §3): test sets are never touched."""

from __future__ import annotations

import numpy as np


def imbalance_counts(num_pos: int, num_neg: int, imratio: float) -> tuple[int, int]:
    """How many positives and negatives to keep so that pos / (pos + neg) = imratio.

    Positives are dropped when there are too many; when the data already has
    fewer positives than ``imratio`` asks for, negatives are dropped instead.
    """
    if not 0.0 < imratio < 1.0:
        raise ValueError(f"imratio must lie in (0, 1), got {imratio}")
    keep_pos = round(imratio * num_neg / (1.0 - imratio))
    if keep_pos <= num_pos:
        return keep_pos, num_neg
    keep_neg = round(num_pos * (1.0 - imratio) / imratio)
    return num_pos, keep_neg


def make_imbalanced(y: np.ndarray, imratio: float | None, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of the samples kept so the positive ratio equals ``imratio``.

    ``imratio=None`` keeps every sample.
    """
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    if imratio is None:
        return np.arange(len(y))
    keep_pos, keep_neg = imbalance_counts(len(pos), len(neg), imratio)
    if keep_pos < 1:
        raise ValueError(
            f"imratio {imratio} keeps no positive out of {len(pos)} positives and {len(neg)} negatives"
        )
    kept = np.concatenate(
        [rng.choice(pos, keep_pos, replace=False), rng.choice(neg, keep_neg, replace=False)]
    )
    return np.sort(kept)

r"""Class-aware batches for any algorithm (LibAUC's DualSampler practice) and the p its AUC losses use.

``positives_per_batch = P`` makes every client's every batch of size B hold
exactly P positives first, then B − P negatives (``data.sampler.ClassSampler``;
a rare class is cycled, i.e. oversampled). Every engine reads the algorithm's
``positives_per_batch``; :func:`class_aware_batches` sets it for algorithms that
do not choose it themselves (FeDXL's B1 is its own hyperparameter) on a copy, the
original untouched, so the same option works for every algorithm on loop, vmap,
compile, distributed and Flower sites.

**The p of the AUC losses.** The AUC-square / AUCM objective of CODA+/CODASCA
and LocalSCGDAM (Yuan et al. 2021, eq. 2; LibAUC's AUCMLoss v1) averages over
the batch::

    F = (1−p)·mean[(s−a)²·1{y=1}] + p·mean[(s−b)²·1{y=0}]
        + 2α·(p(1−p)·m + mean[p·s·1{y=0} − (1−p)·s·1{y=1}]) − p(1−p)·α².

In a batch whose positive share is r, mean[g·1{y=1}] estimates r·E₊[g] and
mean[g·1{y=0}] estimates (1−r)·E₋[g]. With **p = r** the expectation is

    r(1−r)·[E₊(s−a)² + E₋(s−b)² + 2α(m + E₋s − E₊s) − α²],

the AUC min-max objective, a constant r(1−r) times the paper's bracket. With
the training-set p ≠ r (p = 0.1, r = 0.5) the class terms are weighted
(1−p)r : p(1−r) = 9 : 1 and the α term no longer compares the class means: the
combination that collapsed on digits (0.76 versus 0.97 AUROC). Reweighting
positives by p/r and negatives by (1−p)/(1−r) would restore p(1−p)·[…], the same
bracket with another constant (absorbed by the tuned learning rate). We use

    p = r = P / B

under class-aware batches, whatever ``pos_ratio_mode`` says for plain batches
(``local`` is refused as contradictory): it is what LibAUC does (AUCMLoss
recomputes p per batch, which under DualSampler equals the sampling rate), and
it keeps a client that lacks positives on a constant p rather than p = 0.
Cross-entropy under class-aware batches is oversampled (balanced) CE.
"""

from __future__ import annotations

from dataclasses import replace

from fedxrisk.algorithms.base import Algorithm, with_hooks


def sampled_pos_ratio(positives: int, batch_size: int) -> float:
    """r = P / B: the positive share of every class-aware batch, the p of the AUC losses."""
    return positives / batch_size


def class_aware_batches(algorithm: Algorithm, positives: int, batch_size: int) -> Algorithm:
    """``algorithm`` drawing ``positives`` positives per batch, its AUC losses using p = P/B: a copy
    (``algorithms.base.with_hooks``) with a copy of its problem; the arguments are left unchanged.

    ``positives`` = 0 keeps the algorithm's own choice (FeDXL's B1; plain batches
    for the others) and returns ``algorithm`` itself. Raises ValueError naming
    ``positives_per_batch`` when it leaves no negatives, or when the task is
    multi-label or asks for local p.
    """
    positives = positives or algorithm.positives_per_batch
    if not positives:
        return algorithm
    if not 1 <= positives < batch_size:
        raise ValueError(
            f"positives_per_batch must lie in [1, batch_size − 1] = [1, {batch_size - 1}], got {positives}"
        )
    problem = algorithm.problem
    if problem.num_labels > 1:
        raise ValueError(
            "positives_per_batch (class-aware batches) needs a binary task, not multi-label data"
        )
    if problem.pos_ratio_mode == "local":
        raise ValueError(
            "pos_ratio_mode 'local' contradicts class-aware batches (positives_per_batch > 0), "
            "whose AUC losses use p = positives_per_batch / batch_size; use 'global' or 'batch'"
        )
    problem = replace(problem, sampled_pos_ratio=sampled_pos_ratio(positives, batch_size))
    return with_hooks(algorithm, positives_per_batch=positives, problem=problem)

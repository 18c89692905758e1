"""Survival objectives on risk scores η (one logit per patient; higher = earlier failure).

**Cox partial likelihood, Breslow ties** (Cox 1972; Breslow 1974). With the risk set
R(i) = {j : T_j ≥ T_i} (tied times included),

    L(η) = −(1/N_e) Σ_{i : E_i = 1} [ η_i − log Σ_{j ∈ R(i)} exp(η_j) ].

It is an X-risk of FeDXL's form E_{i ∈ S1} f(E_{j ∈ S2} ℓ(η_i, η_j)) with S1 = the
patients with an event, S2 = every patient, f = log and

    ℓ(η_i, η_j; T_i, T_j) = 1[T_j ≥ T_i] · exp(η_j − η_i),

since log Σ_{j ∈ R(i)} exp(η_j) − η_i = log n + log (1/n) Σ_j ℓ(η_i, η_j): the two
differ by the constant log n (n = all patients), so their gradients are equal
(:func:`cox_compositional` returns the X-risk form; tests check it against
:func:`cox_partial_likelihood`). The risk set spans every site, which is why a
Cox loss computed inside one local batch (FLamby's Fed-TCGA-BRCA baseline,
:func:`cox_partial_likelihood` applied to a batch) is a biased estimate of it.

**Smoothed concordance** (Harrell's C-index, ``fedxrisk.stats.concordance``): the
mean over comparable pairs (i fails first) of a pairwise surrogate of η_i − η_j
(:mod:`fedxrisk.objectives.pairwise`; logistic by default, as the logits are unbounded).
"""

from __future__ import annotations

import math

import torch

from fedxrisk.objectives.pairwise import SURROGATES, check_surrogate


def _check(eta: torch.Tensor, times: torch.Tensor, events: torch.Tensor) -> None:
    if not (eta.dim() == times.dim() == events.dim() == 1 and len(eta) == len(times) == len(events)):
        raise ValueError(
            f"eta, times and events must be 1-D of one length, got {tuple(eta.shape)}, "
            f"{tuple(times.shape)}, {tuple(events.shape)}"
        )


def cox_partial_likelihood(eta: torch.Tensor, times: torch.Tensor, events: torch.Tensor) -> torch.Tensor:
    """The negative Cox log partial likelihood (Breslow ties), mean over events; 0 without events."""
    _check(eta, times, events)
    at_risk = times[None, :] >= times[:, None]  # [i, j]: j in R(i)
    log_risk = torch.logsumexp(eta[None, :].masked_fill(~at_risk, -math.inf), dim=1)
    e = events.to(eta.dtype)
    return -((eta - log_risk) * e).sum() / e.sum().clamp(min=1.0)


def cox_pair_terms(
    eta_i: torch.Tensor, t_i: torch.Tensor, eta_j: torch.Tensor, t_j: torch.Tensor
) -> torch.Tensor:
    """log ℓ(η_i, η_j) = η_j − η_i where T_j ≥ T_i, −inf elsewhere: ``[len(eta_i), len(eta_j)]``."""
    diff = eta_j[None, :] - eta_i[:, None]
    return diff.masked_fill(t_j[None, :] < t_i[:, None], -math.inf)


def cox_compositional(
    eta_i: torch.Tensor, t_i: torch.Tensor, eta_all: torch.Tensor, t_all: torch.Tensor
) -> torch.Tensor:
    """E_i log (1/n) Σ_j ℓ(η_i, η_j): the X-risk form of the Cox loss over event patients i and the
    whole population j (= :func:`cox_partial_likelihood` − log n when i are all events)."""
    logs = torch.logsumexp(cox_pair_terms(eta_i, t_i, eta_all, t_all), dim=1) - math.log(len(eta_all))
    return logs.mean()


def concordance_surrogate(
    eta: torch.Tensor,
    times: torch.Tensor,
    events: torch.Tensor,
    surrogate: str = "logistic",
    margin: float = 1.0,
) -> torch.Tensor:
    """Mean over comparable pairs (i fails first) of ℓ(η_i − η_j); 0 when no pair is comparable."""
    _check(eta, times, events)
    check_surrogate(surrogate)
    e = events.bool()
    first = (times[:, None] < times[None, :]) | ((times[:, None] == times[None, :]) & ~e[None, :])
    comparable = (e[:, None] & first).to(eta.dtype)
    loss = SURROGATES[surrogate].fn(eta[:, None] - eta[None, :], margin)
    return (loss * comparable).sum() / comparable.sum().clamp(min=1.0)

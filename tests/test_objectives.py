"""Objectives: the §1.1/§1.2 identities, gradients against finite differences, α's closed form."""

from __future__ import annotations

import torch

from fedxrisk.objectives import auc_square_loss, aucm_alpha_direction, aucm_loss, bce_loss


def _population(n_pos: int = 37, n_neg: int = 163, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    s_pos = torch.rand(n_pos, generator=g, dtype=torch.float64) * 0.6 + 0.3
    s_neg = torch.rand(n_neg, generator=g, dtype=torch.float64) * 0.7
    s = torch.cat([s_pos, s_neg])
    y = torch.cat([torch.ones(n_pos), torch.zeros(n_neg)]).double()
    return s, y, s_pos, s_neg, n_pos / (n_pos + n_neg)


def test_square_minmax_equals_pairwise_square_loss():
    """§1.1: at a = E[s|+], b = E[s|−], α = b − a the min-max value is p(1−p)(E(1 − s+ + s−)² − 1)."""
    s, y, s_pos, s_neg, p = _population()
    a, b = s_pos.mean(), s_neg.mean()
    alpha = b - a
    value = auc_square_loss(s, y, a, b, alpha, p)
    pairwise = ((1 - s_pos[:, None] + s_neg[None, :]) ** 2).mean()
    assert torch.allclose(value, p * (1 - p) * (pairwise - 1), atol=1e-12)


def test_square_loss_is_a_saddle_point_there():
    """The same point is stationary: ∇_a F = ∇_b F = ∇_α F = 0 (min over a, b; max over α)."""
    s, y, s_pos, s_neg, p = _population(seed=1)
    a = s_pos.mean().clone().requires_grad_()
    b = s_neg.mean().clone().requires_grad_()
    alpha = (s_neg.mean() - s_pos.mean()).clone().requires_grad_()
    grads = torch.autograd.grad(auc_square_loss(s, y, a, b, alpha, p), (a, b, alpha))
    assert max(abs(float(g)) for g in grads) < 1e-12
    # and α is a maximum: the loss is strictly concave in α (coefficient −p(1−p))
    bumped = auc_square_loss(s, y, a, b, alpha + 0.1, p)
    assert bumped < auc_square_loss(s, y, a, b, alpha, p)


def test_aucm_optimum_equals_variances_plus_squared_margin_gap():
    """§1.2: max_{α≥0} F at a, b = class means is p(1−p)(Var+ + Var− + (m − (E s+ − E s−))₊²)."""
    s, y, s_pos, s_neg, p = _population(seed=2)
    a, b, m = s_pos.mean(), s_neg.mean(), 1.0
    alphas = torch.linspace(0, 3, 30001, dtype=torch.float64)
    best = max(float(aucm_loss(s, y, a, b, al, p, m)) for al in alphas[::100])
    gap = max(m - float(a - b), 0.0)
    expected = p * (1 - p) * (s_pos.var(unbiased=False) + s_neg.var(unbiased=False) + gap**2)
    assert abs(best - float(expected)) < 1e-4
    alpha_star = torch.tensor(gap, dtype=torch.float64)
    assert torch.allclose(aucm_loss(s, y, a, b, alpha_star, p, m), expected, atol=1e-12)


def test_aucm_closed_form_direction_is_scaled_dual_gradient():
    """The authors' α step 2(m + b − a) − 2α equals ∇_α F / (p(1−p)) when a, b are class means."""
    s, y, s_pos, s_neg, p = _population(seed=3)
    a, b = s_pos.mean(), s_neg.mean()
    alpha = torch.tensor(0.37, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(aucm_loss(s, y, a, b, alpha, p, 0.8), alpha)
    assert torch.allclose(g / (p * (1 - p)), aucm_alpha_direction(a, b, alpha.detach(), 0.8), atol=1e-12)


def test_loss_gradients_match_finite_differences():
    s, y, *_ = _population(n_pos=5, n_neg=9, seed=4)
    p = 0.3
    for fn in (lambda *v: auc_square_loss(*v, p), lambda *v: aucm_loss(*v, p, 0.7)):
        args = (
            s.clone().requires_grad_(),
            y,
            torch.tensor(0.4, dtype=torch.float64, requires_grad=True),
            torch.tensor(0.2, dtype=torch.float64, requires_grad=True),
            torch.tensor(0.1, dtype=torch.float64, requires_grad=True),
        )
        assert torch.autograd.gradcheck(fn, args)


def test_bce_matches_definition():
    logits = torch.tensor([-2.0, 0.5, 3.0])
    y = torch.tensor([0.0, 1.0, 1.0])
    expected = -(y * torch.log(torch.sigmoid(logits)) + (1 - y) * torch.log(1 - torch.sigmoid(logits))).mean()
    assert torch.allclose(bce_loss(logits, y), expected, atol=1e-6)

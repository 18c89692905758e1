"""Cross-entropy baselines: FedProx, SCAFFOLD, LocalSGDM_RL (ratio loss), and the round batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedxrisk.objectives import bce_loss
from fedxrisk.objectives.ratio import gradient_ratios, ratio_loss
from fedxrisk.tree import numel_bytes, tmap
from helpers import assert_equal_across_clients, make_sim, max_abs_diff, run_all

SGD = {"momentum": 0.0}


def _w(sim):
    return sim.states["w"]


def test_fedprox_with_mu_zero_equals_localsgdm_without_momentum():
    kw = dict(clients=3, rounds=3, local_steps=3, partition="class")
    prox = run_all(make_sim("fedprox", options={"mu": 0.0}, **kw))
    sgd = run_all(make_sim("localsgdm", options=SGD, **kw))
    assert max_abs_diff(_w(prox), _w(sgd)) < 1e-6


def test_fedprox_term_acts_only_after_the_first_local_step():
    one = dict(clients=3, rounds=3, local_steps=1, partition="class")
    assert max_abs_diff(_w(run_all(make_sim("fedprox", options={"mu": 1.0}, **one))), _w(run_all(make_sim("localsgdm", options=SGD, **one)))) < 1e-6  # fmt: skip
    three = dict(one, local_steps=3)
    diff = max_abs_diff(_w(run_all(make_sim("fedprox", options={"mu": 1.0}, **three))), _w(run_all(make_sim("localsgdm", options=SGD, **three))))  # fmt: skip
    assert diff > 1e-5


def test_scaffold_with_one_client_is_sgd():
    kw = dict(clients=1, rounds=4, local_steps=3)
    assert max_abs_diff(_w(run_all(make_sim("scaffold", **kw))), _w(run_all(make_sim("localsgdm", options=SGD, **kw)))) < 1e-6  # fmt: skip


def test_scaffold_first_round_is_fedavg_extrapolated_by_eta_g():
    kw = dict(clients=3, rounds=1, local_steps=3, partition="class")
    fedavg = run_all(make_sim("localsgdm", options=SGD, **kw))
    scaffold = run_all(make_sim("scaffold", options={"eta_g": 2.0}, **kw))
    w0 = make_sim("scaffold", **kw).states["w"]
    expected = tmap(lambda w, s: s + 2.0 * (w - s), _w(fedavg), w0)  # c = 0 in round 1
    assert max_abs_diff(_w(scaffold), expected) < 1e-6
    # option II: c_k = (w_0 − w_k)/(Iη) is the client's mean gradient; c is their mean
    assert max_abs_diff(scaffold.states["c"], tmap(lambda c: c.mean(0, keepdim=True).expand_as(c), scaffold.states["c_local"])) < 1e-6  # fmt: skip


def test_scaffold_corrects_client_drift_later_rounds_differ_from_fedavg():
    kw = dict(clients=3, rounds=3, local_steps=3, partition="class")
    diff = max_abs_diff(_w(run_all(make_sim("scaffold", **kw))), _w(run_all(make_sim("localsgdm", options=SGD, **kw))))  # fmt: skip
    assert diff > 1e-5


def test_ratio_loss_reduces_to_bce_and_weights_classes():
    logits = torch.tensor([0.3, -1.0, 2.0, 0.5])
    y = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert torch.allclose(ratio_loss(logits, y, torch.zeros(2)), bce_loss(logits, y))
    per = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    weighted = ratio_loss(logits, y, torch.tensor([2.0, 5.0]), alpha=1.0, beta=0.1)
    assert torch.allclose(weighted, (per * torch.tensor([1.5, 1.2, 1.5, 1.2])).mean())


def test_single_logit_ratio_equals_two_logit_softmax_formula():
    """§1.7's Ra_c on a two-logit head (z_1 − z_0 = ℓ) equals our single-logit derivation."""
    gen = torch.Generator().manual_seed(0)
    phi = torch.rand(20, 6, generator=gen)
    y = (torch.arange(20) % 4 == 0).float()
    w = torch.randn(6, generator=gen)
    w0 = torch.randn(6, generator=gen)
    two = torch.stack([w0, w0 + w]).requires_grad_()  # rows: class 0, class 1
    delta = []
    for c in (0, 1):
        rows = y == c
        ce = F.cross_entropy(phi[rows] @ two.T, y[rows].long())
        delta.append(torch.autograd.grad(ce, two)[0])
    spec = [(delta[c][c] / (delta[0][c] + delta[1][c] - delta[c][c])).mean().abs() for c in (0, 1)]
    one = w.clone().requires_grad_()
    g = [torch.autograd.grad(bce_loss(phi[y == c] @ one, y[y == c]), one)[0] for c in (0, 1)]
    assert torch.allclose(gradient_ratios(g[0], g[1]), torch.stack(spec), rtol=1e-5)


def test_ratio_skips_vanishing_denominators():
    ra = gradient_ratios(torch.tensor([1.0, 2.0, 5.0]), torch.tensor([2.0, 0.0, -1.0]))
    assert torch.allclose(ra, torch.tensor([abs((0.5 - 5.0) / 2), abs((2.0 + 0.0 - 0.2) / 3)]))


def test_ratio_loss_with_beta_zero_equals_localsgdm():
    kw = dict(clients=3, rounds=3, local_steps=2, partition="class")
    rl = run_all(make_sim("localsgdm_rl", options={"ra_beta": 0.0}, **kw))
    assert max_abs_diff(_w(rl), _w(run_all(make_sim("localsgdm", **kw)))) < 1e-6
    assert float((rl.states["ra"] - 1).abs().max()) > 1e-3  # Ra was re-estimated


@pytest.mark.parametrize("alg", ["fedprox", "scaffold", "localsgdm_rl"])
def test_loop_and_vmap_agree_and_communicated_state_is_equal(alg):
    kw = dict(clients=3, rounds=3, local_steps=2, partition="class")
    loop = run_all(make_sim(alg, "loop", **kw))
    vmap = run_all(make_sim(alg, "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert loop.ledger.summary() == vmap.ledger.summary()
    for name in vmap.algorithm.communicates:
        assert_equal_across_clients(vmap.states[name], name, atol=1e-6)


def test_ratio_estimate_is_capped_at_ra_max():
    kw = dict(clients=2, rounds=2, local_steps=2, partition="class")
    free = run_all(make_sim("localsgdm_rl", options={"ra_max": None}, **kw)).states["ra"]
    cap = 0.5 * float(free.max())
    capped = run_all(make_sim("localsgdm_rl", options={"ra_max": cap}, **kw)).states["ra"]
    assert float(capped.max()) == pytest.approx(cap) and float(free.max()) > cap


def test_ratio_loss_round_batch_and_its_bytes():
    sim = make_sim("localsgdm_rl", clients=2, rounds=3, local_steps=2, options={"round_batch_size": 5})
    seen = []
    original = sim.algorithm.communicate
    sim.algorithm.communicate = lambda s, c, ctx: (
        seen.append(ctx.round_batch["x"].shape) or original(s, c, ctx)
    )
    run_all(sim)
    assert seen == [torch.Size([2, 5, 1, 8, 8])] * 3
    last = sim.algorithm.last_layer
    assert last == "net.4.weight"
    by = sim.ledger.summary()["by_variable"]
    layer_bytes = numel_bytes(sim.states["w"][last][0])
    assert by["pos"]["up"] == by["neg"]["up"] == 3 * layer_bytes


def test_bad_inputs():
    with pytest.raises(ValueError, match="mu"):
        make_sim("fedprox", options={"mu": -1.0})
    with pytest.raises(ValueError, match="eta_g"):
        make_sim("scaffold", options={"eta_g": 0.0})
    with pytest.raises(ValueError, match="round_batch_size"):
        make_sim("localsgdm_rl", options={"round_batch_size": 0})
    with pytest.raises(ValueError, match="ra_max"):
        make_sim("localsgdm_rl", options={"ra_max": 0.0})
    with pytest.raises(ValueError, match="last_layer"):
        make_sim("localsgdm_rl", options={"last_layer": "nope"})

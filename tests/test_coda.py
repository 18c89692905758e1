"""CODA family and LocalSGDM: centralized reductions, equivalent forms, CoDA's α, validation."""

from __future__ import annotations

import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.data import ClientSampler
from fedxrisk.models import build_model
from fedxrisk.objectives import auc_square_loss
from fedxrisk.problem import Problem
from helpers import make_sim, max_abs_diff, run_all


def _reference_model(sim):
    return build_model("mlp", sim.data.data.input_shape, seed=0)


def test_codaplus_with_one_client_and_window_one_is_centralized_pesg():
    """K = 1, I = 1: CODA+ is stage-wise proximal SGDA (PESG-style) on one machine.
    Reference written with plain autograd on the nn.Module, two stages, restart from the average."""
    lr, prox, steps_per_stage = 0.5, 0.1, 3
    sim = run_all(
        make_sim(
            "codaplus",
            clients=1,
            rounds=2 * steps_per_stage,
            local_steps=1,
            stages=2,
            lr=lr,
            options={"prox": prox},
        )
    )
    model = _reference_model(sim)
    params = list(model.parameters())
    a, b, alpha = (torch.zeros((), requires_grad=True) for _ in range(3))
    primal = params + [a, b]
    ref = [t.detach().clone() for t in primal]
    sampler = ClientSampler(sim.data.shard_sizes, 8, seed=0)
    p = sim.data.data.pos_ratio
    for stage in range(2):
        eta = lr / 3**stage
        sums = [torch.zeros_like(t) for t in primal] + [torch.zeros(())]
        for _ in range(steps_per_stage):
            batch = sim.data.batch(sampler.next())
            x, y = batch["x"][0], batch["y"][0]
            f = auc_square_loss(torch.sigmoid(model(x).squeeze(-1)), y, a, b, alpha, p)
            grads = torch.autograd.grad(f, primal + [alpha])
            with torch.no_grad():
                for t, g, r in zip(primal, grads, ref):
                    t -= eta * (g + prox * (t - r))
                alpha += eta * grads[-1]
                for acc, t in zip(sums, primal + [alpha]):
                    acc += t
        with torch.no_grad():  # the stage output restarts the next stage and becomes v0
            for t, acc in zip(primal + [alpha], sums):
                t.copy_(acc / steps_per_stage)
            ref = [t.detach().clone() for t in primal]
    state = sim.states
    names = [n for n, _ in model.named_parameters()]
    for n, t in zip(names, params):
        assert torch.allclose(state["w"][n][0], t, atol=1e-6), n
    for key, t in (("a", a), ("b", b), ("alpha", alpha)):
        assert torch.allclose(state[key][0], t, atol=1e-6), key


def test_localsgdm_with_one_client_is_torch_sgd_with_momentum():
    sim = run_all(
        make_sim(
            "localsgdm",
            clients=1,
            rounds=4,
            local_steps=3,
            lr=0.2,
            options={"momentum": 0.9, "weight_decay": 1e-3},
        )
    )
    model = _reference_model(sim)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3)
    sampler = ClientSampler(sim.data.shard_sizes, 8, seed=0)
    for _ in range(12):
        batch = sim.data.batch(sampler.next())
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(batch["x"][0]).squeeze(-1), batch["y"][0]
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    for n, t in model.named_parameters():
        assert torch.allclose(sim.states["w"][n][0], t, atol=1e-6), n


@pytest.mark.parametrize("window", [1, 4])
def test_codasca_with_one_client_equals_codaplus(window):
    """With K = 1 the control variates cancel (c^k = c): CODASCA is CODA+."""
    kw = dict(clients=1, rounds=4, local_steps=window, stages=2, lr=0.5)
    plus = run_all(make_sim("codaplus", **kw))
    sca = run_all(make_sim("codasca", **kw))
    for key in ("w", "a", "b", "alpha"):
        assert max_abs_diff(plus.states[key], sca.states[key]) < 1e-5, key


def test_codasca_control_variates_from_iterates_equal_mean_gradients():
    """Eq. (6) and eq. (7) of the FDAM paper agree: with no prox term, weight decay or clipping,
    c^k from the iterates equals the mean of the round's gradients, so both runs coincide."""
    kw = dict(clients=3, rounds=5, local_steps=3, stages=2, lr=0.5, partition="class")
    base = {"prox": 0.0, "eta_g": 1.1}
    it = make_sim("codasca", **kw, options={**base, "control_variate": "iterates"})
    gr = make_sim("codasca", **kw, options={**base, "control_variate": "gradients"})
    keys = ("w", "a", "b", "alpha", "c", "c_local")
    for r in range(5):
        it.run_round()
        gr.run_round()
        assert max_abs_diff({k: it.states[k] for k in keys}, {k: gr.states[k] for k in keys}) < 1e-5, r
        if r == 1:  # mid-stage: the variates are in use (they reset to 0 at stage ends)
            assert float(it.states["c"]["w"]["net.0.weight"].abs().max()) > 1e-4


def test_codasca_server_step_extrapolates_the_average():
    """η_g scales the averaged move: v_r − v_{r−1} with η_g = 2 is twice that with η_g = 1 after one round."""
    kw = dict(clients=3, rounds=1, local_steps=2, stages=1, lr=0.3, options=None, partition="class")
    starts = make_sim("codasca", **kw).states["w"]
    moves = {}
    for eta_g in (1.0, 2.0):
        sim = make_sim("codasca", **{**kw, "options": {"eta_g": eta_g, "restart": "last"}})
        sim.run_round()
        moves[eta_g] = {k: sim.states["w"][k] - starts[k] for k in starts}
    assert max_abs_diff({k: 2 * v for k, v in moves[1.0].items()}, moves[2.0]) < 1e-6


def test_coda_sets_alpha_from_class_means_on_a_large_batch():
    """At a stage start CoDA sets α = E[s | y=0] − E[s | y=1] over all clients' stage batches,
    computed with the restarted (average) model."""
    sim = make_sim(
        "coda",
        clients=3,
        rounds=4,
        local_steps=2,
        stages=2,
        partition="class",
        options={"stage_batch_size": 16},
    )
    for _ in range(2):  # the second round ends stage 0
        sim.run_round()
    problem = sim.algorithm.problem
    positions = ClientSampler(sim.data.shard_sizes, 1, seed=0, stream=1).sample(16)
    batch = sim.data.batch(positions)
    w = {k: v[0] for k, v in sim.states["w"].items()}
    s = torch.sigmoid(problem.logits(w, {}, batch["x"].flatten(0, 1))[0])
    y = batch["y"].flatten()
    expected = s[y == 0].mean() - s[y == 1].mean()
    assert torch.allclose(sim.states["alpha"], expected.expand(3), atol=1e-6)


def test_pos_ratio_modes():
    local = make_sim("codaplus", clients=3, partition="class", pos_ratio_mode="local")
    expected = torch.tensor([local.data.client_pos_ratio(k) for k in range(3)])
    assert torch.allclose(local.states["p"], expected)
    glob = make_sim("codaplus", clients=3, partition="class")
    assert torch.allclose(glob.states["p"], torch.full((3,), glob.data.data.pos_ratio))
    problem = glob.algorithm.problem
    batch_mode = Problem(problem.model, problem.pos_ratio, pos_ratio_mode="batch")
    y = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert float(batch_mode.batch_p(torch.tensor(0.9), y)) == 0.25
    assert float(problem.batch_p(torch.tensor(0.9), y)) == pytest.approx(0.9)


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("codaplus", {"form": "kernel"}, "form must be one of"),
        ("codaplus", {"dual_step": "closed_form", "loss": "square"}, "needs loss='aucm'"),
        ("codaplus", {"prox": -1.0}, "must be ≥ 0"),
        ("codasca", {"eta_g": 0.0}, "eta_g must be > 0"),
        ("codasca", {"control_variate": "magic"}, "control_variate must be one of"),
        ("coda", {"loss": "aucm"}, "CoDA's closed-form α"),
        ("localsgdm", {"momentum": 1.0}, r"momentum must lie in \[0, 1\)"),
    ],
)
def test_bad_hyperparameters_are_named(name, options, message):
    sim = make_sim("localsgdm")
    with pytest.raises(ValueError, match=message):
        ALGORITHMS[name](sim.algorithm.problem, **options)


def test_code_form_applies_the_authors_settings():
    sim = make_sim("codasca", options={"form": "code"})
    alg = sim.algorithm
    assert (alg.loss, alg.dual_step, alg.clip_grad, alg.weight_decay, alg.restart, alg.control_variate) == (
        "aucm",
        "closed_form",
        1.0,
        1e-5,
        "last",
        "gradients",
    )
    run_all(sim)
    assert float(sim.states["alpha"].min()) >= 0.0  # AUCM's α stays in [0, 999]


def test_coda_refuses_one_stage_because_it_would_be_codaplus(tmp_path):
    """Issue 13.2: with stages = 1 CoDA's restart and closed-form α never run (it was CODA+)."""
    from fedxrisk.experiment import ConfigError, RunConfig, run_experiment

    with pytest.raises(ValueError, match="coda needs stages ≥ 2: .* exactly codaplus"):
        make_sim("coda", stages=1)
    cfg = RunConfig(algorithm="coda", rounds=2, stages=1, clients=2)
    with pytest.raises(ConfigError, match="coda needs stages ≥ 2"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()

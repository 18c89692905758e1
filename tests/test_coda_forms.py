"""Issue 13.3–13.4: the authors'-code options of CODA+/CODASCA against hand-written reference
steps, and the BatchNorm statistics of a restart from the stage average."""

from __future__ import annotations

import pytest
import torch

from fedxrisk.algorithms import StepContext
from fedxrisk.data import ClientSampler
from fedxrisk.objectives import aucm_loss
from fedxrisk.tree import index, tmap
from helpers import make_sim, max_abs_diff

LR, MARGIN, WD, PROX = 0.05, 1.0, 1e-5, 2e-3


def _client_state(sim, k: int = 0, shift: float = 0.0):
    """Client k's state with a, b far from the scores (|∇a|, |∇b| > 1) and a moved prox reference."""
    state = index(sim.states, k)
    state.update(a=torch.tensor(5.0 + shift), b=torch.tensor(-5.0), alpha=torch.tensor(0.5))
    state["ref"] = dict(tmap(lambda v: v + 0.01, state["ref"]), a=torch.tensor(4.0), b=torch.tensor(-4.0))
    return state


def _batch(sim, k: int = 0):
    positions = ClientSampler(sim.data.shard_sizes, 8, seed=0).next()
    return {key: v[k] for key, v in sim.data.batch(positions).items()}


def _reference_step(sim, state, batch, clip_all=False, simultaneous=False):
    """The authors' script, written out: AUCM gradients, clip ∇w to [−1, 1] (∇a, ∇b unclipped),
    weight decay and prox on v, then α ← [α + η(2(m + b − a) − 2α)] at the updated a, b."""
    problem = sim.algorithm.problem
    w = {n: t.clone().requires_grad_(True) for n, t in state["w"].items()}
    a, b, alpha = (state[k].clone().requires_grad_(True) for k in ("a", "b", "alpha"))
    s = torch.sigmoid(problem.logits(w, state["buffers"], batch["x"])[0])
    f = aucm_loss(s, batch["y"], a, b, alpha, state["p"], MARGIN)
    grads = torch.autograd.grad(f, [*w.values(), a, b])
    gw, ga, gb = dict(zip(w, grads[: len(w)])), grads[-2], grads[-1]
    gw = {n: g.clamp(-1, 1) for n, g in gw.items()}
    raw = {"a": ga, "b": gb}
    if clip_all:
        ga, gb = ga.clamp(-1, 1), gb.clamp(-1, 1)
    ref = state["ref"]
    new_w = {
        n: state["w"][n] - LR * (gw[n] + WD * state["w"][n] + PROX * (state["w"][n] - ref["w"][n])) for n in w
    }
    new_a = state["a"] - LR * (ga + WD * state["a"] + PROX * (state["a"] - ref["a"]))
    new_b = state["b"] - LR * (gb + WD * state["b"] + PROX * (state["b"] - ref["b"]))
    at_a, at_b = (state["a"], state["b"]) if simultaneous else (new_a, new_b)
    direction = 2 * (MARGIN + at_b - at_a) - 2 * state["alpha"]
    new_alpha = (state["alpha"] + LR * direction).clamp(0, 999)
    return {"w": new_w, "a": new_a, "b": new_b, "alpha": new_alpha}, {**raw, "alpha": direction}


@pytest.mark.parametrize(
    "options, clip_all, simultaneous",
    [({}, False, False), ({"clip_scope": "all", "dual_order": "simultaneous"}, True, True)],
)
def test_code_form_step_equals_the_authors_script(options, clip_all, simultaneous):
    sim = make_sim("codaplus", clients=1, options={"form": "code", **options})
    state, batch = _client_state(sim), _batch(sim)
    out = sim.algorithm.local_step(state, batch, StepContext(0, 0, 0, 0, LR, 2))
    expected, grads = _reference_step(sim, state, batch, clip_all, simultaneous)
    assert abs(float(grads["a"])) > 1 and abs(float(grads["b"])) > 1  # clipping them would show
    assert max_abs_diff({k: out[k] for k in expected}, expected) < 1e-6


def test_codasca_code_form_variate_accumulates_the_alpha_step_direction():
    """c_α = mean of 2(m + b − a) − 2α over the round (the direction α moves along), c_v = mean of
    the raw unclipped gradients."""
    sim = make_sim("codasca", clients=1, options={"form": "code"})
    state, batch = _client_state(sim), _batch(sim)
    out = sim.algorithm.local_step(state, batch, StepContext(0, 0, 0, 0, LR, 2))
    _, grads = _reference_step(sim, state, batch)
    assert torch.allclose(out["grad_sum"]["alpha"], grads["alpha"], atol=1e-6)
    assert torch.allclose(out["grad_sum"]["a"], grads["a"], atol=1e-6)  # unclipped (|∇a| > 1)
    paper_like = make_sim("codasca", clients=1, options={"form": "code", "alpha_variate": "gradient"})
    other = paper_like.algorithm.local_step(state, batch, StepContext(0, 0, 0, 0, LR, 2))
    assert abs(float(other["grad_sum"]["alpha"] - grads["alpha"])) > 1e-3  # ∇_α F is another number


def test_code_form_keeps_variates_and_takes_each_clients_own_stage_average_as_reference():
    """One step per stage (I = 1): the stage average of client k is its own post-step iterate.
    Code form: ref_k = that iterate (different per client), c not reset; paper-style options:
    ref = the clients' mean, c = 0 after the stage end."""
    kw = dict(clients=2, rounds=2, local_steps=1, stages=2, lr=LR, partition="class")
    code = make_sim("codasca", **kw, options={"form": "code"})
    paper = make_sim(
        "codasca", **kw, options={"form": "code", "prox_reference": "global", "reset_variates": True}
    )
    positions = ClientSampler(code.data.shard_sizes, 8, seed=0).next()
    batch = code.data.batch(positions)
    own = [
        code.algorithm.local_step(index(code.states, k), index(batch, k), StepContext(0, 0, 0, 0, LR, 1))
        for k in range(2)
    ]
    code.run_round()
    paper.run_round()
    for k in range(2):
        assert max_abs_diff(index(code.states["ref"], k), {n: own[k][n] for n in ("w", "a", "b")}) < 1e-6
    assert float((code.states["ref"]["a"][0] - code.states["ref"]["a"][1]).abs()) > 1e-6
    mean = {n: tmap(lambda *x: sum(x) / 2, own[0][n], own[1][n]) for n in ("w", "a", "b")}
    assert max_abs_diff(index(paper.states["ref"], 0), mean) < 1e-6
    c_code = tmap(lambda x: x.abs().max(), code.states["c"])
    assert float(c_code["alpha"]) > 1e-3 and float(paper.states["c"]["alpha"].abs().max()) == 0.0
    expected_c = (own[0]["grad_sum"]["alpha"] + own[1]["grad_sum"]["alpha"]) / 2  # I = 1: c = mean direction
    assert torch.allclose(code.states["c"]["alpha"], expected_c.expand(2), atol=1e-6)
    assert code.ledger.summary()["bytes_up_per_client"] < paper.ledger.summary()["bytes_up_per_client"]


@pytest.mark.parametrize("policy", ["average", "local"])
def test_restart_from_the_stage_average_restarts_batchnorm_statistics_too(policy):
    """Issue 13.4: after a stage end CODA+ (paper form) holds the stage-average weights and the
    stage-average running statistics (over clients under ``average``, per client under ``local``)."""
    kw = dict(
        clients=2, rounds=2, local_steps=2, stages=2, model="cnn", buffer_policy=policy, partition="class"
    )
    sim = make_sim("codaplus", "vmap", **kw)
    sampler = ClientSampler(sim.data.shard_sizes, 8, seed=0)
    alg, states = sim.algorithm, sim.states
    running = [n for n, v in states["buffers"].items() if v.is_floating_point()]
    seen = []  # each step's running statistics, per client
    for t in range(2):
        batch = sim.data.batch(sampler.next())
        ctx = StepContext(t, t, 0, 0, 0.1, 2)
        states = {
            k: v
            for k, v in torch.func.vmap(lambda s, b, c=ctx: alg.local_step(s, b, c), randomness="different")(
                states, batch
            ).items()
        }
        seen.append({n: states["buffers"][n] for n in running})
    sim.run_round()
    for n in running:
        stage_avg = (seen[0][n] + seen[1][n]) / 2  # [clients, ...]
        if policy == "average":
            stage_avg = stage_avg.mean(0, keepdim=True).expand_as(stage_avg)
        assert torch.allclose(sim.states["buffers"][n], stage_avg, atol=1e-6), n
    last = seen[-1][running[0]]
    assert float((sim.states["buffers"][running[0]] - last).abs().max()) > 1e-6  # not the last iterate's

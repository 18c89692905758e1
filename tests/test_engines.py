"""Engines: loop and vmap agree; communicated state is identical on all clients; bytes are exact."""

from __future__ import annotations

import pytest

from fedxrisk.tree import numel_bytes
from helpers import assert_equal_across_clients, make_sim, max_abs_diff, run_all

CORE = ["localsgdm", "coda", "codaplus", "codasca", "npa"]


def _window(alg: str) -> int:
    return 1 if alg == "npa" else 3


@pytest.mark.parametrize("alg", CORE)
def test_loop_and_vmap_agree(alg):
    kw = dict(clients=3, rounds=4, local_steps=_window(alg), stages=2, partition="class")
    loop = run_all(make_sim(alg, "loop", **kw))
    vmap = run_all(make_sim(alg, "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert loop.ledger.summary() == vmap.ledger.summary()


@pytest.mark.parametrize(
    "alg, options",
    [
        ("codasca", {"form": "code"}),  # sequential α, own prox reference, variates kept (issue 13.3)
        ("codaplus", {"form": "code", "clip_scope": "all", "prox_reference": "global"}),
    ],
)
def test_loop_and_vmap_agree_on_the_code_form_options(alg, options):
    kw = dict(clients=3, rounds=4, local_steps=2, stages=2, partition="class", options=options)
    loop, vmap = run_all(make_sim(alg, "loop", **kw)), run_all(make_sim(alg, "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert loop.ledger.summary() == vmap.ledger.summary()


@pytest.mark.parametrize("policy", ["average", "local"])
@pytest.mark.parametrize("alg", ["localsgdm", "codasca"])
def test_batchnorm_model_agrees_and_follows_buffer_policy(alg, policy):
    kw = dict(clients=3, rounds=2, local_steps=2, model="cnn", buffer_policy=policy, partition="class")
    loop = run_all(make_sim(alg, "loop", **kw))
    vmap = run_all(make_sim(alg, "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    running = {k: v for k, v in loop.states["buffers"].items() if "running" in k}
    assert running, "the cnn must carry BatchNorm running statistics"
    if policy == "average":
        assert_equal_across_clients(running, "buffers")
    else:  # clients saw different classes: their statistics must differ
        spread = max(float((v - v[:1]).abs().max()) for v in running.values())
        assert spread > 1e-4


@pytest.mark.parametrize("alg", CORE)
def test_communicated_state_is_identical_on_all_clients(alg):
    kw = dict(clients=4, rounds=2, local_steps=_window(alg), stages=2, partition="class")
    sim = run_all(make_sim(alg, "vmap", **kw))
    for name in sim.algorithm.communicates:
        if name in sim.states:
            assert_equal_across_clients(sim.states[name], name)
    if alg == "codasca":
        assert_equal_across_clients(sim.states["c"], "c")


def test_bytes_are_counted_per_variable_exactly():
    sim = make_sim("localsgdm", clients=4, rounds=3, local_steps=2)
    model_bytes = numel_bytes(sim.algorithm.problem.init_model()[0])
    run_all(sim)
    summary = sim.ledger.summary()
    assert summary["by_variable"]["w"] == {"up": 3 * model_bytes, "down": 3 * model_bytes}
    assert summary["by_variable"]["m"] == {"up": 3 * model_bytes, "down": 3 * model_bytes}
    assert summary["bytes_up_per_client"] == 6 * model_bytes
    assert summary["collective_calls"] == {"mean": 3}


def test_codasca_sends_control_variates_and_stage_average_bytes():
    sim = make_sim("codasca", clients=2, rounds=2, local_steps=2, stages=1)
    model_bytes = numel_bytes(sim.algorithm.problem.init_model()[0])
    run_all(sim)
    by = sim.ledger.summary()["by_variable"]
    scalar = 4  # float32
    assert by["w"]["up"] == 2 * model_bytes
    assert by["c"]["up"] == 2 * (model_bytes + 3 * scalar)  # c on w, a, b, alpha each round
    assert by["stage_average"]["up"] == model_bytes + 3 * scalar  # once, at the stage end

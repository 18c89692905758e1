"""FeDXL1/FeDXL2/Local Pair: gradients against autograd, pools, engines, missing classes, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import grad

from fedxrisk.algorithms import ALGORITHMS, Schedule, StepContext
from fedxrisk.algorithms.fedxl import INVALID
from fedxrisk.data import FederatedData, make_federated
from fedxrisk.engines import Simulation
from fedxrisk.engines.pooling import pool_permutation
from fedxrisk.engines.simulation import SimCollective
from fedxrisk.models import build_model
from fedxrisk.objectives.pairwise import pairwise_auc_loss, pairwise_surrogate, pauc_kl_loss
from fedxrisk.problem import Problem
from fedxrisk.tree import index, leaves, tmap
from helpers import assert_equal_across_clients, make_sim, max_abs_diff, run_all

B1, B2, S = 4, 4, 4
SMALL = dict(positives_per_batch=B1, passive_samples=S)
ALGS = {
    "fedxl1": SMALL,
    "fedxl2": SMALL,
    "localpair": dict(positives_per_batch=B1),
    "localpair_pauc": dict(positives_per_batch=B1, objective="pauc", beta=0.1),
}


def _sim(alg: str, engine: str = "loop", **kw) -> Simulation:
    name = alg.split("_")[0]
    kw = {"batch_size": B1 + B2, "local_steps": 2, "clients": 3, "rounds": 2, **kw}
    return make_sim(name, engine, options={**ALGS[alg], **kw.pop("options", {})}, **kw)


def _one_client_step(alg: str, options: dict):
    """Client 0's state and one of its batches, with the pools set to that batch's current scores
    ("pools refreshed every step") and uniforms that enumerate each pool exactly once."""
    sim = make_sim(alg, clients=1, batch_size=B1 + B2, rounds=1, local_steps=1, options=options)
    state = index(sim.states, 0)
    batch = index(sim._batch(sim.sampler.next()), 0)
    assert batch["y"][:B1].eq(1).all() and batch["y"][B1:].eq(0).all()
    problem = sim.algorithm.problem
    with torch.no_grad():
        s = torch.sigmoid(problem.logits(state["w"], state["buffers"], batch["x"])[0])
    state.update(pool_pos=s[:B1].clone(), pool_neg=s[B1:].clone())
    grid = (torch.arange(S, dtype=torch.float32) + 0.5) / S
    batch["uniform"] = torch.cat([grid, grid])
    return sim.algorithm, state, batch, problem


def _full_gradient(problem: Problem, state, batch, loss_fn):
    def loss(w):
        s = torch.sigmoid(problem.logits(w, state["buffers"], batch["x"])[0])
        return loss_fn(s[:B1], s[B1:])

    return grad(loss)(state["w"])


def _ctx(lr: float = 1.0) -> StepContext:
    return StepContext(step=0, local_step=0, round=0, stage=0, lr=lr, window=1)


def test_fedxl1_gradient_equals_full_pairwise_gradient_when_pools_are_fresh():
    alg, state, batch, problem = _one_client_step("fedxl1", SMALL)
    new = alg.local_step(state, batch, _ctx(lr=1.0))
    step = tmap(lambda a, b: a - b, state["w"], new["w"])  # = G for lr = 1, no momentum
    expected = _full_gradient(problem, state, batch, lambda p, n: pairwise_auc_loss(p, n, validate=False))
    assert max_abs_diff(step, expected) < 1e-6
    assert max(float(t.abs().max()) for _, t in leaves(expected)) > 1e-4  # not trivially zero


@pytest.mark.parametrize("surrogate", ["squared_hinge", "square", "logistic"])
def test_fedxl2_gradient_matches_autograd_of_kl_dro_when_u_is_the_true_inner_mean(surrogate):
    lam = 0.5
    opts = {**SMALL, "beta": 1.0, "lam": lam, "surrogate": surrogate}
    alg, state, batch, problem = _one_client_step("fedxl2", opts)
    s_pos, s_neg = state["pool_pos"], state["pool_neg"]
    true_u = torch.exp(pairwise_surrogate(s_pos, s_neg, surrogate) / lam).mean(1)
    idx = batch["local_index"][:B1]
    state["log_u"] = state["log_u"].scatter(0, idx, true_u.log())
    state["pool_log_u"] = true_u.log()
    new = alg.local_step(state, batch, _ctx(lr=1.0))
    step = tmap(lambda a, b: a - b, state["w"], new["w"])
    expected = _full_gradient(
        problem, state, batch, lambda p, n: pauc_kl_loss(p, n, lam, surrogate, validate=False)
    )
    assert max_abs_diff(step, expected) < 1e-6
    assert float((new["log_u"][idx].exp() - true_u).abs().max()) < 1e-5  # a fixed point of u's update
    assert float(new["loss"]) == pytest.approx(float(pauc_kl_loss(s_pos, s_neg, lam, surrogate)), abs=1e-5)


@pytest.mark.parametrize("alg", list(ALGS))
def test_loop_and_vmap_agree(alg):
    kw = dict(partition="class", rounds=3, stages=2)
    loop, vmap = run_all(_sim(alg, "loop", **kw)), run_all(_sim(alg, "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert loop.ledger.summary() == vmap.ledger.summary()


@pytest.mark.parametrize("alg", ["fedxl1", "fedxl2"])
def test_after_every_round_all_clients_hold_identical_pools_within_the_bound(alg):
    tau, k, window = 2, 3, 2
    sim = _sim(alg, "vmap", clients=k, rounds=4, local_steps=window, options={"tau": tau})
    assert sim.states["pool_pos"].shape[1] == k * B1  # seeded with one batch per client
    for _ in range(4):
        sim.run_round()
        for name in sim.algorithm.communicates:
            if name in sim.states:  # m only with momentum
                assert_equal_across_clients(sim.states[name], name)
        for cls, b in (("pos", B1), ("neg", B2)):
            size = sim.states[f"pool_{cls}"].shape[1]
            assert size <= tau * k * window * b
            assert size == int(sim.states[f"count_{cls}"][0].sum())
            assert sim.states[f"rec_{cls}"].shape[1] == 0  # records were sent and cleared
    # every client holds both classes here, so the pools are exactly full
    assert sim.states["pool_neg"].shape[1] == tau * k * window * B2
    if alg == "fedxl2":
        assert sim.states["pool_log_u"].shape == sim.states["pool_pos"].shape
        assert float(sim.states["pool_log_u"].min()) >= 0.0  # u ≥ 1 since exp(ℓ/λ) ≥ 1


def test_pool_with_tau_one_holds_exactly_the_last_rounds_scores():
    sim = _sim("fedxl1", "loop", clients=2, rounds=2, local_steps=3, options={"tau": 1})
    sim.run_round()
    first = sim.states["pool_neg"][0].clone()
    sim.run_round()
    pool = sim.states["pool_neg"][0]
    assert pool.shape == (2 * 3 * B2,)
    assert not torch.equal(pool, first)
    # the second-round entries are this round's scores: in [0, 1], none of the seed's
    assert float(pool.min()) >= 0.0 and float(pool.max()) <= 1.0


def _missing_class_sim(alg: str, engine: str = "loop") -> Simulation:
    """Client 0: negatives only; client 1: positives only; client 2: both."""
    fed = make_federated("digits", 1, "iid", 0.3, seed=0)
    y = fed.data.y_train.numpy()
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    shards = [neg[:40], pos[:20], np.sort(np.concatenate([pos[20:40], neg[40:80]]))]
    data = FederatedData(fed.data, shards)
    net = build_model("mlp", data.data.input_shape, 0)
    name = alg.split("_")[0]
    algorithm = ALGORITHMS[name](Problem(net, data.data.pos_ratio), **ALGS[alg])
    return Simulation(algorithm, data, Schedule.build(2, 2, 0.5), B1 + B2, 0, engine)


@pytest.mark.parametrize("alg", ["fedxl1", "fedxl2"])
def test_client_without_a_class_records_nothing_for_it_and_still_learns_from_pools(alg):
    sim = _missing_class_sim(alg)
    # seed: clients 0 and 2 give negatives, clients 1 and 2 give positives
    assert sim.states["pool_pos"].shape[1] == 2 * B1 and sim.states["pool_neg"].shape[1] == 2 * B2
    state0 = index(sim.states, 0)
    batch = index(sim._batch(sim.sampler.next()), 0)
    assert batch["y"].eq(0).all()  # the positive slots were filled with negatives
    new = sim.algorithm.local_step(state0, batch, _ctx(0.5))
    assert max_abs_diff(new["w"], state0["w"]) > 1e-6  # its negatives vs pooled positives
    assert torch.equal(new["rec_pos"], torch.full((B1,), INVALID))
    if alg == "fedxl2":
        assert torch.equal(new["log_u"], state0["log_u"])  # no positive: no u is touched
    run_all(sim)
    assert sim.states["pool_pos"].shape[1] == 2 * 2 * 2 * B1  # τ rounds × 2 clients × I × B1
    assert float(sim.states["pool_pos"].min()) >= 0.0


def test_local_pair_takes_no_step_on_a_client_without_pairs():
    sim = _missing_class_sim("localpair")
    batch = sim._batch(sim.sampler.next())
    for k in (0, 1):
        state = index(sim.states, k)
        new = sim.algorithm.local_step(state, index(batch, k), _ctx(0.5))
        assert max_abs_diff(new["w"], state["w"]) == 0.0
    state = index(sim.states, 2)
    assert max_abs_diff(sim.algorithm.local_step(state, index(batch, 2), _ctx(0.5))["w"], state["w"]) > 0


def test_class_sampler_puts_b1_positives_first():
    sim = _sim("fedxl1", clients=3, partition="iid", imratio=0.2)
    y = sim._batch(sim.sampler.next())["y"]
    assert y[:, :B1].eq(1).all() and y[:, B1:].eq(0).all()


def test_bytes_separate_models_and_scores():
    k, window, rounds = 3, 2, 2
    sim = run_all(_sim("fedxl2", "loop", clients=k, rounds=rounds, local_steps=window))
    by = sim.ledger.summary()["by_variable"]
    batches = rounds * window + 1  # I batches a round, plus the one seeding batch
    for key, b, floats in (("pos_pool", B1, 2), ("neg_pool", B2, 1)):  # score (and log u) per slot
        up = (4 * floats + 1) * b * batches  # float32 values and a uint8 validity mask per slot
        assert by[key] == {"up": up, "down": k * 4 * floats * b * batches}, key  # all slots valid here
    model = sum(t.numel() * 4 for _, t in leaves(sim.algorithm.problem.init_model()[0]))
    assert by["w"]["up"] == rounds * model and by["m"]["up"] == rounds * model


def test_checkpoint_resume_restores_pools_and_u():
    straight = run_all(_sim("fedxl2", "loop", rounds=3))
    first = _sim("fedxl2", "loop", rounds=3)
    first.run_round()
    saved = first.state_dict()
    resumed = _sim("fedxl2", "loop", rounds=3)
    resumed.load_state_dict(saved)
    run_all(resumed)
    assert max_abs_diff(straight.states, resumed.states) == 0.0


def test_same_seed_same_numbers():
    a, b = run_all(_sim("fedxl2", "vmap")), run_all(_sim("fedxl2", "vmap"))
    assert max_abs_diff(a.states, b.states) == 0.0


# -- objectives and bad input -------------------------------------------------------


def test_kl_dro_tends_to_pairwise_auc_for_large_lambda():
    s_pos, s_neg = torch.tensor([0.9, 0.4, 0.6]), torch.tensor([0.1, 0.5])
    pair = pairwise_auc_loss(s_pos, s_neg)
    assert float(pauc_kl_loss(s_pos, s_neg, lam=1e4)) == pytest.approx(float(pair), rel=1e-3)
    assert float(pauc_kl_loss(s_pos, s_neg, lam=0.1)) > float(pair)  # focuses on hard pairs


def test_surrogates_have_their_formulas():
    d = torch.tensor([0.3])
    assert float(pairwise_auc_loss(d, torch.zeros(1))) == pytest.approx(0.49)
    assert float(pairwise_auc_loss(torch.ones(1), torch.zeros(1), "square", margin=0.5)) == pytest.approx(
        0.25
    )
    assert float(pairwise_auc_loss(d, torch.zeros(1), "logistic")) == pytest.approx(
        math.log1p(math.exp(-0.3))
    )


@pytest.mark.parametrize(
    "scores, surrogate, message",
    [
        (torch.tensor([1.5]), "squared_hinge", r"must lie in \[0.0, 1.0\]"),
        (torch.tensor([-0.1]), "square", r"must lie in \[0.0, 1.0\]"),
        (torch.tensor([float("nan")]), "logistic", "NaN or inf"),
    ],
)
def test_scores_outside_the_surrogates_range_are_rejected(scores, surrogate, message):
    with pytest.raises(ValueError, match=message):
        pairwise_auc_loss(scores, torch.tensor([0.5]), surrogate)
    assert torch.isfinite(pairwise_auc_loss(torch.tensor([3.0]), torch.tensor([-2.0]), "logistic"))


def test_kl_dro_needs_bounded_scores_and_positive_lambda():
    with pytest.raises(ValueError, match="must lie in"):
        pauc_kl_loss(torch.tensor([5.0]), torch.tensor([0.5]), surrogate="logistic")
    with pytest.raises(ValueError, match="lam"):
        pauc_kl_loss(torch.tensor([0.5]), torch.tensor([0.5]), lam=0.0)
    with pytest.raises(ValueError, match="≥ 1 positive"):
        pairwise_auc_loss(torch.zeros(0), torch.tensor([0.5]))


@pytest.mark.parametrize(
    "alg, options, message",
    [
        ("fedxl1", {"tau": 0}, "tau"),
        ("fedxl2", {"lam": 0.0}, "lam"),
        ("fedxl2", {"lam": -1.0}, "lam"),
        ("localpair", {"lam": 0.0}, "lam"),
        ("fedxl2", {"gamma": 0.0}, "gamma"),
        ("fedxl1", {"beta": 0.0}, "beta"),
        ("fedxl1", {"surrogate": "hinge"}, "surrogate"),
        ("fedxl1", {"passive_samples": 0}, "passive_samples"),
        ("localpair", {"objective": "ap"}, "objective"),
    ],
)
def test_bad_hyperparameters_are_rejected(alg, options, message):
    problem = Problem(build_model("linear", (4,), 0), 0.5)
    with pytest.raises(ValueError, match=message):
        ALGORITHMS[alg](problem, **options)


def test_positives_per_batch_must_leave_room_for_negatives():
    with pytest.raises(ValueError, match="positives_per_batch"):
        make_sim("fedxl1", batch_size=4, options={"positives_per_batch": 4})


# -- fidelity to the authors' code (issue 13 item 5) ------------------------------------------


def test_seed_pool_is_scored_in_eval_mode():
    """The authors score the seed batch with model.eval(): BatchNorm uses its running statistics."""
    sim = make_sim("fedxl1", clients=1, batch_size=B1 + B2, model="cnn", options=SMALL)
    state = index(sim.states, 0)
    state.update(rec_pos=torch.zeros(0), rec_neg=torch.zeros(0))
    batch = index(sim._batch(sim.sampler.next()), 0)
    net = sim.algorithm.problem.model
    with torch.no_grad():
        expected = torch.sigmoid(net.eval()(batch["x"]).reshape(-1))
        train_mode = torch.sigmoid(net.train()(batch["x"]).reshape(-1))
    rec = sim.algorithm._seed_records(state, batch)
    assert float((rec["rec_pos"] - expected[:B1]).abs().max()) < 1e-6
    assert float((rec["rec_neg"] - expected[B1:]).abs().max()) < 1e-6
    assert float((expected - train_mode).abs().max()) > 1e-3  # the two modes differ on this model


@pytest.mark.parametrize("init, weight", [("grad", 1.0), ("zero", 0.1)])
def test_momentum_starts_at_the_first_gradient_as_the_authors_or_at_zero(init, weight):
    sgd = _one_client_step("fedxl2", {**SMALL, "beta": 1.0})
    g = tmap(lambda a, b: a - b, sgd[1]["w"], sgd[0].local_step(sgd[1], sgd[2], _ctx(lr=1.0))["w"])
    alg, state, batch, _ = _one_client_step("fedxl2", {**SMALL, "beta": 0.1, "momentum_init": init})
    new = alg.local_step(state, batch, _ctx(lr=1.0))
    assert max_abs_diff(new["m"], tmap(lambda t: weight * t, g)) < 1e-6
    second = alg.local_step(new, batch, _ctx(lr=1.0))  # from now on the EMA with β = 0.1
    g2 = tmap(lambda a, b: a - b, new["w"], sgd[0].local_step(new, batch, _ctx(lr=1.0))["w"])
    assert max_abs_diff(second["m"], tmap(lambda m, gi: 0.9 * m + 0.1 * gi, new["m"], g2)) < 1e-6


def test_code_gradient_scale_is_the_objective_gradient_divided_by_lambda():
    lam = 0.25
    steps = {}
    for scale in ("objective", "code"):
        alg, state, batch, _ = _one_client_step(
            "fedxl2", {**SMALL, "beta": 1.0, "lam": lam, "grad_scale": scale}
        )
        steps[scale] = tmap(lambda a, b: a - b, state["w"], alg.local_step(state, batch, _ctx(1.0))["w"])
    assert max_abs_diff(steps["code"], tmap(lambda t: t / lam, steps["objective"])) < 1e-5
    assert max(float(t.abs().max()) for _, t in leaves(steps["objective"])) > 1e-4


@pytest.mark.parametrize("alg", ["fedxl2", "localpair_pauc"])
def test_small_lambda_stays_finite(alg):
    """λ = 0.01: exp(ℓ/λ) reaches e^400 (float32 overflows at e^88); log space keeps every number finite."""
    sim = run_all(_sim(alg, "vmap", rounds=3, options={"lam": 0.01}))
    for path, t in leaves(sim.states):
        assert bool(torch.isfinite(t).all()), path
    assert float(sim.states["log_u"].max()) > 88.0  # u itself would have overflowed


def test_a_positive_drawn_twice_takes_both_u_updates_in_order():
    gamma, lam = 0.1, 0.5
    alg, state, batch, problem = _one_client_step(
        "fedxl2", {**SMALL, "beta": 1.0, "lam": lam, "gamma": gamma}
    )
    idx = batch["local_index"].clone()
    idx[1] = idx[0]  # slot 1 is a second copy of slot 0's sample, with other inputs (as under augmentation)
    batch["local_index"] = idx
    state["log_u"] = state["log_u"].scatter(0, idx[:B1], torch.tensor([0.3, 0.3, 0.2, 0.1]))
    with torch.no_grad():
        s = torch.sigmoid(problem.logits(state["w"], state["buffers"], batch["x"])[0])
    x = torch.exp(pairwise_surrogate(s[:B1], state["pool_neg"]) / lam).mean(1)  # each pool entry once
    u0 = math.exp(0.3)
    expected = (1 - gamma) ** 2 * u0 + gamma * (1 - gamma) * x[0] + gamma * x[1]  # slot 0, then slot 1
    new = alg.local_step(state, batch, _ctx(1.0))
    assert float(new["log_u"][idx[0]].exp()) == pytest.approx(float(expected), rel=1e-5)
    assert float(new["log_u"][idx[2]].exp()) == pytest.approx(
        float((1 - gamma) * math.exp(0.2) + gamma * x[2]), rel=1e-5
    )
    assert torch.equal(new["rec_log_u"][0], new["rec_log_u"][1])  # both copies report the final u


def test_local_pair_declares_and_averages_its_momentum():
    sim = run_all(_sim("localpair", "vmap", rounds=1, options={"beta": 0.1}))
    assert set(sim.ledger.summary()["by_variable"]) == {"w", "m"} == set(sim.algorithm.communicates)
    assert_equal_across_clients(sim.states["m"], "m")


@pytest.mark.parametrize("name", ["fedxl1_cifar10", "fedxl1_cifar100", "fedxl2_cifar10", "fedxl2_cifar100"])
def test_paper_configs_draw_the_authors_b1_b2_passive_scores(name):
    from pathlib import Path

    import tomllib

    raw = tomllib.loads((Path(__file__).parent.parent / "configs" / "papers" / f"{name}.toml").read_text())
    b1, b = raw["algorithm"]["positives_per_batch"], raw["data"]["batch_size"]
    assert raw["algorithm"]["passive_samples"] == b1 == b - b1 == 32


# -- privacy of the score pools (issue 13 item 7) ------------------------------------------


def _recording(monkeypatch) -> list:
    """Record every comm.pool call of the simulation: (groups sent, masks sent, key, answer)."""
    calls = []
    original = SimCollective.pool

    def pool(self, groups, valid, key):
        answer = original(self, groups, valid, key)
        calls.append((groups, valid, key, answer))
        return answer

    monkeypatch.setattr(SimCollective, "pool", pool)
    return calls


@pytest.mark.parametrize("alg", ["fedxl1", "fedxl2"])
def test_pools_hold_only_valid_records_shuffled_by_seed_round_and_pool(alg, monkeypatch):
    calls = _recording(monkeypatch)
    sim = run_all(_missing_class_sim(alg))  # client 0 holds no positive, client 1 no negative
    assert [c[2] for c in calls] == [0, 1, 2]  # the seed, then round r sends key r + 1
    for groups, valid, key, answer in calls:
        for name, tree in groups.items():
            keep = valid[name].reshape(-1) != 0
            assert int(valid[name][0 if name == "pos_pool" else 1].sum()) == 0  # the missing class
            order = pool_permutation(0, key, name, int(keep.sum()))
            for leaf, sent in tree.items():
                received = answer[name][leaf]
                assert torch.equal(received, sent.reshape(-1)[keep][order].expand(3, -1))  # same on all
                assert not torch.equal(order, torch.arange(len(order)))  # not client-major
            assert not bool((answer[name]["scores"] == INVALID).any())  # no marker comes down
    assert set(answer["pos_pool"]) == ({"scores", "log_u"} if alg == "fedxl2" else {"scores"})
    assert sim.states["pool_pos"].shape[1] == 2 * 2 * 2 * B1  # τ rounds × 2 clients with positives × I × B1


def test_pool_permutation_depends_on_seed_key_and_pool():
    base = pool_permutation(0, 1, "pos_pool", 50)
    assert torch.equal(base, pool_permutation(0, 1, "pos_pool", 50))
    for other in (pool_permutation(1, 1, "pos_pool", 50), pool_permutation(0, 2, "pos_pool", 50),
                  pool_permutation(0, 1, "neg_pool", 50)):  # fmt: skip
        assert not torch.equal(base, other)
    assert torch.equal(base.sort().values, torch.arange(50))


@pytest.mark.slow  # torch.compile of FeDXL2's round
def test_fedxl2_compiled_engine_matches_loop():
    kw = dict(partition="class", rounds=1, local_steps=2, clients=2, model="linear")  # one compilation
    loop, fast = _sim("fedxl2", "loop", **kw), _sim("fedxl2", "compile", **kw)
    fast.engine = type(fast.engine)(backend="aot_eager")  # dynamo + functionalization without C++ codegen
    fast.engine.configure(fast)
    run_all(loop), run_all(fast)
    assert fast.engine.failure is None, fast.engine.failure
    assert max_abs_diff(loop.states, fast.states) < 1e-5
    assert loop.ledger.summary() == fast.ledger.summary()

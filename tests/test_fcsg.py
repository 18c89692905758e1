"""FCSG family and Local-SCGD(M): estimator, equivalences, engines, communication, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedxrisk.algorithms import ALGORITHMS, ClientInfo, Schedule, StepContext
from fedxrisk.engines import Simulation
from fedxrisk.models import build_model
from fedxrisk.objectives.conditional import (
    APSurrogate,
    InvariantLogistic,
    MAMLObjective,
    check_sample,
    csg_estimate,
    csg_objective,
)
from fedxrisk.problem import Problem
from fedxrisk.tasks import (
    AUPRCData,
    FewShotTasks,
    InvariantLRData,
    digits_fewshot,
    invariant_accuracy,
    load_omniglot,
    table2_federated,
)
from fedxrisk.tree import index, numel_bytes
from helpers import assert_equal_across_clients, make_sim, max_abs_diff, run_all

FAMILY = ["fcsg", "fcsg_m", "acc_fcsg_m", "local_scgd", "local_scgdm"]


def _linear_problem(dim: int = 10) -> Problem:
    torch.manual_seed(0)
    return Problem(nn.Linear(dim, 1, bias=False), 0.5)


def _inv_sim(alg, engine="loop", clients=3, rounds=2, window=3, m=4, b=2, lr=0.1, seed=0, **options):
    data = InvariantLRData(num_clients=clients, m=m, outer_batch=b, seed=seed)
    algo = ALGORITHMS[alg](_linear_problem(), objective=InvariantLogistic(), **options)
    return Simulation(algo, data, Schedule.build(rounds, window, lr), b, seed, engine)


def _auprc_sim(alg, engine="loop", clients=3, rounds=2, window=2, **options):
    fed = table2_federated("digits", clients, seed=0)
    problem = Problem(build_model("mlp", fed.data.input_shape, 0), fed.data.pos_ratio)
    algo = ALGORITHMS[alg](problem, **options)
    return Simulation(algo, AUPRCData(fed, 3, seed=0), Schedule.build(rounds, window, 0.1), 6, 0, engine)


def _maml_sim(alg, engine="loop", **options):
    train, _ = digits_fewshot()
    data = FewShotTasks(train, 2, n_way=3, k_shot=1, q_query=2, meta_batch=2, seed=0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 3))
    algo = ALGORITHMS[alg](Problem(model, 0.5), objective=MAMLObjective(0.4), **options)
    return Simulation(algo, data, Schedule.build(2, 2, 0.1), 1, 0, engine)


# -- the estimator ---------------------------------------------------------------------------


def test_csg_estimate_approaches_true_gradient_as_m_grows():
    """E[η | ξ] = a in closed form, so the true gradient is that of softplus(−b·aᵀx) + r(x)."""
    problem, obj = _linear_problem(), InvariantLogistic()
    params, buffers = problem.init_model()
    rng = np.random.default_rng(0)
    a = torch.as_tensor(rng.normal(size=(4, 10)), dtype=torch.float32)
    b = torch.tensor([1.0, -1.0, 1.0, -1.0])

    def true_loss(p):
        return F.softplus(-b * (a @ p["weight"][0])).mean() + obj.regularizer(problem, p)

    truth = torch.func.grad(true_loss)(params)["weight"]
    errors = {}
    for m in (1, 100, 20_000):
        eta = a[:, None, :] + 2.0 * torch.as_tensor(rng.normal(size=(4, m, 10)), dtype=torch.float32)
        est, _ = csg_estimate(obj, problem, params, buffers, {"xi": {"a": a, "b": b}, "eta": {"x": eta}})
        errors[m] = float((est["weight"] - truth).norm() / truth.norm())
    assert errors[20_000] < 0.03
    assert errors[1] > 5 * errors[20_000]


def test_ap_surrogate_matches_direct_formula():
    """−mean over positives i of Σ_j ℓ_ij·y_j / Σ_j ℓ_ij on a plain mini-batch."""
    torch.manual_seed(1)
    model = nn.Linear(5, 1)
    problem = Problem(model, 0.3)
    params, buffers = problem.init_model()
    x, y = torch.randn(7, 5), torch.tensor([1.0, 0, 0, 1, 0, 1, 0])
    obj = APSurrogate(margin=0.6)
    value = csg_objective(obj, problem, params, buffers, obj.from_batch({"x": x, "y": y}))
    s = torch.sigmoid(model(x)[:, 0]).detach().double().numpy()
    terms = [
        sum(max(0.6 - s[i] + s[j], 0) ** 2 * y[j].item() for j in range(7))
        / sum(max(0.6 - s[i] + s[j], 0) ** 2 for j in range(7))
        for i in range(7)
        if y[i] == 1
    ]
    assert float(value) == pytest.approx(-np.mean(terms), rel=1e-5)


def test_maml_inner_mean_equals_mean_of_per_sample_inner_steps():
    train, _ = digits_fewshot()
    data = FewShotTasks(train, 1, n_way=3, k_shot=2, q_query=2, meta_batch=2, seed=0)
    sample = {k: index(v, 0) for k, v in data.batch(np.zeros((1, 1), dtype=np.int64)).items()}
    torch.manual_seed(0)
    problem = Problem(nn.Sequential(nn.Flatten(), nn.Linear(64, 6), nn.ReLU(), nn.Linear(6, 3)), 0.5)
    params, buffers = problem.init_model()
    obj = MAMLObjective(0.4)
    fast = obj.inner_mean(problem, params, buffers, sample["xi"], sample["eta"])
    slow = {k: v.mean(1) for k, v in obj.inner(problem, params, buffers, sample["xi"], sample["eta"]).items()}
    assert max_abs_diff(fast, slow) < 1e-6
    assert max_abs_diff(fast, {k: v.expand_as(fast[k]) for k, v in params.items()}) > 1e-3


# -- algorithm equivalences ------------------------------------------------------------------


def _one_step_setup():
    problem, obj = _linear_problem(), InvariantLogistic()
    data = InvariantLRData(num_clients=1, m=3, outer_batch=2, seed=4)
    sample = {k: index(v, 0) for k, v in data.batch(np.zeros((1, 2), dtype=np.int64)).items()}
    w, buffers = problem.init_model()
    w_prev = {"weight": w["weight"] + 0.3}
    u = {"weight": torch.full_like(w["weight"], 0.2)}
    state = {"w": w, "w_prev": w_prev, "u": u, "buffers": buffers, "loss": torch.zeros(())}
    ctx = StepContext(step=5, local_step=1, round=0, stage=0, lr=0.05, window=3)
    return problem, obj, sample, state, ctx


def test_acc_fcsg_m_evaluates_both_points_on_the_same_samples():
    problem, obj, sample, state, ctx = _one_step_setup()
    beta = 0.3
    alg = ALGORITHMS["acc_fcsg_m"](problem, objective=obj, beta=beta)
    new = alg.local_step(state, sample, ctx)
    est, _ = csg_estimate(obj, problem, state["w"], state["buffers"], sample)
    est_prev, _ = csg_estimate(obj, problem, state["w_prev"], state["buffers"], sample)
    u_ref = est["weight"] + (1 - beta) * (state["u"]["weight"] - est_prev["weight"])
    assert torch.equal(new["u"]["weight"], u_ref)
    assert torch.equal(new["w"]["weight"], state["w"]["weight"] - ctx.lr * u_ref)
    assert torch.equal(new["w_prev"]["weight"], state["w"]["weight"])
    # at x_{t-1} = x_t the two estimates cancel only if they used the same samples
    same = dict(state, w_prev=state["w"])
    momentum = ALGORITHMS["fcsg_m"](problem, objective=obj, beta=beta).local_step(same, sample, ctx)
    assert max_abs_diff(alg.local_step(same, sample, ctx)["u"], momentum["u"]) < 1e-7


@pytest.mark.parametrize("alg", ["fcsg_m", "acc_fcsg_m"])
def test_momentum_variants_with_beta_one_equal_fcsg(alg):
    ref = run_all(_inv_sim("fcsg", clients=2, m=3))
    other = run_all(_inv_sim(alg, clients=2, m=3, beta=1.0))
    assert max_abs_diff(ref.states["w"], other.states["w"]) < 1e-7
    model_bytes = numel_bytes(ref.algorithm.problem.init_model()[0])
    assert ref.ledger.summary()["bytes_up_per_client"] == 2 * model_bytes
    assert other.ledger.summary()["bytes_up_per_client"] == 2 * 2 * model_bytes  # x and u


def test_local_scgd_with_gamma_one_and_one_outer_sample_equals_fcsg():
    """y = ĝ(x_t) then, and Jᵀ∇f(ĝ) is the CSG estimate."""
    ref = run_all(_inv_sim("fcsg", clients=2, b=1))
    scgd = run_all(_inv_sim("local_scgd", clients=2, b=1, gamma=1.0))
    assert max_abs_diff(ref.states["w"], scgd.states["w"]) < 1e-6


def test_local_scgd_per_task_inner_state_with_gamma_one_equals_fcsg_for_several_tasks():
    """Issue 13.6: y_i = ĝ_i at γ = 1, so each task's gradient is its own CSG estimate;
    the shared y (the mean of the ĝ_i) is a different method once b > 1."""
    ref = run_all(_inv_sim("fcsg", clients=2, b=3))
    per_task = run_all(_inv_sim("local_scgd", clients=2, b=3, gamma=1.0))
    shared = run_all(_inv_sim("local_scgd", clients=2, b=3, gamma=1.0, inner_state="shared"))
    assert max_abs_diff(ref.states["w"], per_task.states["w"]) < 1e-6
    assert max_abs_diff(ref.states["w"], shared.states["w"]) > 1e-3


@pytest.mark.parametrize("inner_state", ["per_task", "shared"])
def test_local_scgd_step_equals_a_hand_written_reference(inner_state):
    """d = 1/b Σ_i ∂ĝ_iᵀ∇f_ξi(y_i) + ∇r with y_i = (1 − γ)y + γĝ_i (per task) or y_i = mean_i of
    those (shared), written as the gradient of f at the interpolated point divided by γ."""
    gamma, lr = 0.3, 0.1
    sim = _inv_sim("local_scgd", clients=1, b=3, gamma=gamma, inner_state=inner_state)
    alg, obj, problem = sim.algorithm, sim.algorithm._objective, sim.algorithm.problem
    w, buffers = problem.init_model()
    y = torch.tensor(0.7)
    data = InvariantLRData(num_clients=1, m=4, outer_batch=3, seed=0)
    sample = {k: index(v, 0) for k, v in data.batch(np.zeros((1, 3), dtype=np.int64)).items()}
    state = {"w": w, "buffers": buffers, "y": y, "loss": torch.zeros(())}
    out = alg.local_step(state, sample, StepContext(1, 1, 0, 0, lr, 3))

    x = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    g = obj.inner_mean(problem, x, buffers, sample["xi"], sample["eta"])
    y_rows = (1 - gamma) * y + gamma * g  # row i depends on x through ĝ_i only: ∂f_i/∂x = γ ∂ĝ_iᵀ∇f_i
    if inner_state == "shared":  # same gradient path, value moved to the shared point ȳ
        y_rows = y_rows + (y_rows.mean(0) - y_rows).detach()
    total = obj.outer(problem, y_rows, sample["xi"]).sum() / 3 / gamma
    d = torch.autograd.grad(total + obj.regularizer(problem, x), x)
    assert torch.allclose(out["y"], ((1 - gamma) * y + gamma * g.mean(0)).detach(), atol=1e-7)
    for k in w:
        assert torch.allclose(out["w"][k], w[k] - lr * d[k], atol=1e-6), k


def test_init_batches_estimate_u1_at_x0_from_B_outer_samples():
    sim = _inv_sim("fcsg_m", clients=1, rounds=1, window=2, b=2, init_batches=2, beta=0.5)
    w0, buffers = sim.algorithm.problem.init_model()
    replay = InvariantLRData(num_clients=1, m=4, outer_batch=2, seed=0)
    estimates = []
    for _ in range(2):
        sample = {k: index(v, 0) for k, v in replay.batch(np.zeros((1, 2), dtype=np.int64)).items()}
        estimates.append(
            csg_estimate(sim.algorithm._objective, sim.algorithm.problem, w0, buffers, sample)[0]
        )
    run_all(sim)
    u1 = (estimates[0]["weight"] + estimates[1]["weight"]) / 2
    assert torch.allclose(sim.states["u"]["weight"][0], u1, atol=1e-7)
    assert torch.allclose(sim.states["w"]["weight"][0], w0["weight"] - 0.1 * u1, atol=1e-7)


# -- engines and communication ---------------------------------------------------------------


@pytest.mark.parametrize("alg", FAMILY)
@pytest.mark.parametrize("task", ["invariant", "auprc"])
def test_loop_and_vmap_agree(alg, task):
    build = _inv_sim if task == "invariant" else _auprc_sim
    loop, vmap = run_all(build(alg, "loop")), run_all(build(alg, "vmap"))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert loop.ledger.summary() == vmap.ledger.summary()


@pytest.mark.parametrize("alg", ["acc_fcsg_m", "local_scgdm"])
def test_loop_and_vmap_agree_on_maml(alg):
    loop, vmap = run_all(_maml_sim(alg, "loop")), run_all(_maml_sim(alg, "vmap"))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5


def test_plain_binary_batches_run_through_the_ap_surrogate():
    """``fedxrisk run --algorithm fcsg_m`` path: FederatedData batches, LibAUC-style sample."""
    kw = dict(clients=2, rounds=2, local_steps=2, options={"beta": 0.5})
    loop, vmap = run_all(make_sim("fcsg_m", "loop", **kw)), run_all(make_sim("fcsg_m", "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert float(loop.states["loss"].mean()) < 0  # −AP surrogate


@pytest.mark.parametrize("alg", ["acc_fcsg_m", "local_scgdm"])
def test_batchnorm_running_statistics_are_tracked_and_averaged(alg):
    kw = dict(clients=2, rounds=2, local_steps=2, batch_size=6, model="cnn", options={"beta": 0.5})
    loop, vmap = run_all(make_sim(alg, "loop", **kw)), run_all(make_sim(alg, "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    running = {k: v for k, v in vmap.states["buffers"].items() if "running" in k}
    assert running
    assert_equal_across_clients(running, "buffers")
    init = vmap.algorithm.problem.init_model()[1]
    assert max(float((v[0] - init[k]).abs().max()) for k, v in running.items()) > 1e-3


@pytest.mark.parametrize("alg", FAMILY)
def test_communicated_state_is_identical_on_all_clients(alg):
    sim = run_all(_inv_sim(alg, "vmap", clients=4, rounds=1))
    assert set(sim.ledger.summary()["by_variable"]) == set(sim.algorithm.communicates)
    for name in sim.algorithm.communicates:
        assert_equal_across_clients(sim.states[name], name)
    if alg == "acc_fcsg_m":  # x_{t-1} stays the client's own (Alg. 2)
        spread = float((sim.states["w_prev"]["weight"] - sim.states["w_prev"]["weight"][:1]).abs().max())
        assert spread > 0


def test_byte_accounting_shows_the_extra_cost_of_u_and_inner_state():
    sims = {alg: run_all(_inv_sim(alg, clients=2, rounds=3)) for alg in FAMILY}
    model = numel_bytes(sims["fcsg"].algorithm.problem.init_model()[0])
    up = {alg: s.ledger.summary()["bytes_up_per_client"] for alg, s in sims.items()}
    assert up == {
        "fcsg": 3 * model,
        "fcsg_m": 3 * 2 * model,
        "acc_fcsg_m": 3 * 2 * model,
        "local_scgd": 3 * (model + 4),  # y: one float (ηᵀx)
        "local_scgdm": 3 * (2 * model + 4),
    }


# -- data sources ----------------------------------------------------------------------------


def test_table2_protocol_removes_80_percent_of_positives_and_keeps_test():
    from fedxrisk.data import binarize, load_dataset

    full = binarize(load_dataset("digits"))
    fed = table2_federated("digits", 4, seed=0)
    kept_pos, all_pos = int(fed.data.y_train.sum()), int(full.y_train.sum())
    assert abs(kept_pos - 0.2 * all_pos) <= 1
    assert len(fed.data.y_train) - kept_pos == int((full.y_train == 0).sum())
    assert torch.equal(fed.data.x_test, full.x_test) and torch.equal(fed.data.y_test, full.y_test)
    assert full.positive_classes == (5, 6, 7, 8, 9)


def test_invariant_clients_draw_their_own_data_and_x_star_is_perfect():
    data = InvariantLRData(num_clients=2, m=2, outer_batch=3, seed=0)
    batch = data.batch(np.zeros((2, 3), dtype=np.int64))
    assert not torch.equal(batch["xi"]["a"][0], batch["xi"]["a"][1])
    problem = _linear_problem()
    params = {"weight": torch.as_tensor(data.x_star, dtype=torch.float32)[None]}
    assert invariant_accuracy(problem, params, {}, data, n=2000) == 1.0
    assert invariant_accuracy(problem, {"weight": -params["weight"]}, {}, data, n=2000) == 0.0


def test_omniglot_reader_on_a_generated_folder(tmp_path):
    from PIL import Image

    for split, alphabets in (("images_background", 2), ("images_evaluation", 1)):
        for a in range(alphabets):
            for c in range(2):
                folder = tmp_path / split / f"Alphabet_{a}" / f"character{c + 1:02d}"
                folder.mkdir(parents=True)
                for i in range(3):
                    img = np.full((20, 20), 255, dtype=np.uint8)
                    img[5:15, 9:11] = 0  # a black stroke on white
                    Image.fromarray(img).save(folder / f"{i}.png")
    train, test = load_omniglot(tmp_path, image_size=10)
    assert len(train) == 4 and len(test) == 2
    assert train[0].shape == (3, 1, 10, 10)
    assert train[0][0, 0, 0, 0] == pytest.approx(0.0, abs=1e-6)  # background → 0
    assert train[0][0, 0, 5, 5] > 0.5  # stroke → 1
    tasks = FewShotTasks(train, 2, n_way=2, k_shot=1, q_query=2, meta_batch=1)
    assert tasks.batch(np.zeros((2, 1), dtype=np.int64))["eta"]["x"].shape == (2, 1, 2, 1, 10, 10)
    with pytest.raises(FileNotFoundError, match="images_background"):
        load_omniglot(tmp_path / "nowhere")


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("beta", [0.0, -0.1, 1.5])
@pytest.mark.parametrize("alg", ["fcsg_m", "acc_fcsg_m", "local_scgdm"])
def test_beta_outside_unit_interval_is_rejected(alg, beta):
    with pytest.raises(ValueError, match=r"beta must lie in \(0, 1\]"):
        ALGORITHMS[alg](_linear_problem(), beta=beta)


def test_bad_hyperparameters_and_models_are_rejected():
    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
        ALGORITHMS["local_scgd"](_linear_problem(), gamma=0.0)
    with pytest.raises(ValueError, match="init_batches"):
        ALGORITHMS["fcsg"](_linear_problem(), init_batches=0)
    with pytest.raises(TypeError, match="ConditionalObjective"):
        ALGORITHMS["fcsg"](_linear_problem(), objective="ap")
    bn = Problem(nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2), nn.Linear(2, 1)), 0.5)
    with pytest.raises(ValueError, match="running statistics .* InvariantLogistic does not update"):
        ALGORITHMS["fcsg"](bn, objective=InvariantLogistic())


def test_m_below_one_is_rejected():
    with pytest.raises(ValueError, match="m .* must be ≥ 1"):
        InvariantLRData(m=0)
    with pytest.raises(ValueError, match="k_shot must be ≥ 1"):
        FewShotTasks(digits_fewshot()[0], 2, k_shot=0)
    problem = _linear_problem()
    params, buffers = problem.init_model()
    sample = {"xi": {"a": torch.zeros(2, 10), "b": torch.ones(2)}, "eta": {"x": torch.zeros(2, 0, 10)}}
    with pytest.raises(ValueError, match="m = 0 inner samples"):
        csg_estimate(InvariantLogistic(), problem, params, buffers, sample)


def test_inner_samples_not_matching_their_outer_sample_are_rejected():
    problem = _linear_problem()
    params, buffers = problem.init_model()
    xi = {"a": torch.zeros(3, 10), "b": torch.ones(3)}
    wrong_rows = {"xi": xi, "eta": {"x": torch.zeros(2, 4, 10)}}
    with pytest.raises(ValueError, match="leading shape"):
        csg_estimate(InvariantLogistic(), problem, params, buffers, wrong_rows)
    ids = torch.arange(3)
    of = ids[:, None].expand(3, 4).clone()
    of[1, 2] = 0  # inner sample drawn for outer sample 0 placed with outer sample 1
    swapped = {"xi": xi, "eta": {"x": torch.zeros(3, 4, 10)}, "xi_id": ids, "eta_of": of}
    with pytest.raises(ValueError, match=r"inner sample \(1, 2\) was drawn for outer sample 0"):
        check_sample(swapped)
    with pytest.raises(ValueError, match="both 'xi_id' and 'eta_of'"):
        check_sample({"xi": xi, "eta": {"x": torch.zeros(3, 4, 10)}, "xi_id": ids})


def test_plain_batches_need_an_objective_that_accepts_them():
    alg = ALGORITHMS["fcsg"](_linear_problem(), objective=InvariantLogistic())
    state = alg.init(ClientInfo(0, 10, 0.5))
    ctx = StepContext(0, 0, 0, 0, 0.1, 1)
    with pytest.raises(ValueError, match="needs conditional batches"):
        alg.local_step(state, {"x": torch.zeros(4, 10), "y": torch.zeros(4)}, ctx)

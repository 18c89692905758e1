"""Survival algorithms: FeDXL2-Cox's gradient with full passive parts is the pooled Cox gradient; one
client converges to lifelines' Cox fit; loop and vmap agree; FeDXL1-C-index learns the ordering."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedxrisk.algorithms import Schedule
from fedxrisk.algorithms.base import ClientInfo, StepContext
from fedxrisk.algorithms.survival import FedAvgCox, FeDXL1CIndex, FeDXL2Cox
from fedxrisk.data import make_federated
from fedxrisk.data.readers.survival import read_survival_table
from fedxrisk.data.types import binarize
from fedxrisk.engines import Simulation
from fedxrisk.objectives.survival import cox_partial_likelihood
from fedxrisk.problem import Problem
from fedxrisk.stats.concordance import c_index
from fedxrisk.tree import index

lifelines = pytest.importorskip("lifelines")
BETA = np.array([0.8, -0.5, 0.3])


def _table(tmp_path, n: int = 240, sites: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    t = rng.exponential(np.exp(-x @ BETA))
    c = rng.exponential(2.0, size=n)
    times, events = np.minimum(t, c), (t <= c).astype(int)
    path = tmp_path / "surv.csv"
    rows = ["time,event,a,b,c,source"] + [
        f"{float(times[i])!r},{events[i]},{float(x[i, 0])!r},{float(x[i, 1])!r},{float(x[i, 2])!r},s{i % sites}"
        for i in range(n)
    ]
    path.write_text("\n".join(rows) + "\n")
    return read_survival_table(path)


def _federated(tmp_path, clients: int, partition: str = "source", **kw):
    return make_federated(
        binarize(_table(tmp_path, **kw)), clients, partition, None, 0, allow_missing_class=True
    )


def test_full_passive_parts_give_the_pooled_cox_gradient():
    torch.manual_seed(0)
    n, n_ev, d = 40, 10, 3
    x = torch.randn(n, d, dtype=torch.float64)
    times = torch.randperm(n).to(torch.float32) + 1.0
    events = torch.zeros(n)
    events[torch.randperm(n)[:n_ev]] = 1.0
    net = nn.Linear(d, 1).double()
    alg = FeDXL2Cox(Problem(net, n_ev / n), beta=1.0, passive_samples=n, gamma=0.3)
    state = alg.init(ClientInfo(0, n, n_ev / n, n))
    with torch.no_grad():
        eta = net(x).squeeze(1)
    ev = events.bool()
    ell = torch.where(times[None, :] >= times[:, None], torch.exp(eta[None, :] - eta[:, None]), 0.0)
    log_g = torch.log(ell.mean(1))  # exact inner means over all n patients
    state.update(
        pool_all_score=eta, pool_all_time=times, pool_ev_score=eta[ev], pool_ev_time=times[ev],
        pool_ev_log_u=log_g[ev], log_u=log_g,
    )  # fmt: skip
    grid = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # each pool entry drawn equally often
    batch = {"x": x, "y": events.double(), "time": times, "local_index": torch.arange(n),
             "uniform": torch.cat([grid, grid])}  # fmt: skip
    new = alg.local_step(state, batch, StepContext(0, 0, 0, 0, 1.0, 1))
    g = {k: state["w"][k] - new["w"][k] for k in state["w"]}
    w = {k: v.detach().clone().requires_grad_(True) for k, v in state["w"].items()}
    pooled = cox_partial_likelihood(torch.func.functional_call(net, w, (x,)).squeeze(1), times, events)
    ref = torch.autograd.grad(pooled, list(w.values()))
    for (k, _), r in zip(w.items(), ref):
        torch.testing.assert_close(g[k], r, rtol=0, atol=1e-9)  # u's decay is float32 (pairwise_base)
    assert abs(float(new["loss"]) - (pooled.item() - math.log(n))) < 1e-9  # value = Cox − log n


def _run(fed, alg_cls, engine="loop", rounds=60, steps=5, lr=0.5, batch=None, seed=0, **options):
    net = nn.Linear(fed.data.input_shape[0], 1)
    torch.manual_seed(seed)
    alg = alg_cls(Problem(net, fed.data.pos_ratio), **options)
    sched = Schedule.build(rounds, steps, lr, 1)
    sim = Simulation(alg, fed, sched, batch or min(fed.shard_sizes), seed, engine)
    while not sim.done:
        sim.run_round()
    return sim


def _lifelines_beta(data) -> np.ndarray:
    import pandas as pd

    df = pd.DataFrame(data.x_train.numpy(), columns=["a", "b", "c"])
    df["T"], df["E"] = data.groups_train["time"], data.y_train.numpy()
    return lifelines.CoxPHFitter().fit(df, "T", "E").params_.to_numpy()


@pytest.mark.slow  # long: many rounds to a converged model
def test_one_client_full_batch_cox_equals_lifelines(tmp_path):
    fed = _federated(tmp_path, 1, partition="iid")
    n = fed.shard_sizes[0]
    sim = _run(fed, FedAvgCox, rounds=150, steps=10, lr=0.5, batch=n, momentum=0.0)
    ours = index(sim.states, 0)["w"]["weight"].squeeze(0).double().numpy()
    np.testing.assert_allclose(ours, _lifelines_beta(fed.data), rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("alg", [pytest.param(FeDXL2Cox, marks=pytest.mark.slow), FeDXL1CIndex])
def test_one_client_xrisk_points_where_lifelines_does(tmp_path, alg):
    fed = _federated(tmp_path, 1, partition="iid")
    sim = _run(fed, alg, rounds=80, steps=5, lr=0.5 if alg is FeDXL2Cox else 2.0, batch=32)
    ours = index(sim.states, 0)["w"]["weight"].squeeze(0).double().numpy()
    ref = _lifelines_beta(fed.data)
    assert ours @ ref / (np.linalg.norm(ours) * np.linalg.norm(ref)) > 0.95


@pytest.mark.parametrize("alg", [FeDXL2Cox, FeDXL1CIndex, FedAvgCox])
def test_loop_and_vmap_agree_across_sites(tmp_path, alg):
    fed = _federated(tmp_path, 3)
    a = _run(fed, alg, "loop", rounds=4, steps=3, lr=0.3, batch=16)
    b = _run(fed, alg, "vmap", rounds=4, steps=3, lr=0.3, batch=16)
    for k in a.states["w"]:
        torch.testing.assert_close(a.states["w"][k], b.states["w"][k], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # long: many rounds to a converged model
def test_sites_learn_a_concordant_score(tmp_path):
    fed = _federated(tmp_path, 3)
    for alg, lr in ((FeDXL2Cox, 0.5), (FeDXL1CIndex, 2.0), (FedAvgCox, 0.1)):
        sim = _run(fed, alg, rounds=40, steps=5, lr=lr, batch=16)
        w = index(sim.states, 0)["w"]
        scores = fed.data.x_test.double().numpy() @ w["weight"].squeeze(0).double().numpy()
        assert c_index(fed.data.groups_test["time"], fed.data.y_test.numpy(), scores) > 0.65, alg.name


def test_dp_refuses_what_it_does_not_cover():
    """Instance-level DP-SGD refuses all three (a Cox batch loss and the X-risks couple patients);
    client-level DP refuses the pools (they release other sites' scores and times in clear) and
    covers FedAvg-Cox, whose rounds are means of the model."""
    from fedxrisk.engines.privacy import unsupported_instance_reason, unsupported_reason

    problem = Problem(nn.Linear(3, 1), 0.2)
    for alg in (FedAvgCox, FeDXL2Cox, FeDXL1CIndex):
        assert "not covered by per-sample clipping" in unsupported_instance_reason(alg(problem))
    assert unsupported_reason(FedAvgCox(problem)) is None
    for alg in (FeDXL2Cox, FeDXL1CIndex):
        assert "score pools" in unsupported_reason(alg(problem))

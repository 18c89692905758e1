"""Server optimizers (Reddi et al. 2021) on the mean of w: references and engine equality (issue 33)."""

from __future__ import annotations

import json

import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import make_federated
from fedxrisk.engines import Simulation
from fedxrisk.engines.server_opt import ServerOptimizer, with_server_optimizer
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from fedxrisk.tree import index
from helpers import PROCESS_WAIT, assert_equal_across_clients, max_abs_diff

ROUNDS = 4


def _sim(
    algorithm: str, optimizer: ServerOptimizer | None, engine: str = "loop", clients: int = 3, **options
):
    data = make_federated("digits", clients, "class", 0.3, 0)
    problem = Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio)
    alg = ALGORITHMS[algorithm](problem, **options)
    if optimizer is not None:
        alg = with_server_optimizer(alg, optimizer)
    return Simulation(alg, data, Schedule.build(ROUNDS, 2, 0.1, 1), 8, 0, engine)


@pytest.mark.parametrize("name", ["adam", "adagrad"])
def test_server_optimizer_on_one_client_is_torch_optim_on_the_pseudo_gradient(name):
    """K = 1: every round g = x − (the client's w after its local steps from x), and x takes one
    torch.optim.Adam (FedAdam) / torch.optim.Adagrad (FedAdagrad, β₁ = 0) step on g, eps = τ."""
    opt = ServerOptimizer(name, lr=0.05, beta1=0.9 if name == "adam" else 0.0, beta2=0.99, tau=1e-3)
    sim = _sim("localsgdm", opt, clients=1)
    plain = _sim("localsgdm", None, clients=1)  # the same client: its local steps from the reference x
    x = {k: v[0].clone() for k, v in plain.states["w"].items()}
    params = list(x.values())
    reference = (torch.optim.Adam(params, lr=0.05, betas=(0.9, 0.99), eps=1e-3) if name == "adam"
                 else torch.optim.Adagrad(params, lr=0.05, eps=1e-3))  # fmt: skip
    for _ in range(ROUNDS):
        sim.run_round()
        plain.run_round()
        for k, p in x.items():
            p.grad = p - plain.states["w"][k][0]
        reference.step()
        plain.states = dict(plain.states, w={k: v.clone().unsqueeze(0) for k, v in x.items()})
        assert max_abs_diff(index(sim.states["w"], 0), x) < 1e-6
    assert (
        max_abs_diff(index(sim.states["w"], 0), index(_sim("localsgdm", None, clients=1).states["w"], 0))
        > 1e-3
    )


def test_sgd_with_lr_one_and_no_momentum_is_fedavg():
    a = _sim("codasca", ServerOptimizer("sgd", lr=1.0, beta1=0.0))
    b = _sim("codasca", None)
    for _ in range(ROUNDS):
        a.run_round()
        b.run_round()
    assert max_abs_diff({k: v for k, v in a.states.items() if k != "server_opt"}, b.states) < 1e-6


@pytest.mark.parametrize("algorithm, name", [("localsgdm", "adam"), ("codasca", "yogi"), ("codaplus", "sgd")])
def test_loop_and_vmap_agree_with_a_server_optimizer(algorithm, name):
    opt = ServerOptimizer(name, lr=0.03 if name != "sgd" else 0.9)
    loop, vmap = _sim(algorithm, opt, "loop"), _sim(algorithm, opt, "vmap")
    for _ in range(ROUNDS):
        loop.run_round()
        vmap.run_round()
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    for key in (*loop.algorithm.communicates,):
        assert_equal_across_clients(loop.states[key], key, atol=1e-6)
    assert float(loop.states["server_opt"]["t"][0]) == ROUNDS


def test_bad_server_settings_are_named():
    with pytest.raises(ValueError, match="server.optimizer must be one of"):
        ServerOptimizer("adamw")
    with pytest.raises(ValueError, match="server.beta2 must lie in"):
        ServerOptimizer("adam", beta2=1.0)


@pytest.mark.slow  # torchrun: 2 real ranks
def test_torchrun_distributed_run_with_fedadam_equals_the_loop_engine(tmp_path):
    """The CLI's [server] table through `fedxrisk run` on 2 torchrun ranks (2 clients each) and on loop."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.spec import RunConfig

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(root / "src"), OMP_NUM_THREADS="1")
    common = ["--algorithm", "codasca", "-K", "4", "--rounds", "4", "--eval-every", "4",
              "--set", 'server.optimizer="adam"', "--set", "server.lr=0.02"]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "fedxrisk", "run", *common, "--engine", "distributed",
           "--clients-per-rank", "2", "-q", "--out", str(tmp_path / "dist")]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=PROCESS_WAIT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dist = json.loads((tmp_path / "dist" / "summary.json").read_text())
    cfg = RunConfig(algorithm="codasca", clients=4, rounds=4, eval_every=4, engine="loop",
                    server={"optimizer": "adam", "lr": 0.02}, tensorboard=False)  # fmt: skip
    loop = run_experiment(cfg, tmp_path / "loop").summary
    plain = run_experiment(RunConfig(algorithm="codasca", clients=4, rounds=4, eval_every=4, tensorboard=False),
                           tmp_path / "plain").summary  # fmt: skip
    assert dist["config"]["server"] == {"optimizer": "adam", "lr": 0.02}
    for key in ("test_auroc", "test_ap", "client_auroc_mean"):
        assert abs(dist["final"][key] - loop["final"][key]) < 1e-5, key
    assert dist["final"]["test_auroc"] != plain["final"]["test_auroc"]  # the optimizer acted


def test_flower_sites_with_fedyogi_equal_the_loop_engine(tmp_path):
    """Flower's run config key ``server`` (the [server] table as JSON, as every table of RunConfig):
    each site applies the optimizer to the server's mean while replaying communicate; the model
    equals the loop engine's."""
    from test_flower_protocol import K, run_config, run_local, trial_nodes

    rc = run_config("codasca", tmp_path, server=json.dumps({"optimizer": "yogi", "lr": 0.02}))
    summary, _ = run_local(rc, trial_nodes())
    data = make_federated("digits", K, "iid", 0.3, 0)
    problem = Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio)
    alg = with_server_optimizer(ALGORITHMS["codasca"](problem), ServerOptimizer("yogi", lr=0.02))
    sim = Simulation(alg, data, Schedule.build(rc["rounds"], rc["local-steps"], rc["lr"], rc["stages"]), 8, 0)
    while not sim.done:
        sim.run_round()
    model = torch.load(tmp_path / "model.pt")
    assert max_abs_diff(model["params"], sim.global_model()[0]) < 1e-6
    assert summary["status"] == "completed"


def _dp_sim(optimizer: ServerOptimizer | None, engine: str):
    from fedxrisk.engines.privacy import ClientDP

    data = make_federated("digits", 3, "class", 0.3, 0)
    problem = Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio)
    alg = ALGORITHMS["localsgdm"](problem)
    if optimizer is not None:
        alg = with_server_optimizer(alg, optimizer)
    dp = ClientDP(0.5, 0.8, noise_seed=7)  # the reproducible test mode: every sim draws the same noise
    return Simulation(alg, data, Schedule.build(ROUNDS, 2, 0.1, 1), 8, 0, engine, privacy=dp)


def test_with_client_dp_the_optimizer_steps_on_the_privatized_mean():
    """σ = 0.8: FedAvgM with η = 1, β = 0 is DP-FedAvg itself (the optimizer sees the noised mean);
    FedAdam on top of DP is equal on the loop and vmap engines."""
    identity, plain = _dp_sim(ServerOptimizer("sgd", lr=1.0, beta1=0.0), "loop"), _dp_sim(None, "loop")
    adam_loop = _dp_sim(ServerOptimizer("adam", lr=0.02), "loop")
    adam_vmap = _dp_sim(ServerOptimizer("adam", lr=0.02), "vmap")
    for _ in range(ROUNDS):
        for sim in (identity, plain, adam_loop, adam_vmap):
            sim.run_round()
    assert max_abs_diff(identity.states["w"], plain.states["w"]) < 1e-6
    assert max_abs_diff(adam_loop.states, adam_vmap.states) < 1e-5
    assert max_abs_diff(adam_loop.states["w"], plain.states["w"]) > 1e-3


def test_an_extended_run_keeps_the_optimizer_state(tmp_path):
    """3 rounds, then extended to 6 from the checkpoint: the same model as 6 rounds straight (m, v, t kept)."""
    import dataclasses

    from fedxrisk.run.recipes import resume_experiment, run_experiment
    from fedxrisk.run.spec import RunConfig

    cfg = RunConfig(algorithm="localsgdm", clients=3, rounds=3, stages=1, eval_every=3, checkpoint_every=1,
                    tensorboard=False, server={"optimizer": "adam", "lr": 0.02})  # fmt: skip
    run_experiment(cfg, tmp_path / "a")
    extended = resume_experiment(tmp_path / "a", rounds=6).summary["final"]
    straight = run_experiment(dataclasses.replace(cfg, rounds=6), tmp_path / "b").summary["final"]
    assert extended["test_auroc"] == straight["test_auroc"] and extended["test_ap"] == straight["test_ap"]

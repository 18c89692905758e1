"""A server optimizer with personal entries (engines/server_opt.py): the server step moves the
shared entries only; a personal entry (FedPer's head, FedBN's layers) keeps the site's own local
result, on every engine. The distributed engine's global model (its mean of the sites' personal
entries, taken before ``communicate``) is then the loop engine's (tests/test_distributed.py runs
it on 2 ranks; here its reading is recomputed in one process)."""

from __future__ import annotations

import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import make_federated
from fedxrisk.engines import Simulation
from fedxrisk.engines.server_opt import KEY, ServerOptimizer, with_server_optimizer
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from helpers import assert_equal_across_clients, max_abs_diff, run_all


def _sim(personal: str, engine: str = "loop", server: ServerOptimizer | None = None, rounds: int = 3,
         alg: str = "localsgdm", model: str = "mlp", stages: int = 1) -> Simulation:  # fmt: skip
    data = make_federated("digits", 3, "class", 0.3, 0)
    problem = Problem(build_model(model, data.data.input_shape, 0), data.data.pos_ratio, personal=personal)
    algorithm = ALGORITHMS[alg](problem)
    if server is not None:
        algorithm = with_server_optimizer(algorithm, server)
    return Simulation(algorithm, data, Schedule.build(rounds, 2, 0.1, stages), 8, 0, engine)


def _personal(sim: Simulation, w: dict) -> dict:
    return {k: v.clone() for k, v in w.items() if k in sim.algorithm.problem.local_names}


def _spy_local_results(sim: Simulation) -> list[dict]:
    """Each round's personal entries of w after the local steps, before ``communicate``."""
    seen: list[dict] = []
    original = sim._collective

    def spy():
        seen.append(_personal(sim, sim.states["w"]))
        return original()

    sim._collective = spy  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_a_huge_server_step_leaves_every_site_head_at_its_local_result(engine):
    """Attacker-style: server.lr = 1000 would throw a stepped head ~1000 away. After one round each
    site's head equals the head of the same round without [server] (the same local training),
    while the shared entries did take the huge step."""
    huge = _sim("head", engine, ServerOptimizer("adam", lr=1000.0), rounds=1)
    plain = _sim("head", engine, None, rounds=1)
    huge.run_round()
    plain.run_round()
    heads = _personal(huge, huge.states["w"])
    assert heads and max_abs_diff(heads, _personal(plain, plain.states["w"])) < 1e-6
    shared = {k: v for k, v in huge.states["w"].items() if k not in heads}
    assert max_abs_diff(shared, {k: plain.states["w"][k] for k in shared}) > 100  # the step acted
    assert_equal_across_clients(shared, "w")
    assert set(huge.states[KEY]["m"]) == set(shared)  # the optimizer holds no state for a head


@pytest.mark.parametrize("personal, model", [("head", "mlp"), ("bn", "cnn")])
def test_server_adam_with_personal_entries_loop_equals_vmap_and_the_distributed_reading(personal, model):
    """[server] adam: loop = vmap (states and global model); every round each site's personal
    entries leave ``communicate`` as its local steps left them, so the global model's personal
    entries equal the mean of the local results (what the distributed engine evaluates)."""
    opt = ServerOptimizer("adam", lr=0.05)
    loop, vmap = _sim(personal, "loop", opt, model=model), _sim(personal, "vmap", opt, model=model)
    local = _spy_local_results(loop)
    for _ in range(3):
        loop.run_round()
        vmap.run_round()
        assert max_abs_diff(_personal(loop, loop.states["w"]), local[-1]) == 0.0
        distributed_reading = {k: v.mean(0) for k, v in local[-1].items()}
        assert max_abs_diff(_personal(loop, loop.global_model()[0]), distributed_reading) < 1e-6
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert max_abs_diff(dict(zip("pb", loop.global_model())), dict(zip("pb", vmap.global_model()))) < 1e-5
    plain = run_all(_sim(personal, "loop", None, model=model))
    assert max_abs_diff(loop.states["w"], plain.states["w"]) > 1e-3  # the optimizer acted


def test_at_a_stage_restart_a_personal_entry_is_the_sites_restart_point():
    """CODA+ (stage restart): the server steps the restart point's shared entries; a personal head
    keeps the site's own restart point, as without [server]: with server SGD at lr 1 and no momentum
    (x − 1·(x − restart) = restart) the run equals the plain one; with Adam (lr 10) the heads
    after the first stage's restart equal the plain run's (same local training until then)."""
    identity = run_all(
        _sim("head", "loop", ServerOptimizer("sgd", lr=1.0, beta1=0.0), 4, "codaplus", stages=2)
    )
    plain = run_all(_sim("head", "loop", None, 4, "codaplus", stages=2))
    assert max_abs_diff({k: v for k, v in identity.states.items() if k != KEY}, plain.states) < 1e-6
    adam = _sim("head", "loop", ServerOptimizer("adam", lr=10.0), 2, "codaplus", stages=2)
    first = _sim("head", "loop", None, 2, "codaplus", stages=2)
    adam.run_round()  # stage 1 = round 1: it ends with the restart
    first.run_round()
    assert adam.plans[0].stage_end
    heads = _personal(adam, adam.states["w"])
    assert heads and max_abs_diff(heads, _personal(first, first.states["w"])) == 0.0
    assert torch.isfinite(torch.stack([v.abs().max() for v in heads.values()])).all()

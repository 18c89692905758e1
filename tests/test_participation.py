"""Issue 43: partial participation (``data.clients_per_round``): m of K clients per round.

Equivalences: every client = today's run bit for bit; loop = vmap under sampling; a hand-written
plain-Python FedAvg over the sampled clients = the engine. Only the participants' own state changes
in a round; the sets follow the seed; weighted sampling favours big clients; bad values are refused
in one line at check time."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch.func import functional_call

from fedxrisk.cli import main
from fedxrisk.data.sampler import ClientSampler
from fedxrisk.engines import Simulation
from fedxrisk.engines.participation import Participation, participation_csv, participation_of
from fedxrisk.errors import ConfigError
from fedxrisk.experiment import RunConfig, run_experiment
from fedxrisk.run.build import build
from fedxrisk.run.checks import check
from helpers import make_sim, max_abs_diff, run_all


def sampled_sim(alg: str, engine: str = "loop", m: int | float = 2, clients: int = 5, **kw) -> Simulation:
    """make_sim's run with ``m`` of its clients per round (seed 3)."""
    base = make_sim(alg, engine, clients=clients, **kw)
    part = Participation(m, clients, seed=3)
    return Simulation(
        base.algorithm, base.data, base.schedule, base.batch_size, base.seed, engine, participation=part
    )


# -- (a) every client: today's run, bit for bit ---------------------------------------------------
def test_every_client_equals_a_run_without_the_setting_bit_for_bit():
    small = dict(
        rounds=2, stages=1, clients=3, engine="vmap", tensorboard=False, local_steps=2, dataset="synthetic"
    )
    plain = run_all(build(RunConfig(**small)).simulation)
    full = run_all(build(RunConfig(**small, clients_per_round=1.0)).simulation)
    assert full.participation is None  # m = K: no sampling at all
    assert max_abs_diff(plain.states, full.states) == 0.0
    assert participation_of(3, [10, 20, 30], seed=0, weighted=True) is None
    every = build(RunConfig(**small, clients_per_round=3, participation="weighted")).simulation
    assert every.participation is None


# -- (b) only the participants' own state changes -------------------------------------------------
OWN = {
    "localsgdm": ("loss",),
    "codaplus": ("loss", "iterate_sum"),
    "codasca": ("loss", "c_local"),
    "scaffold": ("loss", "c_local"),
}


@pytest.mark.parametrize("alg", sorted(OWN))
def test_only_the_sampled_clients_state_changes(alg):
    sim = sampled_sim(alg, clients=5, m=2, rounds=3, local_steps=2)
    sim.run_round()
    before = {k: sim.states[k] for k in OWN[alg]}
    sim.run_round()
    took_part = sim._participants
    assert int(took_part.sum()) == 2
    assert torch.equal(took_part, Participation(2, 5, seed=3).mask(1))
    for key in OWN[alg]:
        after = sim.states[key]
        for (path, old), (_, new) in zip(_leaves(before[key]), _leaves(after)):
            assert torch.equal(new[~took_part], old[~took_part]), (key, path)  # absent: unchanged
            assert not torch.equal(new[took_part], old[took_part]), (key, path)  # participants: moved
    w = next(iter(sim.states["w"].values()))
    assert torch.equal(w[~took_part], w[took_part][:1].expand_as(w[~took_part]))  # the broadcast reaches all


def _leaves(x):
    return [("", x)] if isinstance(x, torch.Tensor) else sorted(_flat(x))


def _flat(tree, prefix=""):
    for k, v in tree.items():
        yield from ([(prefix + k, v)] if isinstance(v, torch.Tensor) else _flat(v, f"{prefix}{k}."))


# -- (c) engines agree under sampling -------------------------------------------------------------
@pytest.mark.parametrize("alg", ["codasca", "scaffold", "fedxl1"])
def test_loop_and_vmap_agree_under_sampling(alg):
    kw = dict(m=2, clients=5, rounds=3, local_steps=2, positives=2 if alg == "fedxl1" else 0)
    loop, vmap = run_all(sampled_sim(alg, "loop", **kw)), run_all(sampled_sim(alg, "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5


def test_a_resumed_run_draws_the_same_clients_and_batches():
    full = run_all(sampled_sim("codasca", m=2, clients=5, rounds=4, local_steps=2))
    first = sampled_sim("codasca", m=2, clients=5, rounds=4, local_steps=2)
    first.run_round(), first.run_round()
    resumed = sampled_sim("codasca", m=2, clients=5, rounds=4, local_steps=2)
    resumed.load_state_dict(first.state_dict())
    assert max_abs_diff(full.states, run_all(resumed).states) == 0.0


# -- (d) the draw --------------------------------------------------------------------------------
def test_sampled_sets_follow_the_seed_and_differ_across_rounds():
    a, b, other = Participation(3, 10, seed=1), Participation(3, 10, seed=1), Participation(3, 10, seed=2)
    rounds = [a.mask(r) for r in range(6)]
    assert all(int(m.sum()) == 3 for m in rounds)
    assert all(torch.equal(a.mask(r), b.mask(r)) for r in range(6))  # reproducible from the seed
    assert len({tuple(m.tolist()) for m in rounds}) > 1  # not the same set every round
    assert any(not torch.equal(a.mask(r), other.mask(r)) for r in range(6))  # another seed, other sets
    assert Participation(0.25, 10).count == 2  # a fraction: round(q·K)


def test_weighted_sampling_favours_big_clients_and_uniform_does_not():
    sizes = tuple(float(n) for n in [10] * 5 + [90] * 5)
    weighted, uniform = Participation(2, 10, seed=0, weights=sizes), Participation(2, 10, seed=0)
    w = torch.stack([weighted.mask(r) for r in range(400)]).double().mean(0)
    u = torch.stack([uniform.mask(r) for r in range(400)]).double().mean(0)
    assert float(w[5:].mean()) > 4 * float(w[:5].mean())  # ∝ size: a big client ~ 9× (w/o replacement: less)
    assert abs(float(u[5:].mean()) - float(u[:5].mean())) < 0.05  # uniform: 0.2 each, 400 rounds


# -- (e) a plain-Python FedAvg over the sampled clients -----------------------------------------
def test_reference_replay_of_fedavg_over_the_sampled_clients():
    k, m, rounds, steps, lr, batch = 4, 2, 3, 2, 0.1, 8
    sim = run_all(
        sampled_sim(
            "localsgdm", m=m, clients=k, rounds=rounds, local_steps=steps, lr=lr, options={"momentum": 0.0}
        )
    )
    net, data = sim.algorithm.problem.model, sim.data
    w = {name: p.detach().clone() for name, p in net.named_parameters()}
    streams = [ClientSampler([data.shard_sizes[c]], batch, sim.seed, 0, [c]) for c in range(k)]
    part = Participation(m, k, seed=3)
    for r in range(rounds):
        models = []
        for c in part.mask(r).nonzero().flatten().tolist():  # the sampled clients, each from the global w
            wc = {n: t.clone().requires_grad_(True) for n, t in w.items()}
            for _ in range(steps):
                rows = data.shards[c][streams[c].next()[0]]
                x, y = data.data.x_train[rows], data.data.y_train[rows].float()
                logits = functional_call(net, wc, (x,)).reshape(y.shape)
                grads = torch.autograd.grad(F.binary_cross_entropy_with_logits(logits, y), list(wc.values()))
                wc = {n: (t - lr * g).detach().requires_grad_(True) for (n, t), g in zip(wc.items(), grads)}
            models.append(wc)
        w = {n: torch.stack([mc[n].detach() for mc in models]).mean(0) for n in w}  # participants only
    params, _ = sim.global_model()
    assert max(float((params[n] - w[n]).abs().max()) for n in w) < 1e-5


# -- the run folder and the refusals ---------------------------------------------------------------
def test_run_records_who_took_part(tmp_path):
    cfg = RunConfig(
        rounds=3, stages=1, eval_every=3, clients=4, clients_per_round=2, tensorboard=False, engine="loop"
    )
    result = run_experiment(cfg, tmp_path / "r")
    lines = (tmp_path / "r" / "participation.csv").read_text().splitlines()
    part = Participation(2, 4, seed=cfg.seed)
    assert lines == participation_csv(part, 3).splitlines()
    assert [len(line.split(",")[1].split()) for line in lines[1:]] == [2, 2, 2]
    assert result.summary["participation"]["clients_per_round"] == 2


@pytest.mark.parametrize(
    "value, message",
    [
        (0, "data.clients_per_round must be ≥ 1"),
        (1.5, "a fraction must lie in (0, 1]"),
        (9, "exceeds the 8 clients"),
    ],
)
def test_bad_values_are_refused_at_check_time(value, message, tmp_path):
    errors = check(RunConfig(clients=8, clients_per_round=value))
    assert len(errors) == 1 and message in str(errors[0])
    config = tmp_path / "c.toml"
    config.write_text(f"[data]\nclients = 8\nclients_per_round = {value}\n")
    result = CliRunner().invoke(main, ["check", str(config)])
    assert result.exit_code == 2 and message in result.output, result.output


def test_privacy_with_clients_per_round_is_refused_in_one_line():
    errors = check(RunConfig(clients_per_round=2, privacy={"clip": 1.0, "noise_multiplier": 1.0}))
    assert len(errors) == 1 and "privacy.sampling_rate" in str(errors[0])


def test_more_clients_per_round_than_the_data_has_is_refused_when_built():
    with pytest.raises(ConfigError, match="must lie in"):
        Participation(5, 4)
    assert (
        dataclasses.replace(RunConfig(), clients_per_round=None).to_dict().get("clients_per_round", "absent")
        == "absent"
    )


# -- Flower: the server draws the sites of each round ----------------------------------------------
def test_flower_clients_per_round_equals_the_loop_engine(tmp_path):
    from fedxrisk.flower.wire import unflatten
    from fedxrisk.tree import tmap
    from test_flower_protocol import run_config, run_local, trial_nodes

    k, rounds = 4, 3
    rc = run_config(
        "codasca", tmp_path, lr=0.05, rounds=rounds, stages=1, **{"min-nodes": k, "clients-per-round": 2}
    )
    summary, transport = run_local(rc, trial_nodes(k))
    base = make_sim(
        "codasca", "loop", clients=k, rounds=rounds, local_steps=rc["local-steps"], batch_size=rc["batch-size"],
        lr=rc["lr"], stages=1, partition="iid", imratio=0.3, seed=0,
    )  # fmt: skip
    part = Participation(2, k, seed=0)
    sim = run_all(
        Simulation(base.algorithm, base.data, base.schedule, base.batch_size, 0, "loop", participation=part)
    )
    params, _ = sim.global_model()
    assert max_abs_diff(torch.load(tmp_path / "model.pt")["params"], params) < 1e-6
    # the loss of the last round's participants only: an absent site's stale loss is not in it
    assert summary["final"]["train_loss"] == pytest.approx(sim.train_loss(), abs=1e-6)
    for c, node in enumerate(sorted(transport.saved)):  # absent rounds kept exactly (control variates too)
        site_state = unflatten(transport.saved[node].arrays["state"])
        assert max_abs_diff(site_state, tmap(lambda x, c=c: x[c : c + 1], sim.states)) < 1e-6
    assert (tmp_path / "participation.csv").read_text() == participation_csv(part, rounds)


# -- (f) a round among the participants only (engines/lazyround.py) -------------------------------
@pytest.mark.parametrize(
    "alg, stages, options",
    [("localsgdm", 1, None), ("scaffold", 1, None), ("codaplus", 2, None), ("codasca", 2, None),
     ("codasca", 2, {"form": "code"})],
)  # fmt: skip
def test_a_lazy_round_equals_the_round_over_every_client(alg, stages, options):
    kw = dict(m=2, clients=6, rounds=6, local_steps=2, stages=stages, options=options)
    lazy, full = sampled_sim(alg, "vmap", **kw), sampled_sim(alg, "vmap", **kw)
    full._own = ()  # every round over all K rows, as before lazy rounds
    assert lazy._own  # the algorithm declares what a client keeps as its own
    kept_once = 0
    while not lazy.done:
        lazy.run_round(), full.run_round()
        kept_once += lazy._template is not None  # the shared entries held once: a lazy round
        assert max_abs_diff(lazy.states, full.states) < 1e-6  # reading states writes the broadcast
    assert kept_once >= (2 if stages > 1 else 5)  # rounds 2-3 and 5 (CODA: not a stage's first or last)
    assert lazy.ledger.summary() == full.ledger.summary()  # the same bytes are counted


def test_lazy_rounds_keep_the_global_state_once_and_touch_only_the_participants_rows():
    sim = sampled_sim("scaffold", "vmap", m=2, clients=6, rounds=3, local_steps=2)
    sim.run_round(), sim.run_round()  # round 0 over all rows, round 1 lazy
    before = {k: v.clone() for k, v in sim._rows["c_local"].items()}
    sim.run_round()
    took_part = sim._participants
    for name, old in before.items():
        new = sim._rows["c_local"][name]
        assert torch.equal(new[~took_part], old[~took_part])  # absent rows: not written
        assert not torch.equal(new[took_part], old[took_part])
    name, stacked = next(iter(sim._rows["w"].items()))
    assert sim._template is not None and sim._template["w"][name].shape == stacked.shape[1:]  # one row
    w = sim.states["w"][name]  # read: the broadcast written into every row
    assert torch.equal(w, sim._rows["w"][name][:1].expand_as(w)) and sim._template is None

"""Personalization (issue 33): FedBN and a personal head keep their entries on the site on every
engine, fine-tuning continues each site alone, and each site's model is scored on its own rows."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import make_federated
from fedxrisk.data.readers import read_tabular_csv
from fedxrisk.engines import Simulation
from fedxrisk.engines.personal import fine_tune, personal_evaluation, site_models, site_test_rows
from fedxrisk.engines.simulation import SimCollective
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from fedxrisk.tree import numel_bytes
from helpers import assert_equal_across_clients, max_abs_diff, one_per_family, run_all


def personal_sim(alg, personal, engine="loop", clients=3, rounds=2, steps=2, stages=1, model="cnn",
                 dataset="digits", partition="class", imratio=0.3, options=None, seed=0, data=None,
                 server=None):  # fmt: skip
    """``server``: a :class:`~fedxrisk.engines.server_opt.ServerOptimizer` to wrap the algorithm in."""
    data = data or make_federated(dataset, clients, partition, imratio, seed)
    net = build_model(model, data.data.input_shape, seed)
    problem = Problem(net, data.data.pos_ratio, personal=personal)
    algorithm = ALGORITHMS[alg](problem, **(options or {}))
    if server is not None:
        from fedxrisk.engines.server_opt import with_server_optimizer

        algorithm = with_server_optimizer(algorithm, server)
    return Simulation(algorithm, data, Schedule.build(rounds, steps, 0.1, stages), 8, seed, engine)


def _split(tree, names):
    personal = {k: v for k, v in tree.items() if k in names}
    return personal, {k: v for k, v in tree.items() if k not in names}


@pytest.mark.parametrize("personal", ["bn", "head"])
@pytest.mark.parametrize("alg", ["localsgdm", "codaplus", "codasca"])
def test_personal_entries_stay_local_and_loop_equals_vmap(alg, personal):
    kw = dict(stages=2 if alg != "localsgdm" else 1, rounds=4 if alg != "localsgdm" else 2)
    loop = run_all(personal_sim(alg, personal, "loop", **kw))
    vmap = run_all(personal_sim(alg, personal, "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert loop.ledger.summary() == vmap.ledger.summary()
    names = loop.algorithm.problem.local_names
    own, shared = _split(loop.states["w"], names)
    assert own and shared
    assert_equal_across_clients(shared, "w")
    # class partition: the sites' personal entries must have drifted apart
    assert max(float((v - v[:1]).abs().max()) for v in own.values()) > 1e-4
    if personal == "bn":
        running = {k: v for k, v in loop.states["buffers"].items() if "running" in k}
        assert max(float((v - v[:1]).abs().max()) for v in running.values()) > 1e-4


def test_fedbn_never_sends_batchnorm_entries_and_saves_exactly_their_bytes(monkeypatch):
    sent: list[str] = []
    original = SimCollective.mean

    def spy(self, tree):
        from fedxrisk.tree import leaves

        sent.extend(path for path, _ in leaves(tree))
        return original(self, tree)

    monkeypatch.setattr(SimCollective, "mean", spy)
    fedbn = run_all(personal_sim("localsgdm", "bn", rounds=2))
    names = fedbn.algorithm.problem.local_names
    assert sent and not [p for p in sent if any(p.endswith(n) for n in names)]
    sent.clear()
    plain = run_all(personal_sim("localsgdm", "none", rounds=2))
    assert any("features.1.weight" in p for p in sent)  # the spy sees BatchNorm entries otherwise
    w, buffers = fedbn.algorithm.model(fedbn.states)
    bn_params = {k: v[0] for k, v in w.items() if k in names}
    bn_stats = {k: v[0] for k, v in buffers.items() if k in names and v.is_floating_point()}
    per_round = 2 * numel_bytes(bn_params) + numel_bytes(bn_stats)  # w and momentum m, statistics
    saved = plain.ledger.summary()["bytes_up_per_client"] - fedbn.ledger.summary()["bytes_up_per_client"]
    assert saved == 2 * per_round


def test_personal_head_on_one_client_is_the_plain_run():
    """K = 1: the mean is the identity, so keeping entries local must change no number."""
    kw = dict(clients=1, rounds=2, stages=2, partition="iid", options={"eta_g": 1.5})
    plain = run_all(personal_sim("codasca", "none", **kw))
    head = run_all(personal_sim("codasca", "head", **kw))
    assert max_abs_diff(plain.states, head.states) == 0.0


def test_a_model_without_batchnorm_is_refused_for_fedbn():
    with pytest.raises(ValueError, match="no BatchNorm layer"):
        personal_sim("localsgdm", "bn", model="mlp")


def test_global_model_averages_the_personal_entries():
    sim = run_all(personal_sim("localsgdm", "bn"))
    params, _ = sim.global_model()
    for k in sim.algorithm.problem.local_names & params.keys():
        assert torch.equal(params[k], sim.states["w"][k].mean(0))


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_fine_tuning_zero_steps_is_the_global_model_and_n_steps_are_local_sgd(engine):
    sim = run_all(personal_sim("localsgdm", "none", engine, model="mlp"))
    before = sim.states
    fine_tune(sim, 0)
    assert sim.states is before
    reference = run_all(personal_sim("localsgdm", "none", "loop", model="mlp"))
    fine_tune(sim, 3)
    fine_tune(reference, 3)
    assert max_abs_diff(sim.states, reference.states) < 1e-5
    # by hand: three more local steps of each client from the end state, same batches
    manual = run_all(personal_sim("localsgdm", "none", "loop", model="mlp"))
    alg, last = manual.algorithm, manual.plans[-1]
    from fedxrisk.algorithms.base import StepContext
    from fedxrisk.tree import index, stack

    clients = [index(manual.states, k) for k in range(3)]
    for i in range(3):
        batch = manual._batch(manual.sampler.next())
        ctx = StepContext(last.first_step + last.window + i, i, last.round + 1, last.stage, last.lr, 3)
        clients = [alg.local_step(s, index(batch, k), ctx) for k, s in enumerate(clients)]
    assert max_abs_diff(stack(clients), reference.states) < 1e-6
    assert (
        float((reference.states["w"]["net.0.weight"] - reference.states["w"]["net.0.weight"][:1]).abs().max())
        > 0
    )


def _sites_table(path, rows=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3))
    site = np.arange(rows) % 3
    label = (x[:, 0] * (1 - site) + x[:, 1] + rng.normal(size=rows) > 0.3).astype(int)  # a site-specific rule
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["f0", "f1", "f2", "label", "source"])
        w.writerows([[*map(float, r), int(t), f"s{s}"] for r, t, s in zip(x, label, site, strict=True)])


def test_each_site_model_is_scored_on_its_own_test_rows(tmp_path):
    _sites_table(tmp_path / "data.csv")
    data = make_federated("tabular", 3, "source", None, 0, data_dir=str(tmp_path))
    assert np.array_equal(data.data.groups_test["source"], read_tabular_csv(tmp_path).groups_test["source"])
    sim = run_all(personal_sim("localsgdm", "head", model="mlp", data=data, rounds=3))
    fine_tune(sim, 5)
    out = personal_evaluation(sim, sim.algorithm.problem, data)
    masks = site_test_rows(data)
    assert out["site_rows"] == "own" and masks is not None and all(m.any() for m in masks)
    y, x = data.data.y_test.numpy(), data.data.x_test
    problem = sim.algorithm.problem
    gparams, gbuffers = sim.global_model()
    for k, (params, buffers) in enumerate(site_models(sim)):
        with torch.no_grad():
            s = problem.logits(params, buffers, x[masks[k]], train=False)[0].numpy()
            g = problem.logits(gparams, gbuffers, x, train=False)[0].numpy()[masks[k]]
        assert out[f"site_auroc_{k}"] == pytest.approx(roc_auc_score(y[masks[k]], s), abs=1e-12)
        assert out[f"site_global_auroc_{k}"] == pytest.approx(roc_auc_score(y[masks[k]], g), abs=1e-12)
    assert out["personal_auroc_mean"] == pytest.approx(np.mean([out[f"site_auroc_{k}"] for k in range(3)]))
    assert out["personal_auroc_mean"] != out["global_site_auroc_mean"]


def test_without_personalization_every_site_model_is_the_global_model():
    sim = run_all(personal_sim("localsgdm", "none", model="mlp", partition="iid"))
    out = personal_evaluation(sim, sim.algorithm.problem, sim.data)
    assert out["site_rows"] == "all"  # digits has no sites: each model on the whole test set
    for k in range(3):
        assert out[f"site_auroc_{k}"] == pytest.approx(out[f"site_global_auroc_{k}"], abs=1e-9)


def test_a_run_with_fine_tuning_keeps_the_global_model_and_reports_each_site(tmp_path):
    from fedxrisk.experiment import RunConfig, run_experiment

    _sites_table(tmp_path / "data.csv")
    base = dict(dataset="tabular", data_dir=str(tmp_path), imratio=None, partition="source", clients=3,
                rounds=2, stages=1, eval_every=2, tensorboard=False, checkpoint_every=0, model="mlp")  # fmt: skip
    plain = run_experiment(RunConfig(**base), tmp_path / "plain")
    tuned = run_experiment(RunConfig(**base, finetune_steps=4, personal="head"), tmp_path / "tuned")
    assert "personal" not in plain.summary
    block = tuned.summary["personal"]
    assert block["site_rows"] == "own" and block["finetune_steps"] == 4
    assert {f"site_auroc_{k}" for k in range(3)} <= block.keys()
    blob = torch.load(tmp_path / "tuned" / "site_1.pt", weights_only=True)  # model.pt's format
    assert len(block["site_models"]["site_1.pt"]) == 64
    net = build_model(blob["model"], tuple(blob["input_shape"]), 0)
    net.load_state_dict({**blob["params"], **blob["buffers"]})
    fed = make_federated("tabular", 3, "source", None, 0, data_dir=str(tmp_path))
    rows = site_test_rows(fed)[1]
    with torch.no_grad():
        s1 = net.eval()(fed.data.x_test[rows]).reshape(-1).numpy()
    assert block["site_auroc_1"] == pytest.approx(roc_auc_score(fed.data.y_test.numpy()[rows], s1), abs=1e-9)
    header = (tmp_path / "tuned" / "history.csv").read_text().splitlines()[0].split(",")
    assert {"personal_auroc_mean", "site_auroc_2"} <= set(header)  # every evaluation row: the sites' models
    assert "site_auroc_0" not in (tmp_path / "plain" / "history.csv").read_text()
    last = tuned.history[-1]  # before fine-tuning: the personal-head models of the last round
    assert last["personal_auroc_mean"] == pytest.approx(np.mean([last[f"site_auroc_{k}"] for k in range(3)]))
    # a personal head changes training, so compare fine-tuning alone for model.pt
    alone = run_experiment(RunConfig(**base, finetune_steps=4), tmp_path / "alone")
    assert alone.summary["model_sha256"] == plain.summary["model_sha256"]  # model.pt: the global model
    assert alone.summary["personal"]["global_site_auroc_mean"] == pytest.approx(
        np.mean([alone.summary["personal"][f"site_global_auroc_{k}"] for k in range(3)])
    )
    # the global column scores model.pt (before fine-tuning) on each site's own test rows
    from fedxrisk.experiment import build_data, load_model

    data = build_data(RunConfig(**base))[0]
    with torch.no_grad():
        scores = load_model(tmp_path / "plain")(data.data.x_test).reshape(-1).numpy()
    y = data.data.y_test.numpy()
    for k, rows in enumerate(site_test_rows(data)):
        expected = roc_auc_score(y[rows], scores[rows])
        assert alone.summary["personal"][f"site_global_auroc_{k}"] == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"personal": "body"}, "unknown personal 'body'"),
        ({"finetune_steps": -1}, "finetune_steps must be ≥ 0"),
        ({"personal": "head", "privacy": {"level": "client", "noise_multiplier": 1.0, "clip": 1.0}},
         "personal = 'head' with privacy.level = 'client'"),
    ],
)  # fmt: skip
def test_bad_personal_settings_are_one_line_config_errors(settings, message):
    from fedxrisk.experiment import ConfigError, RunConfig, validate

    with pytest.raises(ConfigError, match=message):
        validate(RunConfig(dataset="digits", **settings))


def test_the_torch_free_check_knows_every_personal_choice():
    from fedxrisk.problem import PERSONAL
    from fedxrisk.run.rules import PERSONAL as CHECKED

    assert CHECKED == PERSONAL


def test_ditto_global_model_is_fedavg_and_loop_equals_vmap():
    kw = dict(model="cnn", rounds=3, options={"lam": 0.5})
    loop = run_all(personal_sim("ditto", "none", "loop", **kw))
    vmap = run_all(personal_sim("ditto", "none", "vmap", **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    fedavg = run_all(personal_sim("localsgdm", "none", "loop", model="cnn", rounds=3))
    for key in ("w", "m", "buffers"):
        assert max_abs_diff(loop.states[key], fedavg.states[key]) == 0.0, key
    assert loop.ledger.summary() == fedavg.ledger.summary()  # v never leaves the site
    v = loop.states["v"]
    assert max(float((t - t[:1]).abs().max()) for t in v.values()) > 1e-4  # personal models differ


def test_ditto_with_huge_lambda_is_each_sites_fedavg_global_model():
    """λ → ∞: v is the global model the round started from, i.e. FedAvg's after R − 1 rounds."""
    ditto = run_all(personal_sim("ditto", "none", model="mlp", rounds=3, options={"lam": 1e12}))
    fedavg = run_all(personal_sim("localsgdm", "none", model="mlp", rounds=2))
    ref = {k: t[:1].expand_as(ditto.states["v"][k]) for k, t in fedavg.states["w"].items()}
    assert max_abs_diff(ditto.states["v"], ref) < 1e-6
    loose = run_all(personal_sim("ditto", "none", model="mlp", rounds=3, options={"lam": 0.0}))
    assert max_abs_diff(loose.states["v"], ref) > 1e-3  # λ = 0: each site alone, far from it


def test_ditto_sites_are_evaluated_with_their_personal_model():
    sim = run_all(personal_sim("ditto", "none", model="mlp", options={"lam": 0.1}))
    (params, _), *_ = site_models(sim)
    assert all(torch.equal(params[k], sim.states["v"][k][0]) for k in params)
    with pytest.raises(ValueError, match="lam must be a finite number"):
        personal_sim("ditto", "none", model="mlp", options={"lam": float("inf")})


@pytest.mark.parametrize(
    "alg", one_per_family({n for n, c in ALGORITHMS.items() if c.task == "binary"} - {"coda"})
)  # coda: as codaplus with stages ≥ 2
def test_a_personal_head_works_for_every_algorithm(alg):
    cls = ALGORITHMS[alg]
    kw = dict(
        model="mlp",
        steps=cls.fixed_window or 2,
        options={"positives_per_batch": 4} if cls.positives_per_batch else None,
    )
    loop, vmap = (
        run_all(personal_sim(alg, "head", "loop", **kw)),
        run_all(personal_sim(alg, "head", "vmap", **kw)),
    )
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    own, shared = _split(loop.states["w"], loop.algorithm.problem.local_names)
    assert_equal_across_clients(shared, "w")
    assert max(float((v - v[:1]).abs().max()) for v in own.values()) > 1e-4


def test_a_personal_entry_given_to_gather_is_refused():
    from fedxrisk.algorithms.personal import SiteCollective
    from fedxrisk.engines.ledger import ByteLedger
    from fedxrisk.engines.simulation import LoopEngine

    comm = SiteCollective(SimCollective(2, LoopEngine(), ByteLedger()), frozenset({"head.weight"}))
    tree = {"w": {"head.weight": torch.ones(2, 3), "body.weight": torch.zeros(2, 3)}}
    with pytest.raises(ValueError, match="may not be gathered"):
        comm.gather(tree)
    assert comm.gather({"scores": torch.ones(2, 4)})["scores"].shape == (2, 2, 4)
    out = comm.mean(
        {"w": {"head.weight": torch.tensor([[1.0], [3.0]]), "body.weight": torch.tensor([[1.0], [3.0]])}}
    )
    assert out["w"]["head.weight"].tolist() == [[1.0], [3.0]] and out["w"]["body.weight"].tolist() == [
        [2.0],
        [2.0],
    ]

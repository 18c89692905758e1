"""Class-aware batches for every algorithm on every engine, the p of the AUC losses under them
(p = P/B, fedxrisk.classaware), cnn1d / sized mnist1d, and the study's two-stage start."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from fedxrisk.classaware import class_aware_batches
from fedxrisk.data import make_federated
from fedxrisk.engines import Simulation
from fedxrisk.experiment import ConfigError, RunConfig, validate
from fedxrisk.models import build_model
from fedxrisk.objectives import AUC_LOSSES
from fedxrisk.objectives.conditional import SAME_BATCH, APSurrogate, csg_estimate
from fedxrisk.problem import Problem
from fedxrisk.run.configfile import load_config
from fedxrisk.tree import index
from helpers import PositivesProbe, make_sim, max_abs_diff, run_all

ROOT = Path(__file__).resolve().parents[1]
P, B, STEPS, ROUNDS = 3, 8, 2, 3


def probe_sim(engine: str) -> Simulation:
    data = make_federated("digits", 4, "iid", 0.1, 0)
    problem = Problem(build_model("linear", data.data.input_shape, 0), data.data.pos_ratio)
    probe = PositivesProbe(problem)
    probe = class_aware_batches(probe, P, B)
    from fedxrisk.algorithms import Schedule

    options = {"backend": "aot_eager"} if engine == "compile" else None  # the compiled path, compiled fast
    return Simulation(
        probe, data, Schedule.build(ROUNDS, STEPS, 0.1, 1), B, 0, engine, engine_options=options
    )


def assert_exact_class_aware(states, clients: int) -> None:
    """Every batch of every client held exactly P positives; the AUC losses' p was P/B."""
    n = ROUNDS * STEPS
    assert states["batch_pos_min"].tolist() == [P] * clients
    assert states["batch_pos_max"].tolist() == [P] * clients
    assert states["pos"].tolist() == [P * n] * clients
    assert states["seen"].tolist() == [B * n] * clients
    assert states["p_min"].tolist() == [P / B] * clients  # not the training set's p ≈ 0.1
    assert states["p_max"].tolist() == [P / B] * clients


@pytest.mark.parametrize("engine", ["loop", "vmap", pytest.param("compile", marks=pytest.mark.slow)])
def test_class_aware_batches_hold_exactly_p_positives(engine):
    sim = run_all(probe_sim(engine))
    assert abs(sim.algorithm.problem.pos_ratio - 0.1) < 0.02
    assert_exact_class_aware(sim.states, 4)


def test_flower_sites_draw_the_same_class_aware_batches_as_the_loop_engine(tmp_path):
    """Flower protocol (in-process transport) with positives-per-batch = 4 for CODASCA equals the
    loop engine with 4 positives per batch, whose batches the probe above checks exactly."""
    pytest.importorskip("flwr")
    from test_flower_protocol import run_config, run_local, trial_nodes

    rc = run_config("codasca", tmp_path, **{"positives-per-batch": 4})
    run_local(rc, trial_nodes())
    ref = make_sim("codasca", "loop", clients=2, rounds=3, local_steps=2, batch_size=8, stages=2,
                   partition="iid", imratio=0.3, positives=4)  # fmt: skip
    plain = run_all(make_sim("codasca", "loop", clients=2, rounds=3, local_steps=2, batch_size=8, stages=2))
    run_all(ref)
    model = torch.load(tmp_path / "model.pt")
    assert max_abs_diff(model["params"], ref.global_model()[0]) < 1e-6
    assert max_abs_diff(model["params"], plain.global_model()[0]) > 1e-3  # the option did change batches


@pytest.mark.parametrize("loss", ["square", "aucm"])
def test_auc_loss_uses_p_equal_to_positives_over_batch_size(loss):
    """CODASCA's objective on a class-aware batch is the AUC loss at p = P/B (3/8), not the data's p."""
    sim = make_sim("codasca", "loop", imratio=0.1, positives=P, batch_size=B, options={"loss": loss})
    alg, state = sim.algorithm, index(sim.states, 0)
    batch = index(sim._batch(sim.sampler.next()), 0)
    assert int(batch["y"].sum()) == P
    v = {"w": state["w"], "a": torch.tensor(0.3), "b": torch.tensor(0.6)}
    alpha = torch.tensor(0.2)
    f, _ = alg._objective(v, alpha, state["buffers"], state["p"], batch)
    s = torch.sigmoid(alg.problem.logits(v["w"], state["buffers"], batch["x"])[0])
    extra = (alg.margin,) if loss == "aucm" else ()
    expected = AUC_LOSSES[loss](s, batch["y"], v["a"], v["b"], alpha, torch.tensor(P / B), *extra)
    train_p = AUC_LOSSES[loss](s, batch["y"], v["a"], v["b"], alpha, torch.tensor(0.1), *extra)
    assert torch.allclose(f, expected, atol=1e-7)
    assert not torch.allclose(f, train_p, atol=1e-3)


def test_positives_per_batch_is_a_data_setting_with_clear_errors():
    cfg = load_config(None, ["data.positives_per_batch=6", 'algorithm.algorithm="codaplus"'])
    assert cfg.positives_per_batch == 6
    with pytest.raises(
        ConfigError, match="positives_per_batch is a data setting for codasca: use data.positives_per_batch"
    ):
        validate(RunConfig(options={"positives_per_batch": 6}))
    with pytest.raises(ConfigError, match="pos_ratio_mode 'local' contradicts class-aware batches"):
        from fedxrisk.experiment import build

        build(RunConfig(positives_per_batch=6, pos_ratio_mode="local", rounds=3))
    with pytest.raises(
        ConfigError, match=r"positives_per_batch must lie in \[1, batch_size − 1\] = \[1, 31\], got 32"
    ):
        from fedxrisk.experiment import build

        build(RunConfig(positives_per_batch=32, rounds=3))


@pytest.mark.parametrize("algorithm", ["fedxl1", "fedxl2"])
def test_fedxl_default_positives_fit_a_small_batch_and_stay_16_otherwise(algorithm):
    """FeDXL's own B1 = 16 left a batch of 16 no negatives and was refused: the default is halved
    to batch_size // 2 there; a batch above 16 keeps 16; a P the user sets is refused as before."""
    from fedxrisk.experiment import build
    from fedxrisk.run.checks import check

    def positives(batch_size: int, **changes) -> tuple[int, float]:
        cfg = RunConfig(dataset="digits", algorithm=algorithm, clients=2, rounds=1, stages=1,
                        batch_size=batch_size, eval_every=1, **changes)  # fmt: skip
        assert check(cfg) == []
        alg = build(cfg).algorithm
        return alg.positives_per_batch, alg.problem.sampled_pos_ratio

    assert positives(16) == (8, 0.5)
    assert positives(8) == (4, 0.5)
    assert positives(17) == (16, 16 / 17)
    assert positives(32) == (16, 0.5)
    assert positives(16, positives_per_batch=4) == (4, 0.25)
    [error] = check(RunConfig(algorithm=algorithm, batch_size=16, positives_per_batch=16))
    assert "positives_per_batch must lie in [1, batch_size − 1] = [1, 15], got 16" in str(error)


def test_mnist1d_size_is_configurable_and_seeded_and_cnn1d_reads_both_layouts():
    pytest.importorskip("mnist1d")
    from fedxrisk.data.mnist1d import load_mnist1d

    a, b = load_mnist1d(num_samples=300), load_mnist1d(num_samples=300)
    assert (len(a.y_train), len(a.y_test)) == (210, 90)
    assert (a.x_train == b.x_train).all() and (a.y_test == b.y_test).all()
    fed = make_federated("mnist1d", 2, "iid", None, 0, num_samples=300)  # through the federated builder
    assert len(fed.data.y_train) + len(fed.data.y_test) == 300
    with pytest.raises(ConfigError, match="num_samples sizes a generated dataset"):
        validate(RunConfig(num_samples=500))  # digits is not generated
    net = build_model("cnn1d", (40,), 0)
    x = torch.randn(5, 40)
    assert net(x).shape == (5, 1)
    assert torch.equal(net(x), net(x[:, None, :]))


def test_fcsg_scores_a_plain_batch_once_with_the_same_gradient():
    """The AP surrogate's one-pass path (xi[SAME_BATCH]) equals scoring b + b² inputs."""
    torch.manual_seed(0)
    problem = Problem(build_model("mlp", (6,), 0), 0.3)
    x, y = torch.randn(8, 6), torch.tensor([1, 0, 1, 0, 0, 0, 1, 0])
    obj = APSurrogate(0.6)
    fast = obj.from_batch({"x": x, "y": y})
    slow = {**fast, "xi": {"x": x}}
    assert SAME_BATCH in fast["xi"]
    params, buffers = problem.init_model()
    (g1, f1), (g2, f2) = (csg_estimate(obj, problem, params, buffers, s) for s in (fast, slow))
    assert abs(float(f1 - f2)) < 1e-6 and max_abs_diff(g1, g2) < 1e-6


def _evidence():
    spec = importlib.util.spec_from_file_location("evidence", ROOT / "benchmarks" / "evidence" / "study.py")
    evidence = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evidence)
    return evidence


def test_two_stage_starts_from_exactly_the_pretrained_model(tmp_path, monkeypatch):
    """benchmarks/evidence/study.py: a two-stage cell's config starts (model.init_from) from CE's run folder."""
    from fedxrisk.run.build import build

    evidence = _evidence()
    pre = build_model("mlp", (1, 8, 8), 7)  # weights the AUC run's own seed would not draw
    blob = {"params": dict(pre.named_parameters()), "buffers": dict(pre.named_buffers())}
    torch.save({k: {n: t.detach() for n, t in v.items()} for k, v in blob.items()}, tmp_path / "model.pt")
    monkeypatch.setattr(evidence, "pretrained_path", lambda regime, seed: tmp_path)
    cfg = evidence.run_config("digits", "codasca_code", 1.0, 0, True)
    assert cfg.init_from == str(tmp_path) and cfg.rounds == evidence.REGIMES["digits"]["rounds"] // 2
    sim = build(cfg).simulation
    params, _ = sim.global_model()
    for name, t in pre.named_parameters():
        assert torch.equal(params[name], t.detach())
        assert all(torch.equal(sim.states["w"][name][k], t.detach()) for k in range(sim.num_clients))
        assert torch.equal(sim.states["ref"]["w"][name][0], t.detach())  # the stage's reference point too
    scratch = build(evidence.run_config("digits", "codasca_code", 1.0, 0, False)).simulation
    assert max_abs_diff(scratch.global_model()[0], params) > 1e-2
    assert json.dumps(evidence.lr_grid("ce")) == "[0.1, 0.3, 1.0]"


def test_study_validation_is_the_run_layers_20_percent_per_client_and_class():
    """benchmarks/evidence/study.py carves validation with data.validation (no code of its own)."""
    from fedxrisk.run.build import build_data

    evidence = _evidence()
    cfg = evidence.run_config("digits", "ce", 0.3, 0, False)
    assert (cfg.validation, cfg.selection, cfg.monitor) == (0.2, "last", "val_auroc")
    assert evidence.run_config("digits", "fedxl2", 1.5, 0, False).monitor == "val_pauc30_norm"
    whole = make_federated("digits", cfg.clients, cfg.partition, cfg.imratio, 0, allow_missing_class=True)
    fed, _ = build_data(cfg)
    y, yv = whole.data.y_train.numpy(), fed.data.y_val.numpy()
    for shard, val in zip(whole.shards, fed.val_shards):
        for c in (0, 1):
            n = int((y[shard] == c).sum())
            assert int((yv[val] == c).sum()) == (min(max(1, round(0.2 * n)), n - 1) if n >= 2 else 0)

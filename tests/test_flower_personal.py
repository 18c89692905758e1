"""Personalization on Flower (issue 33), in process (LocalTransport): FedBN, a personal head, Ditto and
fine-tuning train every site exactly as the loop engine trains client k, no personal entry ever reaches
the server, and each site's own numbers are ``fedxrisk run``'s per-site columns and summary block."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.algorithms.personal import start_values
from fedxrisk.data import make_federated
from fedxrisk.engines import Simulation
from fedxrisk.engines.personal import fine_tune, site_metrics, site_models
from fedxrisk.engines.server_opt import ServerOptimizer, with_server_optimizer
from fedxrisk.errors import ConfigError
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.coordinator import Coordinator, LocalTransport
from fedxrisk.flower.wire import unflatten
from fedxrisk.metrics import evaluate
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from fedxrisk.tree import tmap
from helpers import max_abs_diff, run_all

K, ROUNDS, STEPS, BATCH, LR = 2, 3, 2, 8, 0.1
SPLIT = {"partition": "iid", "imratio": 0.3, "seed": 0}
TOL = 1e-6  # as tests/test_flower_protocol.py


def run_config(out_dir, algorithm="localsgdm", model="mlp", **kw) -> dict:
    return {
        "algorithm": algorithm, "model": model, "rounds": ROUNDS, "local-steps": STEPS, "batch-size": BATCH,
        "lr": LR, "stages": 2 if algorithm == "codasca" else 1, "eval-every": 1, "test-data": "digits",
        "out-dir": str(out_dir), "min-nodes": K, **SPLIT, **kw,
    }  # fmt: skip


def trial_nodes() -> dict[int, dict]:
    return {1000 + i: {"dataset": "digits", "partition-id": i, "num-partitions": K} for i in range(K)}


class SpyTransport(LocalTransport):
    """Everything the server receives: every tensor name of every reply, and the reply metrics."""

    def __init__(self, *args):
        super().__init__(*args)
        self.received: list[str] = []
        self.metrics: list[str] = []

    def answer(self, node, request, op):
        reply = super().answer(node, request, op)
        for group, tensors in reply.arrays.items():
            self.received += [f"{group}:{name}" for name in tensors]
        self.metrics += list(reply.metrics)
        return reply


def run_flower(rc: dict, nodes: dict | None = None):
    transport = SpyTransport(rc, nodes or trial_nodes())
    summary = Coordinator(FlowerConfig.from_run_config(rc), transport, poll_interval=0.01).run()
    return summary, transport


def loop_reference(rc: dict, personal="none", options=None, server=None):
    """The loop engine on the same split, model, seed and schedule (before fine-tuning)."""
    data = make_federated("digits", K, SPLIT["partition"], SPLIT["imratio"], SPLIT["seed"])
    net = build_model(rc["model"], data.data.input_shape, SPLIT["seed"])
    problem = Problem(net, data.data.pos_ratio, personal=personal)
    algorithm = ALGORITHMS[rc["algorithm"]](problem, **(options or {}))
    if server is not None:
        algorithm = with_server_optimizer(algorithm, ServerOptimizer(**server))
    schedule = Schedule.build(ROUNDS, STEPS, LR, rc["stages"])
    return run_all(Simulation(algorithm, data, schedule, BATCH, SPLIT["seed"], "loop"))


def server_global(sim):
    """The global model Flower's server can form: the loop's, personal entries at their start."""
    return start_values(sim.algorithm.problem, *sim.global_model())


def expected_numbers(sim):
    return site_metrics(sim.algorithm.problem, site_models(sim), server_global(sim), sim.data)


def site_states(transport):
    return [unflatten(transport.saved[node].arrays["state"]) for node in sorted(transport.saved)]


def last_row(out_dir) -> dict:
    with open(out_dir / "history.csv", newline="") as f:
        return list(csv.DictReader(f))[-1]


def assert_numbers(got: dict, expected: dict, keys) -> None:
    for key in keys:
        e, g = expected[key], got[key]
        assert (g is None or math.isnan(g)) if math.isnan(e) else g == pytest.approx(e, abs=TOL), key


SITE_KEYS = [f"site_{m}_{k}" for m in ("auroc", "ap", "global_auroc") for k in range(K)]
MEANS = ["personal_auroc_mean", "global_site_auroc_mean"]


ADAM = {"optimizer": "adam", "lr": 0.02}


@pytest.mark.parametrize(
    "algorithm, personal, model, finetune, server",
    [
        ("localsgdm", "head", "mlp", 0, None),
        ("localsgdm", "bn", "cnn", 3, None),
        ("codasca", "head", "mlp", 2, None),
        ("localsgdm", "head", "mlp", 1, ADAM),  # FedAdam composed with a personal head
    ],
)
def test_personal_entries_on_flower_equal_the_loop_engine(
    algorithm, personal, model, finetune, server, tmp_path
):
    extra = {"finetune-steps": finetune, **({"server": json.dumps(server)} if server else {})}
    rc = run_config(tmp_path, algorithm, model, personal=personal, **extra)
    summary, transport = run_flower(rc)
    sim = loop_reference(rc, personal, server=server)
    problem = sim.algorithm.problem
    # the global model: the shared entries are the loop's; the personal ones never reached the server
    saved = torch.load(tmp_path / "model.pt")
    g_params, g_buffers = server_global(sim)
    assert max_abs_diff(saved["params"], g_params) < TOL
    assert saved["buffers"].keys() == g_buffers.keys()
    assert not g_buffers or max_abs_diff(saved["buffers"], g_buffers) < TOL
    metrics = evaluate(problem, g_params, g_buffers, sim.data)
    assert summary["final"]["test_auroc"] == pytest.approx(metrics["test_auroc"], abs=TOL)
    assert summary["communication"] == sim.ledger.summary()  # the bytes the loop engine sends
    # the last evaluation row: every site's own model (before fine-tuning), fedxrisk run's columns
    row, before = last_row(tmp_path), expected_numbers(sim)
    for key in (*MEANS, *(f"site_auroc_{k}" for k in range(K))):
        assert float(row[key]) == pytest.approx(before[key], abs=TOL), key
    fine_tune(sim, finetune)
    for k, state in enumerate(site_states(transport)):  # every entry of every site, fine-tuned
        assert max_abs_diff(state, tmap(lambda x, k=k: x[k : k + 1], sim.states)) < TOL
    block = summary["personal"]
    after = site_metrics(problem, site_models(sim), (g_params, g_buffers), sim.data)
    assert block["site_rows"] == after["site_rows"] == "all"  # digits: each site on the whole test split
    assert block["personal"] == personal and block["finetune_steps"] == finetune
    assert_numbers(block, after, [*SITE_KEYS, *MEANS])
    names = problem.local_names  # the sites' personal entries differ: each site has its own model
    spread = max(float((v - v[:1]).abs().max()) for k, v in sim.states["w"].items() if k in names)
    assert spread > 1e-4


@pytest.mark.parametrize("personal, model", [("head", "mlp"), ("bn", "cnn")])
def test_the_server_never_receives_a_personal_entry(personal, model, tmp_path):
    """As an attacker on the server: every tensor of every reply (collective payloads, reported models,
    validation counts) is named, and none is a personal entry; without personalization the same spy
    sees them, so the check can fail."""
    _, plain = run_flower(run_config(tmp_path / "plain", model=model))
    _, spied = run_flower(run_config(tmp_path / "own", model=model, personal=personal))
    names = Problem(build_model(model, (1, 8, 8) if model == "cnn" else (64,), 0), 0.3, personal=personal)
    personal_names = names.local_names

    def personal_in(received):
        return sorted({r for r in received if r.rsplit("/", 1)[-1] in personal_names})

    assert personal_in(plain.received)  # payloads ("payload:w/…", "payload:m/…") and reports ("model:…")
    assert any(r.startswith("payload:") for r in personal_in(plain.received))
    assert any(r.startswith("model:") for r in personal_in(plain.received))
    assert personal_in(spied.received) == []
    assert {r.split(":")[0] for r in spied.received} >= {"payload", "model"}


def test_ditto_on_flower_equals_the_loop_engine(tmp_path):
    """Ditto's personal model v stays in the site's state; its numbers are fedxrisk run's."""
    options = {"lam": 0.5}
    rc = run_config(tmp_path, "ditto", options=json.dumps(options))
    nodes = {
        n: {**c, "site-model": str(tmp_path / f"own-{i}.pt")}
        for i, (n, c) in enumerate(trial_nodes().items())
    }
    summary, transport = run_flower(rc, nodes)
    sim = loop_reference(rc, options=options)
    for k, (params, _) in enumerate(site_models(sim)):  # node config site-model: v, on the site
        written = torch.load(tmp_path / f"own-{k}.pt")
        assert max_abs_diff(written["params"], params) < TOL and written["model"] == "mlp"
    assert max_abs_diff(torch.load(tmp_path / "model.pt")["params"], sim.global_model()[0]) < TOL
    for k, state in enumerate(site_states(transport)):
        assert max_abs_diff(state, tmap(lambda x, k=k: x[k : k + 1], sim.states)) < TOL
    assert not [r for r in transport.received if "/v/" in f"/{r.split(':')[1]}"]  # v is never sent
    expected = expected_numbers(sim)
    assert_numbers(summary["personal"], expected, [*SITE_KEYS, *MEANS])
    row = last_row(tmp_path)
    assert float(row["site_auroc_1"]) == pytest.approx(expected["site_auroc_1"], abs=TOL)
    assert expected["site_auroc_0"] != pytest.approx(expected["site_global_auroc_0"], abs=1e-6)


def test_fine_tuning_alone_reports_the_sites_and_keeps_the_global_model(tmp_path):
    plain, _ = run_flower(run_config(tmp_path / "plain"))
    summary, transport = run_flower(run_config(tmp_path / "tuned", **{"finetune-steps": 4}))
    a, b = (torch.load(tmp_path / d / "model.pt")["params"] for d in ("plain", "tuned"))
    assert max_abs_diff(a, b) == 0.0  # model.pt: the global model, before fine-tuning
    assert "personal" not in plain and "site_auroc_0" not in last_row(tmp_path / "plain")
    assert "site_auroc_0" not in last_row(tmp_path / "tuned")  # sites equal during training: no columns
    sim = loop_reference(run_config(tmp_path))
    global_model = sim.global_model()
    fine_tune(sim, 4)
    expected = site_metrics(sim.algorithm.problem, site_models(sim), global_model, sim.data)
    assert_numbers(summary["personal"], expected, [*SITE_KEYS, *MEANS])
    for k, state in enumerate(site_states(transport)):
        assert max_abs_diff(state["w"], tmap(lambda x, k=k: x[k : k + 1], sim.states["w"])) < TOL


def test_folder_sites_score_their_own_test_file(tmp_path):
    """A data-dir site with test.npz scores its models on it (site_rows "own"); the numbers are the
    sklearn AUROC of the site's model on exactly those rows."""
    from sklearn.metrics import roc_auc_score

    from fedxrisk.flower.sitedata import export_trial

    rc = run_config(tmp_path / "out", personal="head", **{"finetune-steps": 2})
    folders = export_trial(FlowerConfig.from_run_config(rc), "digits", K, tmp_path / "sites")
    with np.load(folders[1] / "test.npz") as f:  # site 1 keeps only half of the test split
        x, y = f["x"][::2], f["y"][::2]
    np.savez(folders[1] / "test.npz", x=x, y=y)
    nodes = {2000 + i: {"data-dir": str(f), "partition-id": i} for i, f in enumerate(folders)}
    summary, transport = run_flower(rc, nodes)
    block = summary["personal"]
    assert block["site_rows"] == "own"
    state = site_states(transport)[1]
    problem = Problem(build_model("mlp", (64,), 0), 0.3, personal="head")
    params = {k: v[0] for k, v in state["w"].items()}
    with torch.no_grad():
        s = problem.logits(params, {}, torch.from_numpy(x), train=False)[0].numpy()
    assert block["site_auroc_1"] == pytest.approx(roc_auc_score(y, s), abs=1e-9)


def test_under_client_dp_no_site_sends_its_numbers(tmp_path):
    """Under DP no per-site metric leaves a site (as no AUROC does); the block says so."""
    privacy = {"level": "client", "noise_multiplier": 0.5, "clip": 1.0}
    rc = run_config(tmp_path, privacy=json.dumps(privacy), **{"finetune-steps": 2})
    summary, transport = run_flower(rc)
    assert not [m for m in transport.metrics if "site" in m]
    block = summary["personal"]
    assert block["note"].startswith("per-site metrics are not sent")
    assert all(block[key] is None for key in SITE_KEYS)  # NaN in summary.json


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"personal": "bn"}, "personal = 'bn': the model .* has no BatchNorm layer"),
        (
            {"personal": "head", "selection": "best", "validation": 0.2},
            "personal = 'head' with selection = 'best'",
        ),
        ({"personal": "head", "early-stopping": 2, "validation": 0.2}, "use selection = 'last'"),
    ],
)
def test_refusals_are_one_line_and_write_no_model(settings, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        run_flower(run_config(tmp_path, **settings))
    assert not (tmp_path / "model.pt").exists()
    assert not (tmp_path / "summary.json").exists()  # refused with the run config, before any output


def test_through_the_client_app_and_under_secure_aggregation(tmp_path):
    """The real ClientApp behind an in-process Grid carries the sites' numbers as LocalTransport does;
    with SecAgg+ the shared entries are summed securely (the plain model to the quantization's
    tolerance) and no site sends its numbers."""
    pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")
    from fedxrisk.flower.app import GridTransport, client_app
    from flower_grid import InProcessGrid

    def grid_run(rc):
        cfg = FlowerConfig.from_run_config(rc)
        grid = InProcessGrid(client_app, rc, trial_nodes())
        return Coordinator(cfg, GridTransport(grid, cfg), poll_interval=0.01).run()

    rc = run_config(tmp_path / "local", personal="head", **{"finetune-steps": 2})
    local, _ = run_flower(rc)
    plain = grid_run({**rc, "out-dir": str(tmp_path / "plain")})
    assert plain["personal"] == local["personal"]
    secure = grid_run({**rc, "out-dir": str(tmp_path / "secure"), "secure-aggregation": True})
    assert secure["status"] == "completed", secure["error"]
    a, b = (torch.load(tmp_path / d / "model.pt")["params"] for d in ("plain", "secure"))
    assert 0 < max_abs_diff(a, b) < 1e-5  # not bitwise: the shared entries were quantized
    assert secure["personal"]["note"].startswith("per-site metrics are not sent")
    assert all(secure["personal"][key] is None for key in SITE_KEYS)
    assert all(local["personal"][key] is not None for key in SITE_KEYS)


def test_a_site_model_path_in_no_folder_is_refused_at_set_up(tmp_path):
    from fedxrisk.flower.coordinator import FederationError

    nodes = trial_nodes()
    nodes[1001]["site-model"] = str(tmp_path / "nowhere" / "own.pt")
    with pytest.raises(
        FederationError, match="node config site-model must be a file path in an existing folder"
    ):
        run_flower(run_config(tmp_path / "out", personal="head"), nodes)
    assert not (tmp_path / "out" / "model.pt").exists()


def test_a_bad_test_file_is_named_by_its_site(tmp_path):
    from fedxrisk.flower.coordinator import FederationError
    from fedxrisk.flower.sitedata import export_trial

    rc = run_config(tmp_path / "out", personal="head")
    folders = export_trial(FlowerConfig.from_run_config(rc), "digits", K, tmp_path / "sites")
    np.savez(folders[1] / "test.npz", x=np.zeros((4, 3), np.float32), y=np.zeros(4, np.float32))
    nodes = {2000 + i: {"data-dir": str(f), "partition-id": i} for i, f in enumerate(folders)}
    with pytest.raises(
        FederationError, match=r"site-1/test.npz: inputs of shape \(3,\), training inputs \(1, 8, 8\)"
    ):
        run_flower(rc, nodes)

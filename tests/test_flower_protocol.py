"""The Flower protocol without Flower: sites and coordinator in one process (LocalTransport).

Every message goes through the same handlers a Flower ClientApp runs, with the
site's state saved and restored between messages, so these tests check the
replay of ``communicate``, the server-side reductions and the site-data
checks exactly; ``test_flower_deploy.py`` adds the real SuperLink/SuperNodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS, RoundContext
from fedxrisk.algorithms.base import State, model_payload, with_model
from fedxrisk.algorithms.fedavg import LocalSGDM
from fedxrisk.experiment import ConfigError
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.coordinator import Coordinator, FederationError, LocalTransport
from fedxrisk.flower.sitedata import export_trial, load_trial
from fedxrisk.flower.wire import flatten, unflatten
from fedxrisk.metrics import evaluate
from fedxrisk.tree import tmap
from helpers import make_sim, max_abs_diff, one_per_family, run_all

K = 2
SPLIT = {"partition": "iid", "imratio": 0.3, "seed": 0}


def options(algorithm: str) -> dict:
    """Class-aware algorithms (FeDXL, Local Pair): B1 = 4 positives + 4 negatives in the batch of 8."""
    return {"positives_per_batch": 4} if ALGORITHMS[algorithm].positives_per_batch else {}


def run_config(algorithm: str, out_dir, **kw) -> dict:
    fixed = ALGORITHMS[algorithm].fixed_window
    base = {
        "algorithm": algorithm, "rounds": 3, "local-steps": fixed or 2, "batch-size": 8, "lr": 0.1,
        "stages": 2, "test-data": "digits", "out-dir": str(out_dir), "min-nodes": K,
        "options": json.dumps(options(algorithm)), **SPLIT,
    }  # fmt: skip
    return {**base, **kw}


def trial_nodes(k: int = K) -> dict[int, dict]:
    return {1000 + i: {"dataset": "digits", "partition-id": i, "num-partitions": k} for i in range(k)}


def run_local(rc: dict, nodes: dict[int, dict], transport_cls=LocalTransport):
    transport = transport_cls(rc, nodes)
    summary = Coordinator(FlowerConfig.from_run_config(rc), transport, poll_interval=0.01).run()
    return summary, transport


def reference(algorithm: str, rc: dict):
    """The loop engine on the same split, seed and schedule."""
    sim = run_all(
        make_sim(
            algorithm, "loop", clients=K, rounds=rc["rounds"], local_steps=rc["local-steps"],
            batch_size=rc["batch-size"], lr=rc["lr"], stages=rc["stages"], options=json.loads(rc["options"]),
            partition=rc["partition"], imratio=rc["imratio"], seed=rc["seed"],
        )
    )  # fmt: skip
    params, buffers = sim.global_model()
    return sim, params, evaluate(sim.algorithm.problem, params, buffers, sim.data)


@pytest.mark.parametrize(
    "algorithm", one_per_family({n for n, c in ALGORITHMS.items() if c.task == "binary"})
)
def test_protocol_matches_loop_engine(algorithm, tmp_path):
    """Same seed and partition: same model, metrics and bytes as the loop engine (every algorithm)."""
    rc = run_config(algorithm, tmp_path)
    summary, transport = run_local(rc, trial_nodes())
    sim, params, metrics = reference(algorithm, rc)
    model = torch.load(tmp_path / "model.pt")
    assert max_abs_diff(model["params"], params) < 1e-6
    for key in ("test_auroc", "test_ap", "client_auroc_mean"):
        assert summary["final"][key] == pytest.approx(metrics[key], abs=1e-6)
    assert summary["final"]["train_loss"] == pytest.approx(sim.train_loss(), abs=1e-6)
    assert summary["communication"] == sim.ledger.summary()
    assert summary["status"] == "completed" and summary["rounds"] == 3
    for k, node in enumerate(sorted(transport.saved)):  # every client's whole state (pools, u, ...)
        site_state = unflatten(transport.saved[node].arrays["state"])
        assert max_abs_diff(site_state, tmap(lambda x, k=k: x[k : k + 1], sim.states)) < 1e-6
    # one message per collective call and site, plus set-up and the closing message
    calls = sum(summary["communication"]["collective_calls"].values())
    assert transport.messages == K * (calls + 2)


def test_protocol_matches_loop_engine_with_the_code_form_options(tmp_path):
    """Issue 13.3: CODASCA form = "code" (own prox reference per site, variates kept at the
    stage end, sequential α step) replays exactly through the Flower protocol."""
    rc = run_config("codasca", tmp_path, options=json.dumps({"form": "code"}))
    summary, transport = run_local(rc, trial_nodes())
    sim, params, _ = reference("codasca", rc)
    assert max_abs_diff(torch.load(tmp_path / "model.pt")["params"], params) < 1e-6
    for k, node in enumerate(sorted(transport.saved)):
        site_state = unflatten(transport.saved[node].arrays["state"])
        assert max_abs_diff(site_state, tmap(lambda x, k=k: x[k : k + 1], sim.states)) < 1e-6
    assert summary["communication"] == sim.ledger.summary()


def test_coordinator_refuses_coda_with_one_stage(tmp_path):
    """Issue 13.2 through Flower: the coordinator's assembly runs the engines' schedule check and
    refuses as `fedxrisk run` does (a ConfigError: the user's setting, not a failed site)."""
    with pytest.raises(ConfigError, match="coda needs stages ≥ 2"):
        run_local(run_config("coda", tmp_path, stages=1), trial_nodes())


def test_sites_of_unequal_size_agree_on_max_samples(tmp_path):
    """FeDXL2's per-sample u is sized by the largest shard over all sites (405 and 495 samples here):
    the server derives it from the set-up counts; class-aware batches, the begin gather, pools
    and u then equal the loop engine's."""
    rc = run_config("fedxl2", tmp_path, rounds=2, stages=1, partition="dirichlet")
    summary, transport = run_local(rc, trial_nodes())
    sim, params, _ = reference("fedxl2", rc)
    assert [s["samples"] for s in summary["sites"]] == [405, 495]
    for k, node in enumerate(sorted(transport.saved)):
        state = unflatten(transport.saved[node].arrays["state"])
        assert state["log_u"].shape == (1, 495)
        assert max_abs_diff(state, tmap(lambda x, k=k: x[k : k + 1], sim.states)) < 1e-6
    assert max_abs_diff(torch.load(tmp_path / "model.pt")["params"], params) < 1e-6
    assert summary["communication"] == sim.ledger.summary()


def test_positives_per_batch_must_leave_room_for_negatives_in_the_run_config():
    """FeDXL's default B1 = 16 is halved at batch 8 (RunConfig.resolved_positives), as in ``fedxrisk
    run``; a P the user sets that leaves no negatives is refused."""
    assert (
        FlowerConfig.from_run_config({"algorithm": "fedxl2", "batch-size": 8}).run.resolved_positives() == 4
    )
    with pytest.raises(ConfigError, match=r"positives-per-batch must lie in .* = \[1, 7\], got 8"):
        FlowerConfig.from_run_config({"algorithm": "fedxl2", "batch-size": 8, "positives-per-batch": 8})
    cfg = FlowerConfig.from_run_config(
        {"algorithm": "fedxl2", "batch-size": 8, "options": '{"positives_per_batch": 3}'}
    )
    assert cfg.run.options == {"positives_per_batch": 3}


@dataclass
class GatherPool(LocalSGDM):
    """A test algorithm with FeDXL's communication shape: gather a per-client score pool,
    then a mean that depends on the gathered pool (two dependent collectives a round)."""

    name = "test_gatherpool"

    def init(self, client):
        state = super().init(client)
        return {**state, "pool": torch.zeros(4), "shift": torch.zeros(())}

    def local_step(self, state, batch, ctx):
        new = super().local_step(state, batch, ctx)
        logits, _ = self.problem.logits(new["w"], new["buffers"], batch["x"][:4])
        return dict(new, pool=torch.sigmoid(logits))

    def communicate(self, state: State, comm, ctx: RoundContext) -> State:
        pools = comm.gather({"pool": state["pool"]})["pool"]  # [clients here, K, 4]
        shift = pools.amax(dim=(-2, -1)) - state["pool"].mean(-1)  # depends on every site's pool
        avg = comm.mean({**model_payload(state, self.problem), "m": state["m"], "shift": shift})
        return dict(with_model(state, avg), m=avg["m"], shift=avg["shift"])


def test_gather_is_merged_on_the_server_and_dependent_collectives_replay(tmp_path, monkeypatch):
    monkeypatch.setitem(ALGORITHMS, GatherPool.name, GatherPool)
    rc = run_config(GatherPool.name, tmp_path, stages=1)
    summary, transport = run_local(rc, trial_nodes())
    sim, params, _ = reference(GatherPool.name, rc)
    assert max_abs_diff(torch.load(tmp_path / "model.pt")["params"], params) < 1e-6
    assert summary["communication"] == sim.ledger.summary()
    assert summary["communication"]["collective_calls"] == {"gather": 3, "mean": 3}
    pool_bytes = 4 * 4
    assert summary["communication"]["by_variable"]["pool"] == {
        "up": 3 * pool_bytes,
        "down": 3 * K * pool_bytes,
    }
    saved = transport.saved[1000]  # the last round's gathered shift lives in the site's saved state
    assert float(unflatten(saved.arrays["state"])["shift"][0]) == pytest.approx(float(sim.states["shift"][0]))


def test_folder_sites_reproduce_the_trial(tmp_path):
    """Sites reading their own exported folders (data-dir) train exactly like trial sites."""
    cfg = FlowerConfig.from_run_config({**SPLIT})
    folders = export_trial(cfg, "digits", K, tmp_path / "sites")
    nodes = {2000 + i: {"data-dir": str(f), "partition-id": i} for i, f in enumerate(folders)}
    rc = run_config("localsgdm", tmp_path / "a", **{"test-data": str(tmp_path / "sites" / "test.npz")})
    folder_summary, _ = run_local(rc, nodes)
    trial_summary, _ = run_local(run_config("localsgdm", tmp_path / "b"), trial_nodes())
    assert folder_summary["final"] == trial_summary["final"]
    assert folder_summary["communication"] == trial_summary["communication"]


def test_streaming_sites_read_their_own_files_lazily_and_reproduce_the_trial(tmp_path, monkeypatch):
    """Sites with node config stream = true decode train.npz per batch (memory-mapped): same run."""
    from fedxrisk.data.stream import Stream

    fetched = []
    fetch = Stream.fetch
    monkeypatch.setattr(
        Stream, "fetch", lambda self, index: fetched.append(index.shape) or fetch(self, index)
    )
    cfg = FlowerConfig.from_run_config({**SPLIT})
    folders = export_trial(cfg, "digits", K, tmp_path / "sites")
    nodes = {
        2000 + i: {"data-dir": str(f), "partition-id": i, "stream": True, "workers": 1}
        for i, f in enumerate(folders)
    }
    rc = run_config("codasca", tmp_path / "a", **{"test-data": str(tmp_path / "sites" / "test.npz")})
    streamed, _ = run_local(rc, nodes)
    trial, _ = run_local(run_config("codasca", tmp_path / "b"), trial_nodes())
    assert len(fetched) == K * rc["rounds"] * rc["local-steps"] and fetched[0] == (1, rc["batch-size"])
    assert streamed["final"] == trial["final"]
    assert streamed["communication"] == trial["communication"]


def _site(folder, x, y, with_val=False):
    folder.mkdir(parents=True)
    np.savez(folder / "train.npz", x=x, y=y)
    if with_val:
        np.savez(folder / "val.npz", x=x[:20], y=y[:20])
    return str(folder)


def test_a_site_with_a_val_file_gives_val_auroc_and_csv_sites_work(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 5)).astype(np.float32)
    y = (x[:, 0] + 0.3 * rng.normal(size=120) > 0.5).astype(np.float32)
    header = ",".join([*(f"f{i}" for i in range(5)), "label"])
    csv_dir = tmp_path / "csv-site"
    csv_dir.mkdir()
    rows = "\n".join(",".join(map(str, [*row, label])) for row, label in zip(x[60:].tolist(), y[60:]))
    (csv_dir / "train.csv").write_text(header + "\n" + rows + "\n")
    nodes = {
        1: {"data-dir": _site(tmp_path / "npz-site", x[:60], y[:60], with_val=True)},
        2: {"data-dir": str(csv_dir)},
    }
    rc = run_config("codasca", tmp_path / "out", stages=1, **{"test-data": "", "model": "linear"})
    summary, _ = run_local(rc, nodes)
    history = (tmp_path / "out" / "history.csv").read_text().splitlines()
    row = dict(zip(history[0].split(","), history[-1].split(",")))
    assert 0.5 < float(row["val_auroc"]) <= 1.0  # one site has a val split: its histograms alone
    assert 0 <= float(row["val_auroc_bound"]) < 0.05
    assert summary["final"]["test_auroc"] is None  # no held-out set on the server
    assert [s["samples"] for s in summary["sites"]] == [60, 60]


def test_missing_data_folder_is_reported_by_the_site(tmp_path):
    nodes = {**trial_nodes(1), 7: {"data-dir": str(tmp_path / "nowhere"), "partition-id": 1}}
    rc = run_config("codasca", tmp_path / "out")
    with pytest.raises(
        FederationError, match=r"set-up: node 7 failed: SiteDataError: data-dir .*nowhere.* does not exist"
    ):
        run_local(rc, nodes)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and "nowhere" in summary["error"]


def test_site_without_positives_is_reported_and_can_be_allowed(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    good = _site(tmp_path / "good", x, (x[:, 0] > 0).astype(np.float32))
    bad = _site(tmp_path / "bad", x, np.zeros(40, np.float32))
    nodes = {1: {"data-dir": good}, 2: {"data-dir": bad}}
    rc = run_config("codasca", tmp_path / "out", stages=1, rounds=1, **{"test-data": "", "model": "linear"})
    with pytest.raises(FederationError, match=r"node 2 failed: .*no positive \(label 1\) example among 40"):
        run_local(rc, nodes)
    rc = {**rc, "allow-missing-class": True, "out-dir": str(tmp_path / "out2")}
    summary, _ = run_local(rc, nodes)
    assert summary["status"] == "completed" and summary["sites"][1]["positives"] == 0


def test_a_site_with_nan_features_is_refused_at_set_up_and_alone_named(tmp_path):
    """Before: set-up passed and round 1 blamed both sites ("non-finite loss or model")."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    bad_x = x.copy()
    bad_x[[4, 9], 1] = np.nan
    nodes = {
        1: {"data-dir": _site(tmp_path / "good", x, y)},
        2: {"data-dir": _site(tmp_path / "bad", bad_x, y)},
    }
    rc = run_config("codasca", tmp_path / "out", stages=1, rounds=1, **{"test-data": "", "model": "linear"})
    with pytest.raises(FederationError) as failure:
        run_local(rc, nodes)
    bad = tmp_path / "bad" / "train.npz"
    assert str(failure.value) == (
        f"set-up: node 2 failed: SiteDataError: {bad}: 2 non-finite value(s) (NaN/inf) in rows 4, 9 (0-based); "
        "fix or drop those rows"
    )


class RecordingTransport(LocalTransport):
    """LocalTransport that keeps every (request, reply) pair of the run."""

    def __init__(self, *args):
        super().__init__(*args)
        self.log: list[tuple] = []

    def send(self, requests, op):
        replies = super().send(requests, op)
        self.log += [(requests[n], replies.get(n)) for n in requests]
        return replies


def test_pool_masks_stay_on_the_server_and_a_missing_class_is_not_revealed(tmp_path):
    """FeDXL1 with one site holding no positive: its masks go up, only valid scores come down."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    good = _site(tmp_path / "good", x, (x[:, 0] > 0).astype(np.float32))
    bad = _site(tmp_path / "bad", x, np.zeros(40, np.float32))
    rc = run_config("fedxl1", tmp_path / "out", stages=1, rounds=2, **{"test-data": "", "model": "linear"})
    rc["allow-missing-class"] = True
    _, transport = run_local(rc, {1: {"data-dir": good}, 2: {"data-dir": bad}}, RecordingTransport)
    sent_up = [
        r.arrays["payload"] for _, r in transport.log if r is not None and r.config.get("kind") == "pool"
    ]
    down = [q.arrays["answer"] for q, _ in transport.log if q.config.get("kind") == "pool"]
    assert len(sent_up) == 2 * 3 and len(down) == 2 * 3  # 2 sites × (the seed + 2 rounds)
    assert any(int(p["valid/pos_pool"].sum()) == 0 for p in sent_up)  # the bad site's mask: up only
    for answer in down:
        assert set(answer) == {"pos_pool/scores", "neg_pool/scores"}  # no mask, no per-site layout
        assert not bool((answer["pos_pool/scores"] == -1.0).any())
        assert (
            len(answer["pos_pool/scores"]) == 2 * 4 or len(answer["pos_pool/scores"]) == 4
        )  # good site only


@pytest.mark.parametrize(
    ("node_config", "message"),
    [
        ({}, "node config names no data"),
        (
            {"dataset": "digits", "partition-id": 0},
            "needs node config dataset, partition-id and num-partitions",
        ),
        ({"dataset": "nope", "partition-id": 0, "num-partitions": 2}, "unknown dataset 'nope'"),
    ],
)
def test_bad_node_config_is_named(tmp_path, node_config, message):
    nodes = {**trial_nodes(1), 9: node_config}
    with pytest.raises(FederationError, match=message):
        run_local(run_config("localsgdm", tmp_path), nodes)


def test_bad_files_are_named(tmp_path):
    site = tmp_path / "s"
    site.mkdir()
    (site / "train.csv").write_text("a,b,label\n1,2,0\n3,4,2\n")
    nodes = {**trial_nodes(1), 5: {"data-dir": str(site)}}
    with pytest.raises(FederationError, match=r"train.csv: labels must be binary 0/1; found \[0.0, 2.0\]"):
        run_local(run_config("localsgdm", tmp_path / "o"), nodes)


class VanishingTransport(LocalTransport):
    """Site ``lost`` stops answering after its second step message; ``leaves`` also drops it
    from the connected nodes (a SuperNode shut down), else it just goes silent (a crash)."""

    lost, leaves = 1001, False

    def __init__(self, *args):
        super().__init__(*args)
        self.steps = 0

    def answer(self, node, request, op):
        if op == "step" and node == self.lost:
            self.steps += 1
            if self.steps > 2:
                return None
        return super().answer(node, request, op)

    def node_ids(self):
        gone = self.leaves and self.steps > 2
        return super().node_ids() - ({self.lost} if gone else set())


class LeavingTransport(VanishingTransport):
    leaves = True


@pytest.mark.parametrize(
    ("transport_cls", "message"),
    [
        (
            VanishingTransport,
            r"round 2/4: no reply from site 1 \(node 1001, partition-id 1\) within round-timeout = 0.3 s",
        ),
        (LeavingTransport, r"round 2/4: site 1 \(node 1001, partition-id 1\) left the federation"),
    ],
)
def test_a_vanished_site_fails_the_round_with_a_clear_message(tmp_path, transport_cls, message):
    rc = run_config("localsgdm", tmp_path, rounds=4, stages=1, **{"round-timeout": 0.3, "eval-every": 1})
    with pytest.raises(FederationError, match=message):
        run_local(rc, trial_nodes(), transport_cls)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds"] == 1
    assert "site 1" in summary["error"]
    assert len((tmp_path / "history.csv").read_text().splitlines()) == 2  # header + round 1 kept
    assert (tmp_path / "model.pt").exists()


def test_too_few_nodes_fails_after_the_wait(tmp_path):
    rc = run_config("localsgdm", tmp_path, **{"min-nodes": 3, "node-wait-timeout": 0.2})
    with pytest.raises(FederationError, match=r"only 2 SuperNode\(s\) connected .* min-nodes = 3"):
        run_local(rc, trial_nodes())


def test_run_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"unknown run-config key 'roundz'"):
        FlowerConfig.from_run_config({"roundz": 3})
    with pytest.raises(ConfigError, match="'options' must be JSON: Expecting property name"):
        FlowerConfig.from_run_config({"options": "{eta_g: 1}"})
    with pytest.raises(ConfigError, match="'options' must be a JSON object"):
        FlowerConfig.from_run_config({"options": "eta_g"})
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['eta'\] for codasca"):
        FlowerConfig.from_run_config({"options": '{"eta": 1}'})
    with pytest.raises(ConfigError, match="npa communicates every 1 step"):
        FlowerConfig.from_run_config({"algorithm": "npa", "local-steps": 4})
    assert FlowerConfig.from_run_config({"options": '{"eta_g": 1.1}'}).run.options == {"eta_g": 1.1}
    with pytest.raises(ConfigError, match="run-config 'rounds': expected an integer"):
        FlowerConfig.from_run_config({"rounds": "ten"})


def test_wire_names_round_trip():
    tree = {
        "w": {"fc1.weight": torch.ones(2, 3), "fc1.bias": torch.zeros(2)},
        "buffers": {},
        "a": torch.tensor(1.0),
    }
    flat = flatten(tree)
    assert list(flat) == ["w/fc1.weight", "w/fc1.bias", "buffers/", "a"]
    back = unflatten(flat)
    assert back["buffers"] == {} and max_abs_diff(back["w"], tree["w"]) == 0.0
    with pytest.raises(ValueError, match="contains '/'"):
        flatten({"a/b": torch.zeros(1)})


def test_new_app_writes_every_run_config_key(tmp_path):
    tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11

    from fedxrisk.flower.__main__ import write_app

    root = write_app(tmp_path / "app", {"algorithm": "localsgdm", "rounds": 4})
    app = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {
        "serverapp": "fedxrisk_app:server_app",
        "clientapp": "fedxrisk_app:client_app",
    }
    cfg = FlowerConfig.from_run_config(app["config"])
    assert (cfg.run.algorithm, cfg.run.rounds, cfg.run.options) == ("localsgdm", 4, {})
    assert (cfg.run.stages, cfg.run.eval_every, cfg.run.lr) == (3, 5, None)  # fedxrisk run's defaults
    root = write_app(tmp_path / "dp", {"privacy": {"clip": 1.0, "noise_multiplier": 1.1}, "lr": "none"})
    flat = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert FlowerConfig.from_run_config(flat).privacy["noise_multiplier"] == 1.1
    with pytest.raises(ConfigError, match="unknown algorithm 'nope'"):
        write_app(tmp_path / "bad", {"algorithm": "nope"})


def test_init_from_starts_every_site_from_the_file_as_the_loop_engine(tmp_path):
    from fedxrisk.experiment import RunConfig, build
    from fedxrisk.models import build_model

    torch.save(build_model("mlp", (1, 8, 8), 7).state_dict(), tmp_path / "w.pt")
    rc = run_config("codasca", tmp_path / "out", **{"init-from": str(tmp_path / "w.pt"), "reset-head": True})
    run_local(rc, trial_nodes())
    cfg = RunConfig(
        algorithm="codasca", engine="loop", clients=K, rounds=3, local_steps=2, batch_size=8, lr=0.1, stages=2,
        init_from=str(tmp_path / "w.pt"), reset_head=True, **SPLIT,
    )  # fmt: skip
    sim = build(cfg).simulation
    while not sim.done:
        sim.run_round()
    params, _ = sim.global_model()
    assert max_abs_diff(torch.load(tmp_path / "out" / "model.pt")["params"], params) < 1e-6


def test_any_module_runs_through_the_protocol_as_in_the_loop_engine(tmp_path):
    """model_fn: an nn.Module that is no registered name, built the same by the server and every
    site; data_fn: each site's data from the caller (the hooks fedxrisk.flower's user-facing apps
    build on): the loop engine's model."""
    import dataclasses

    from fedxrisk.algorithms import Schedule
    from fedxrisk.data import make_federated
    from fedxrisk.engines import Simulation
    from fedxrisk.problem import Problem

    def model_fn(shape):
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(shape)), 1))

    def data_fn(node_config):  # the site's data from the caller, not from a node-config path
        return load_trial(FlowerConfig.from_run_config(rc), "digits", node_config["k"], K)

    rc = run_config("codasca", tmp_path)
    cfg = dataclasses.replace(FlowerConfig.from_run_config(rc), model_fn=model_fn)
    nodes = {1000 + k: {"k": k} for k in range(K)}
    Coordinator(cfg, LocalTransport(rc, nodes, model_fn, data_fn), poll_interval=0.01).run()
    data = make_federated("digits", K, "iid", 0.3, 0)
    problem = Problem(model_fn(data.data.input_shape), data.data.pos_ratio)
    schedule = Schedule.build(rc["rounds"], rc["local-steps"], rc["lr"], rc["stages"])
    sim = run_all(Simulation(ALGORITHMS["codasca"](problem), data, schedule, rc["batch-size"], 0, "loop"))
    model = torch.load(tmp_path / "model.pt")
    assert set(model["params"]) == {"1.weight", "1.bias"}
    assert max_abs_diff(model["params"], sim.global_model()[0]) < 1e-6

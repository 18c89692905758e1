"""A real Flower deployment on 127.0.0.1 as docs/flower.md's "What changes for real sites" sets it up.

Skipped unless the extra is installed (``pip install -e '.[flower]'``). One
federation serves the whole module: a SuperLink with TLS (a CA and a server
certificate made by the test) and ``--enable-supernode-auth``, two SuperNodes
whose public keys were registered with ``flwr supernode register``, and one
whose key was not. Every message starts a ClientApp process on each SuperNode
(torch imported anew), so the cost is the number of messages and federation
starts, and the runs are as short as the checks allow.

Three runs submitted together are checked against the loop engine: CODASCA over
two rounds (state kept in the node's context across messages and rounds,
``mean``), FeDXL2 over one round (its ``begin`` hook and ``pool``) and
tests/test_one_path.py's config (DP, validation, ``selection = "best"`` and
``secure-aggregation = true``: every exchange through Flower's SecAgg+ workflow
and mod; ``fedxrisk run``'s model to the quantization's tolerance); the
other algorithms' numbers are checked through the same protocol in-process
(test_flower_protocol.py). ``flwr log`` shows CODASCA's ``[fedxrisk] round
k/R`` lines; the unregistered SuperNode was refused. Last, a SuperNode is
shut down in the middle of a LocalSGDM run and the server must stop that run
with a message naming the site. The app's ServerApp component is the test's spy
(spy_serverapp.py) around fedxrisk's: the one-path run's replies are searched
for the sites' secrets by value (flower_spy.py). Every process started here is stopped at the
end (with its descendants: Flower detaches its SuperExec).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")

from fedxrisk.algorithms import ALGORITHMS  # noqa: E402
from fedxrisk.flower.__main__ import write_app  # noqa: E402
from fedxrisk.flower.app import from_records, to_records  # noqa: E402
from fedxrisk.flower.wire import Packet  # noqa: E402
from fedxrisk.metrics import evaluate  # noqa: E402
from flower_spy import Site, evaluated_models, find_leaks, install_spy, load_records, training_site  # noqa: E402
from helpers import WAIT_SCALE, make_sim, max_abs_diff, run_all  # noqa: E402
from procs import SecureFederation, make_site_key, stop_all  # noqa: E402

pytestmark = pytest.mark.slow  # a real TLS federation: SuperLink, SuperNodes, a ClientApp process per message

SPLIT = {"partition": "iid", "imratio": 0.3, "seed": 0}
SETTINGS = {"local-steps": 2, "batch-size": 8, "lr": 0.1, "stages": 1, "test-data": "digits", **SPLIT}
SETTINGS |= {"eval-every": 1, "min-nodes": 2}
ALGORITHM_ROUNDS = {"codasca": 2, "fedxl2": 1}  # 4 and 5 messages per site
SECURE_TOL = 1e-5  # each secure mean is within 2R/levels = 1.2e-7 of the plain one (R = 64, 2 sites)
# tests/test_one_path.py's config through flwr run (DP, validation, selection = best, SecAgg+); lr and
# stages back to what fedxrisk run resolves (the default lr; the default 3 stages capped at the 2
# rounds), which this module's app overrides (SETTINGS)
ONE_PATH = {
    "rounds": 2, "eval-every": 1, "validation": 0.25, "lr": "none", "stages": 2, "selection": "best",
    "privacy": json.dumps({"clip": 0.5, "noise_multiplier": 0.8, "reproducible_noise": 7, "validation_noise_multiplier": 0.02}),
    "secure-aggregation": True,
}  # fmt: skip
RUN_WAIT = 900.0 * WAIT_SCALE  # s; an idle 2-core machine needs about a minute, a heavily loaded one many


def _options(algorithm: str) -> dict:
    """Class-aware algorithms (FeDXL): B1 = 4 positives + 4 negatives in the batch of 8."""
    return {"positives_per_batch": 4} if ALGORITHMS[algorithm].positives_per_batch else {}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("flower")
    fed = SecureFederation(root, install_spy(write_app(root / "app", SETTINGS)))  # every run spied on
    try:
        fed.superlink()
        for k in range(2):
            config = f'dataset="digits" partition-id={k} num-partitions=2'
            fed.supernode(f"site-{k}", fed.register(f"site-{k}"), config)
        unregistered = make_site_key(root, "intruder")  # a key the SuperLink never saw
        fed.supernode("intruder", unregistered, 'dataset="digits" partition-id=0 num-partitions=2')
        yield fed
    finally:
        fed.stop()
        assert all(p.poll() is not None for p in fed.procs.values())


@pytest.fixture(scope="module")
def runs(federation, tmp_path_factory):
    """CODASCA and FeDXL2, submitted together (the SuperNodes interleave them): (run id, out-dir, summary)."""
    root = tmp_path_factory.mktemp("runs")
    ids = {
        name: federation.submit(
            root / name, algorithm=name, rounds=rounds, options=json.dumps(_options(name))
        )
        for name, rounds in ALGORITHM_ROUNDS.items()
    }
    ids["one-path"] = federation.submit(root / "one-path", algorithm="codasca", **ONE_PATH)
    return {
        name: (run, root / name, federation.wait_summary(root / name, RUN_WAIT)) for name, run in ids.items()
    }


def _reference(algorithm: str, rounds: int):
    sim = run_all(
        make_sim(
            algorithm, "loop", clients=2, rounds=rounds, local_steps=SETTINGS["local-steps"],
            batch_size=SETTINGS["batch-size"], lr=SETTINGS["lr"], stages=SETTINGS["stages"],
            options=_options(algorithm), **SPLIT,
        )
    )  # fmt: skip
    params, buffers = sim.global_model()
    return sim, params, evaluate(sim.algorithm.problem, params, buffers, sim.data)


def test_packets_map_to_named_records():
    """Each tensor group is one ArrayRecord of named arrays; config and metrics have their own records."""
    packet = Packet(
        config={"pending": 2, "kind": "mean"},
        metrics={"loss": 0.25},
        arrays={
            "payload": {
                "w/fc1.weight": torch.ones(2, 3),
                "alpha": torch.tensor(0.5),
                "buffers/": torch.empty(0),
            }
        },
    )
    records = to_records(packet)
    assert sorted(records) == ["arrays.payload", "config", "metrics"]
    assert list(records["arrays.payload"]) == ["w/fc1.weight", "alpha", "buffers/"]
    back = from_records(records)
    assert back.config == packet.config and back.metrics == packet.metrics
    assert max_abs_diff(back.arrays["payload"], packet.arrays["payload"]) == 0.0


@pytest.mark.parametrize("name", list(ALGORITHM_ROUNDS))
def test_flower_runs_over_tls_match_the_loop_engine(runs, name):
    """CODASCA and FeDXL2 through flwr run on the registered sites: the loop engine's numbers."""
    rounds = ALGORITHM_ROUNDS[name]
    _, out, summary = runs[name]
    assert summary["status"] == "completed", summary["error"]
    sim, params, metrics = _reference(name, rounds)
    assert summary["rounds"] == rounds and summary["num_clients"] == 2  # the intruder never joined
    for key in ("test_auroc", "test_ap", "client_auroc_mean"):
        assert summary["final"][key] == pytest.approx(metrics[key], abs=1e-5), (name, key)
    assert summary["final"]["train_loss"] == pytest.approx(sim.train_loss(), abs=1e-5)
    assert max_abs_diff(torch.load(out / "model.pt")["params"], params) < 1e-5
    assert summary["communication"] == sim.ledger.summary()


def test_one_config_over_real_processes_equals_fedxrisk_run(federation, runs, tmp_path):
    """Issue 31's one path with real SuperNodes: the config of tests/test_one_path.py gives
    fedxrisk run's (loop engine's) model.pt (to SecAgg+'s quantization: every mean went through
    Flower's SecAgg+ workflow and mod), history columns, ε, communication and selected round."""
    from fedxrisk.run.configfile import load_config
    from fedxrisk.run.recipes import run_experiment
    from test_one_path import CONFIG, _column, _header

    run, out, summary = runs["one-path"]
    assert summary["status"] == "completed", summary["error"]
    (tmp_path / "run.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "run.toml", ["engine.engine=loop"])
    ref = run_experiment(cfg, tmp_path / "loop").summary
    a, b = torch.load(tmp_path / "loop" / "model.pt"), torch.load(out / "model.pt")
    assert 0 < max_abs_diff(a["params"], b["params"]) < SECURE_TOL  # > 0: SecAgg+'s quantization
    assert summary["final"]["client_auroc_mean"] is None  # no site's own AUROC under SecAgg+
    assert summary["communication"] == ref["communication"]
    logs = federation.flwr("log", str(run), "secure", "--show").stdout
    assert "Secure aggregation completed" in logs, logs[-3000:]  # Flower's SecAgg+ workflow ran
    assert _header(out) == _header(tmp_path / "loop")
    for key in ("epsilon", "epsilon_replace_one"):
        assert _column(out, key) == pytest.approx(_column(tmp_path / "loop", key), rel=1e-9), key
    for key in ("val_auroc", "val_ap"):  # the same noised validation release (docs/privacy.md)
        assert _column(out, key) == pytest.approx(_column(tmp_path / "loop", key), abs=1e-12), key
    assert summary["selected"]["round"] == ref["selected"]["round"]
    assert summary["config"]["lr"] == pytest.approx(ref["config"]["lr"], rel=1e-6)
    assert set(summary["privacy"]) == set(ref["privacy"]) | {"noise_added_by", "clipped_by"}
    assert summary["privacy"]["ledger"] == ref["privacy"]["ledger"]


def test_the_real_server_process_receives_no_site_statistic_in_clear_during_training(runs):
    """Issue 32's spy (tests/spy_serverapp.py, in the flwr-serverapp process) on the one-path run: DP,
    validation every round, SecAgg+. Every pushed message's reply was recorded; the set-up replies
    hold the counts docs/privacy.md lists (training rows and positives, whether the site validates)
    and nothing else; no other reply holds, by value, a site's training counts, validation counts,
    validation logits (or their bins), per-class validation histogram, or AUROC of its own."""
    from fedxrisk.flower.config import FlowerConfig, default_run_config, flat_value
    from fedxrisk.flower.sitedata import load_trial

    _, out, summary = runs["one-path"]
    assert summary["status"] == "completed", summary["error"]
    pushes, replies = load_records(out)
    assert {p["id"] for p in pushes} == {r["reply_to"] for r in replies} and all(
        r["error"] is None for r in replies
    )
    flat = {k: flat_value(v) for k, v in {**SETTINGS, "algorithm": "codasca", **ONE_PATH}.items()}
    cfg = FlowerConfig.from_run_config(default_run_config() | flat | {"out-dir": str(out)})
    models = evaluated_models(replies)
    assert len(models) == ONE_PATH["rounds"]  # one global model per evaluation
    sites = [training_site(f"site {k}", cfg, load_trial(cfg, "digits", k, 2), models) for k in range(2)]
    setup = [r for r in replies if r["type"] == "query"]
    assert sorted(r["metrics"]["metrics"]["num-samples"] for r in setup) == sorted(
        s.counts["training rows"] for s in sites
    )
    for reply in setup:
        assert set(reply["metrics"]["metrics"]) == {"num-samples", "num-positives", "has-val"}
        assert not reply["arrays"]
    public = [Site(s.name, s.vectors, s.values, {k: c for k, c in s.counts.items() if not k.startswith("training")})
              for s in sites]  # fmt: skip
    assert [str(leak) for leak in find_leaks(setup, public)] == []
    assert [str(leak) for leak in find_leaks([r for r in replies if r["type"] != "query"], sites)] == []


def test_flwr_log_shows_the_round_lines(federation, runs):
    """The lines docs/flower.md promises, where Flower keeps them (not in the SuperLink's terminal)."""
    run, _, _ = runs["codasca"]
    rounds = ALGORITHM_ROUNDS["codasca"]
    logs = federation.flwr("log", str(run), "secure", "--show")
    for k in range(1, rounds + 1):
        assert f"[fedxrisk] round {k}/{rounds}: train loss" in logs.stdout, logs.stdout[-3000:]


def test_a_supernode_with_an_unregistered_key_is_refused(federation):
    intruder = federation.procs["intruder"]
    intruder.wait(timeout=RUN_WAIT)
    assert intruder.returncode != 0, federation.log("intruder")[-2000:]  # it gives up: refused
    assert "[code: 2004] Failed to activate SuperNode." in federation.log("intruder")
    assert "No SuperNode found with the given public key" in federation.log("superlink")


def test_a_supernode_shut_down_mid_run_stops_the_run_with_a_clear_message(federation, tmp_path):
    """Runs last (it removes site 1). Policy: the round fails, naming the site; nothing hangs."""
    out = tmp_path / "lost"
    federation.submit(
        out, algorithm="localsgdm", rounds=40, **{"round-timeout": RUN_WAIT / 3}
    )  # a lost site, not a slow round
    deadline = time.monotonic() + RUN_WAIT
    while not (out / "history.csv").exists() or len((out / "history.csv").read_text().splitlines()) < 2:
        assert time.monotonic() < deadline, "the run never finished its first round"
        time.sleep(0.3)
    stop_all([federation.procs["site-1"]])  # the organization shuts its SuperNode down in round 2+
    summary = federation.wait_summary(out, RUN_WAIT)
    assert summary["status"] == "failed"
    assert "site 1 (node" in summary["error"] and "partition-id 1" in summary["error"]
    assert "left the federation" in summary["error"]  # SIGTERM: the SuperNode deregisters at once
    assert 1 <= summary["rounds"] < 40
    assert (out / "model.pt").exists()

"""The spy of tests/test_flower_evaluate_deploy.py (``spy_serverapp.py``, ``flower_spy.py``) checked in one
process, where a leak can be planted: the same Grid wrapper around the in-process Grid, the same
search by value. Without secure aggregation it must find every site's histograms and moment shares
(they travel in clear); with SecAgg+ it must find nothing; a site that hides a secret beside its
masked vector (in fedxrisk's packet bytes, a config value, JSON text, a metric) must be caught."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")

import fedxrisk.flower.app as app_module  # noqa: E402
from fedxrisk.flower.app import client_app  # noqa: E402
from fedxrisk.flower.config import FlowerConfig  # noqa: E402
from fedxrisk.flower.evaluate_app import run_on_grid  # noqa: E402
from fedxrisk.stats.federated import simulate  # noqa: E402
from flower_grid import InProcessGrid  # noqa: E402
from flower_spy import (
    evaluated_models,
    evaluation_files,
    evaluation_site,
    find_leaks,
    scores_of,
    training_site,
)  # noqa: E402
from spy_serverapp import spy_on  # noqa: E402

NODES = (7_001_234_567, 7_009_876_543)  # node ids no count or bin can equal


def _spied_run(tmp_path, secure: bool) -> tuple[list[dict], list[dict], list, dict]:
    paths, data, states = evaluation_files(tmp_path)
    nodes = {n: {"data-dir": str(tmp_path / f"data-{k}")} for k, n in enumerate(NODES)}
    rc = {"model": "linear", "test-data": "", "min-nodes": 2, "out-dir": str(tmp_path / "out"),
          "secure-aggregation": secure}  # fmt: skip
    items: list[dict] = []
    grid = spy_on(InProcessGrid(client_app, rc, nodes), items.append)
    result = run_on_grid(grid, FlowerConfig.from_run_config(rc), paths, dp=None)  # exact: what it discloses
    pushes = [i["push"] for i in items if "push" in i]
    replies = [i["reply"] for i in items if "reply" in i]
    sites_scores = [(y, scores_of(states, x)) for x, y in data]
    totals, _ = simulate(sites_scores)
    sites = [evaluation_site(f"site {k}", y, s, totals) for k, (y, s) in enumerate(sites_scores)]
    return pushes, replies, sites, result


@pytest.mark.slow  # the widest in-process spy run (the validation-histogram case stays quick)
def test_without_secagg_the_spy_finds_each_sites_histograms_and_shares(tmp_path):
    pushes, replies, sites, _ = _spied_run(tmp_path, secure=False)
    assert len(replies) == len(pushes) == 2 * len(NODES)  # two plain exchanges
    found = {(leak.site, leak.secret) for leak in find_leaks(replies, sites)}
    for site in sites:
        for secret in ("model 0 negatives' histogram", "model 1 positives' histogram", "moment shares"):
            assert (site.name, secret) in found, (site.name, secret, sorted(found))
        assert (site.name, "model 0 scores") not in found and (site.name, "rows") not in found


def test_under_secagg_the_spy_finds_nothing_in_process(tmp_path):
    pushes, replies, sites, result = _spied_run(tmp_path, secure=True)
    assert len(replies) == len(pushes) == 2 * 4 * len(NODES)  # two SecAgg+ runs of four stages
    assert {p["id"] for p in pushes} == {r["reply_to"] for r in replies}  # every reply recorded
    assert find_leaks(replies, sites) == []
    assert result["models"][0]["positives"] == sum(s.counts["positives"] for s in sites)


def _leaky(kind: str):
    """site_evaluate with one secret of the site's own put beside the masked vector."""
    honest = app_module.site_evaluate

    def leaky(node_config, run_config, request):
        reply = honest(node_config, run_config, request)
        x, y = np.load(f"{node_config['data-dir']}/test.npz").values()
        if kind == "histogram" and request.config["stage"] == "histograms":
            reply.arrays["debug"] = {"counts": reply.arrays["payload"]["counts"] * 3.0}  # packet bytes
        elif kind == "count":
            reply.config["rows"] = int(len(y))
        elif kind == "scores" and request.config["stage"] == "histograms":
            cfg = FlowerConfig.from_run_config(run_config)
            model = cfg.build_model((4,))
            model.load_state_dict(request.arrays["model0"])
            with torch.no_grad():
                reply.config["scores"] = json.dumps(model(torch.from_numpy(x)).reshape(-1).tolist())
        elif kind == "moments" and request.config["stage"] == "moments":
            high, low = (reply.arrays["payload"]["moments"] / float(request.config["step"])).tolist()
            limb = float(request.config["limb"])
            reply.metrics["share"] = (high[0] + low[0] / limb) / limb  # the site's first share
        return reply

    return leaky


@pytest.mark.parametrize(
    "kind, secret",
    [
        pytest.param("histogram", "model 0 positives' histogram", marks=pytest.mark.slow),
        ("count", "rows"),
        pytest.param("scores", "model 0 scores", marks=pytest.mark.slow),
        pytest.param("moments", "moment shares", marks=pytest.mark.slow),
    ],
)
def test_under_secagg_a_secret_beside_the_masked_vector_is_caught(tmp_path, monkeypatch, kind, secret):
    monkeypatch.setattr(app_module, "site_evaluate", _leaky(kind))
    _, replies, sites, _ = _spied_run(tmp_path, secure=True)
    found = {(leak.site, leak.secret) for leak in find_leaks(replies, sites)}
    assert {(s.name, secret) for s in sites} <= found, sorted(found)


def _spied_training(tmp_path, **settings) -> tuple[list[dict], list[dict], list, dict]:
    """A 2-round CODASCA run with validation every round, through fedxrisk's own ServerApp on the
    in-process Grid, spied on: (pushes, replies, the sites' secrets, summary)."""
    from flwr.app import Context, RecordDict

    from fedxrisk.flower.app import server_app
    from fedxrisk.flower.sitedata import load_trial

    rc = {"algorithm": "codasca", "rounds": 2, "local-steps": 2, "batch-size": 8, "lr": 0.1, "stages": 1,
          "test-data": "digits", "out-dir": str(tmp_path / "out"), "min-nodes": 2, "partition": "iid",
          "imratio": 0.3, "seed": 0, "validation": 0.25, "eval-every": 1, **settings}  # fmt: skip
    nodes = {n: {"dataset": "digits", "partition-id": k, "num-partitions": 2} for k, n in enumerate(NODES)}
    items: list[dict] = []
    grid = spy_on(InProcessGrid(client_app, rc, nodes), items.append)
    server_app(grid, Context(1, 0, {}, RecordDict(), dict(rc)))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    replies = [i["reply"] for i in items if "reply" in i]
    cfg = FlowerConfig.from_run_config(rc)
    models = evaluated_models(replies)
    sites = [training_site(f"site {k}", cfg, load_trial(cfg, "digits", k, 2), models) for k in range(2)]
    return [i["push"] for i in items if "push" in i], replies, sites, summary


def test_without_secagg_the_spy_finds_each_sites_validation_histograms(tmp_path):
    """The secrets training_site computes are the ones a site sends: in clear without SecAgg+."""
    _, replies, sites, summary = _spied_training(tmp_path)
    assert summary["status"] == "completed", summary["error"]
    found = {(leak.site, leak.secret) for leak in find_leaks(replies, sites)}
    for site in sites:
        for r in range(2):
            for secret in ("negatives' validation histogram", "positives' validation histogram", "AUROCs"):
                assert (site.name, f"evaluation {r} {secret}") in found, (site.name, r, secret, sorted(found))
        assert (site.name, "validation rows") in found  # num-val at set-up
        assert (site.name, "evaluation 0 validation scores") not in found


def test_under_secagg_the_training_spy_finds_only_the_set_up_counts(tmp_path):
    pushes, replies, sites, summary = _spied_training(tmp_path, **{"secure-aggregation": True})
    assert summary["status"] == "completed", summary["error"]
    assert {p["id"] for p in pushes} == {r["reply_to"] for r in replies}
    leaks = find_leaks(replies, sites)
    assert {leak.secret for leak in leaks} <= {"training rows", "training positives"}, [str(x) for x in leaks]
    assert all(replies[leak.reply]["type"] == "query" for leak in leaks)  # the set-up, as privacy.md says


@pytest.mark.parametrize("who", ["superlink", "supernodes"])
def test_a_wait_ends_as_soon_as_the_federation_died_with_its_stderr(tmp_path, who):
    """tests/procs.py: a dead SuperLink, or every SuperNode dead, fails a wait at once, stderr shown."""
    import sys
    import time

    from procs import SecureFederation

    fed = SecureFederation(tmp_path, tmp_path)
    dies = [sys.executable, "-c", "import sys; sys.stderr.write('gone: bad certificate'); sys.exit(3)"]
    lives = [sys.executable, "-c", "import time; time.sleep(60)"]
    try:
        fed.start("superlink", dies if who == "superlink" else lives)
        for k in range(2):
            fed.nodes.append(f"site-{k}")
            fed.start(f"site-{k}", dies if who == "supernodes" else lives)
        start, wait = time.monotonic(), 600.0
        with pytest.raises(pytest.fail.Exception, match="exited.*gone: bad certificate"):  # not "after 600 s"
            fed.wait_file(tmp_path / "out" / "summary.json", wait, tmp_path / "out")
        assert time.monotonic() - start < wait / 2  # ended by the exit, not the timeout, loaded or not
    finally:
        fed.stop()

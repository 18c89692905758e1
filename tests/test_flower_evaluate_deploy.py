"""Federated evaluation on a real Flower deployment (issue 32): a SuperLink with TLS and SuperNode
authentication on 127.0.0.1, two SuperNodes each holding its own ``test.npz``, the app written by
``python -m fedxrisk.flower evaluate`` with ``secure-aggregation = true``. Every message starts a
ClientApp process, so the module runs one evaluation (two SecAgg+ exchanges of four stages each
per site) and checks it twice: its result equals the in-process simulation, and a spy in the
real ``flwr-serverapp`` process (``spy_serverapp.py``, the app's ServerApp component wrapping the
one under test) recorded every reply the server pulled, none holding a site's score, histogram,
count, moment share or AUROC in clear (searched by value, ``flower_spy.py``; the same search
catches planted leaks in test_flower_spy.py).
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")

from click.testing import CliRunner  # noqa: E402

from fedxrisk.flower.__main__ import main  # noqa: E402
from fedxrisk.stats.federated import federated_delong, federated_paired, simulate  # noqa: E402
from flower_spy import evaluation_files, evaluation_site, find_leaks, install_spy, load_records, scores_of  # noqa: E402
from helpers import WAIT_SCALE  # noqa: E402
from procs import SecureFederation  # noqa: E402

pytestmark = pytest.mark.slow  # a real TLS federation: SuperLink, SuperNodes, a ClientApp process per message

WAIT = 900.0 * WAIT_SCALE  # s; 6.5 min measured on the shared 2-core machine while another Flower test ran
STAGES = 4  # SecAgg+'s message rounds per exchange: set-up, share keys, collect masked vectors, unmask


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    """One secure evaluation of two models over two sites: (federation, result, spied replies and
    pushes, the sites' labels and scores)."""
    root = tmp_path_factory.mktemp("evaluate")
    paths, data, states = evaluation_files(root)
    app = root / "app"
    res = CliRunner().invoke(main, ["evaluate", str(app), "--model", paths[0], "--against", paths[1], "--exact",
                                    "--set", "secure-aggregation=true", "--set", "model=linear",
                                    "--set", "test-data=", "--set", "min-nodes=2"])  # fmt: skip
    assert res.exit_code == 0, res.output
    fed = SecureFederation(root, install_spy(app))
    try:
        fed.superlink()
        for k in range(2):
            fed.supernode(f"site-{k}", fed.register(f"site-{k}"), f'data-dir="{root / f"data-{k}"}"')
        out = root / "out"
        fed.submit(out)
        fed.wait_file(out / "federated_evaluation.json", WAIT, out)
        time.sleep(0.2)
        result = json.loads((out / "federated_evaluation.json").read_text())
        pushes, replies = load_records(out)
        yield fed, result, pushes, replies, [(y, scores_of(states, x)) for x, y in data]
    finally:
        fed.stop()


def test_secure_evaluation_across_processes_equals_the_simulation(evaluation):
    _, result, _, _, sites = evaluation
    totals, moments = simulate(sites)
    assert result["secure_aggregation"] is True and result["sites"] == 2
    for i in range(2):
        sim = federated_delong(totals, moments, i)
        assert result["models"][i]["auroc"] == pytest.approx(sim.auroc, abs=1e-12)
        assert result["models"][i]["variance"] == pytest.approx(sim.variance, abs=1e-12)
        assert result["models"][i]["positives"] == sum(int(y.sum()) for y, _ in sites)
    assert result["paired"]["p_value"] == pytest.approx(federated_paired(totals, moments).p_value, abs=1e-12)
    assert "site_auroc" not in result


def test_the_real_server_process_receives_no_site_secret_in_clear(evaluation):
    """Issue 32's spy, in the flwr-serverapp process: every message the server pushed has its reply
    recorded (2 exchanges × 4 SecAgg+ stages × 2 sites), the masked vectors are there, and no reply
    holds, by value, a site's logits (or their bins), per-class histogram, moment shares, class
    counts or own AUROC/variance."""
    _, _, pushes, replies, sites = evaluation
    assert len(pushes) == len(replies) == 2 * STAGES * 2
    assert {p["id"] for p in pushes} == {r["reply_to"] for r in replies}
    assert all(r["error"] is None for r in replies)
    totals, _ = simulate(sites)
    secrets = [evaluation_site(f"site {k}", y, s, totals) for k, (y, s) in enumerate(sites)]
    assert [str(leak) for leak in find_leaks(replies, secrets)] == []
    masked = [r for r in replies if any("masked" in k for c in r["configs"].values() for k in c)]
    assert len(masked) == 2 * 2  # one masked vector per site and exchange, and it is all they sent


def test_a_run_whose_server_app_fails_ends_the_wait_at_once(evaluation, tmp_path):
    """tests/procs.py: a ServerApp that raises before writing its result (a bad run config) fails the
    wait as soon as it ended, with its traceback, instead of after the full timeout."""
    fed = evaluation[0]
    out = tmp_path / "bad"
    fed.submit(out, model="no-such-model")
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="(?s)ServerApp ended without writing it.*no-such-model"):
        fed.wait_file(out / "federated_evaluation.json", WAIT, out)
    assert time.monotonic() - start < WAIT / 2  # ended by the ServerApp's end, not the timeout

"""Federated evaluation on a real Flower deployment (issue 32): a SuperLink with TLS and SuperNode
authentication on 127.0.0.1, two SuperNodes each holding its own ``test.npz``, the app written by
``python -m fedxrisk.flower evaluate`` with ``secure-aggregation = true``. Every message starts a
ClientApp process, so the test is slow (two SecAgg+ exchanges of four stages each per site); the
server-side spy of the same protocol runs in-process (test_flower_evaluate.py).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")

from click.testing import CliRunner  # noqa: E402

from fedxrisk.flower.__main__ import main  # noqa: E402
from fedxrisk.flower.config import FlowerConfig  # noqa: E402
from fedxrisk.stats.federated import federated_delong, federated_paired, simulate  # noqa: E402
from procs import SecureFederation  # noqa: E402

WAIT = 900.0  # s; 6.5 min measured on the shared 2-core machine while another Flower test ran


def test_secure_evaluation_across_processes_equals_the_simulation(tmp_path):
    rng = np.random.default_rng(3)
    cfg = FlowerConfig.from_run_config({"model": "linear", "test-data": ""})
    states, sites = [], []
    for seed in (0, 1):
        model = cfg.build_model((4,))
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
        states.append({k: v.clone() for k, v in model.state_dict().items()})
        torch.save(states[-1], tmp_path / f"model{seed}.pt")
    for k, n in enumerate((50, 30)):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        y = (x[:, 0] + x[:, 1] + rng.normal(size=n) > 0.3).astype(np.float32)
        (tmp_path / f"data-{k}").mkdir()
        np.savez(tmp_path / f"data-{k}" / "test.npz", x=x, y=y)
        scores = []
        for state in states:
            model = cfg.build_model((4,))
            model.load_state_dict(state)
            with torch.no_grad():
                scores.append(model(torch.from_numpy(x)).reshape(-1).double().numpy())
        sites.append((y, scores))
    app = tmp_path / "app"
    res = CliRunner().invoke(main, ["evaluate", str(app), "--model", str(tmp_path / "model0.pt"), "--against",
                                    str(tmp_path / "model1.pt"), "--set", "secure-aggregation=true",
                                    "--set", "model=linear", "--set", "test-data=", "--set", "min-nodes=2"])  # fmt: skip
    assert res.exit_code == 0, res.output
    fed = SecureFederation(tmp_path, app)
    try:
        fed.superlink()
        for k in range(2):
            fed.supernode(f"site-{k}", fed.register(f"site-{k}"), f'data-dir="{tmp_path / f"data-{k}"}"')
        out = tmp_path / "out"
        fed.submit(out)
        deadline = time.monotonic() + WAIT
        while not (out / "federated_evaluation.json").exists():
            assert time.monotonic() < deadline, f"no result after {WAIT} s; logs: {fed.logs()}"
            time.sleep(0.5)
        time.sleep(0.2)
        result = json.loads((out / "federated_evaluation.json").read_text())
    finally:
        fed.stop()
    totals, moments = simulate(sites)
    assert result["secure_aggregation"] is True and result["sites"] == 2
    for i in range(2):
        sim = federated_delong(totals, moments, i)
        assert result["models"][i]["auroc"] == pytest.approx(sim.auroc, abs=1e-12)
        assert result["models"][i]["variance"] == pytest.approx(sim.variance, abs=1e-12)
        assert result["models"][i]["positives"] == sum(int(y.sum()) for y, _ in sites)
    assert result["paired"]["p_value"] == pytest.approx(federated_paired(totals, moments).p_value, abs=1e-12)
    assert "site_auroc" not in result

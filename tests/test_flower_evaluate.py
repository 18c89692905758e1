"""Federated evaluation on Flower (issue 32): two secure sums over the sites' own test files.

In one process: the real fedxrisk ClientApp with Flower's ``secaggplus_mod`` behind an in-process
Grid, the real ``SecAggPlusWorkflow`` on the server. The result equals the in-process simulation
of the same two sums (:func:`fedxrisk.stats.federated.simulate`) and the server never holds a
site's histogram, count or score in the clear.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")

from flwr.common import bytes_to_ndarray  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key  # noqa: E402

import fedxrisk.flower.secagg as secagg  # noqa: E402
from fedxrisk.flower.app import client_app  # noqa: E402
from fedxrisk.flower.config import FlowerConfig  # noqa: E402
from fedxrisk.flower.evaluate_app import run_on_grid  # noqa: E402
from fedxrisk.flower.secure import flat_vector, packet_from_bytes  # noqa: E402
from fedxrisk.stats import delong, delong_paired, logit_edges  # noqa: E402
from fedxrisk.stats.federated import federated_delong, federated_paired, simulate  # noqa: E402
from flower_grid import InProcessGrid  # noqa: E402

SIZES = (60, 35, 12)


@pytest.fixture
def federation(tmp_path):
    """Three sites with a test.npz each and two model files (a linear model and a perturbed copy)."""
    rng = np.random.default_rng(0)
    nodes, data = {}, []
    for i, n in enumerate(SIZES):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        y = (x[:, 0] + rng.normal(size=n) > 0.5).astype(np.float32)
        folder = tmp_path / f"site-{i}"
        folder.mkdir()
        np.savez(folder / "test.npz", x=x, y=y)
        nodes[100 + i] = {"data-dir": str(folder)}
        data.append((x, y))
    rc = {"model": "linear", "min-nodes": len(SIZES), "out-dir": str(tmp_path / "out"), "test-data": ""}
    cfg = FlowerConfig.from_run_config(rc)
    model = cfg.build_model((4,))
    a = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        a["linear.weight" if "linear.weight" in a else next(iter(a))].copy_(
            torch.tensor([[2.0, 0.3, -0.2, 0.1]])
        )
    b = {k: v + 0.4 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in a.items()}
    paths = []
    for name, state in (("a.pt", a), ("b.pt", b)):
        torch.save(state, tmp_path / name)
        paths.append(str(tmp_path / name))
    return rc, nodes, data, paths, (a, b), cfg


def _scores(cfg, state, x):
    model = cfg.build_model((4,))
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(x)).reshape(-1).double().numpy()


def _simulated(cfg, data, states):
    sites = [(y, [_scores(cfg, s, x) for s in states]) for x, y in data]
    return sites, simulate(sites)


@pytest.mark.parametrize("secure", [True, False])
def test_flower_evaluation_equals_the_simulation(federation, secure):
    rc, nodes, data, paths, states, cfg = federation
    rc = {**rc, "secure-aggregation": secure}
    result = run_on_grid(
        InProcessGrid(client_app, rc, nodes), FlowerConfig.from_run_config(rc), paths, dp=None
    )
    sites, (totals, moments) = _simulated(cfg, data, states)
    assert np.array_equal(result["totals"], totals)  # the secure sum of counts is exact
    assert np.abs(result["moments"] - moments).max() < 1e-14
    y = np.concatenate([y for y, _ in sites]).astype(bool)
    for i in range(2):
        got, sim = result["models"][i], federated_delong(totals, moments, i)
        assert got["auroc"] == pytest.approx(sim.auroc, abs=1e-12)
        assert got["variance"] == pytest.approx(sim.variance, abs=1e-12)
        exact = delong(y, np.concatenate([s[i] for _, s in sites]))
        assert abs(got["auroc"] - exact.auroc) <= got["auroc_bound"] + 1e-12
    paired = federated_paired(totals, moments)
    assert result["paired"]["p_value"] == pytest.approx(paired.p_value, abs=1e-12)
    exact = delong_paired(y, *(np.concatenate([s[i] for _, s in sites]) for i in range(2)))
    assert result["paired"]["p_low"] - 1e-12 <= exact.p_value <= result["paired"]["p_high"] + 1e-12
    saved = json.loads((Path(rc["out-dir"]) / "federated_evaluation.json").read_text())
    assert saved["models"][0]["auroc"] == result["models"][0]["auroc"] and "totals" not in saved
    assert saved["mode"] == "exact" and "learned the pooled per-class score histogram" in saved["disclosure"]


def test_the_result_is_never_written_through_a_link(federation, tmp_path):
    """The server's federated_evaluation.json: a symbolic link in its place is refused in one line and the
    file it points to is left as it was (the writers of fedxrisk run, not a plain write)."""
    from fedxrisk.errors import OutputError

    rc, nodes, _, paths, _, _ = federation
    victim = tmp_path / "mine.txt"
    victim.write_text("mine")
    Path(rc["out-dir"]).mkdir(parents=True, exist_ok=True)
    (Path(rc["out-dir"]) / "federated_evaluation.json").symlink_to(victim)
    with pytest.raises(OutputError, match="symbolic link"):
        run_on_grid(InProcessGrid(client_app, rc, nodes), FlowerConfig.from_run_config(rc), paths[:1])
    assert victim.read_text() == "mine"


def test_the_server_sees_no_histogram_count_or_score_in_clear(federation, monkeypatch):
    rc, nodes, data, paths, states, cfg = federation
    rc = {**rc, "secure-aggregation": True}
    sent: list[torch.Tensor] = []

    def spy_flat(payload):
        vector, layout = flat_vector(payload)
        sent.append(vector.clone())
        return vector, layout

    monkeypatch.setattr(secagg, "flat_vector", spy_flat)
    grid = InProcessGrid(client_app, rc, nodes)
    result = run_on_grid(grid, FlowerConfig.from_run_config(rc), paths, dp=None)
    assert len(sent) == 2 * len(SIZES)  # two exchanges, one vector per site
    sites, _ = _simulated(cfg, data, states)
    secret_counts = [str(int(y.sum())) for y, _ in sites] + [str(len(y)) for y, _ in sites]
    masked = 0
    for reply in grid.replies:
        assert all(len(record) == 0 for record in reply.content.array_records.values())  # no array in clear
        configs = reply.content.config_records.get(RECORD_KEY_CONFIGS, {})
        if Key.MASKED_PARAMETERS in configs:
            masked += 1
            _, vector = [bytes_to_ndarray(b) for b in configs[Key.MASKED_PARAMETERS]]
            for v in sent:
                if v.numel() == vector.size:  # the masked integers are not the site's quantized values
                    levels = vector.astype(np.float64)
                    r, step = 64.0, 128.0 / 2**29
                    assert np.abs(levels * step - r - v.numpy()).mean() > 1.0
        if "fitres.metrics" in reply.content.config_records:
            ours = packet_from_bytes(reply.content.config_records["fitres.metrics"][secagg.KEY])
            assert not ours.arrays and "site" not in ours.config  # nothing per site besides the masked vector
            assert not any(c in ours.config.values() for c in secret_counts)
    assert masked == 2 * len(SIZES)
    assert result["models"][0]["positives"] == sum(int(y.sum()) for _, y in data)  # only the pooled count


def test_site_auroc_is_released_only_when_asked_and_equals_delong_alone(federation):
    rc, nodes, data, paths, states, cfg = federation
    rc = {**rc, "secure-aggregation": True}
    result = run_on_grid(
        InProcessGrid(client_app, rc, nodes),
        FlowerConfig.from_run_config(rc),
        paths,
        site_auroc=True,
        dp=None,
    )
    for released, (x, y) in zip(result["site_auroc"].values(), data):
        alone = delong(y, _scores(cfg, states[0], x))
        assert released[0]["auroc"] == pytest.approx(alone.auroc, abs=1e-15)
        assert (released[0]["low"], released[0]["high"]) == pytest.approx((alone.low, alone.high), abs=1e-15)


def test_python_m_fedxrisk_flower_evaluate_writes_an_evaluation_app(federation, tmp_path):
    import importlib.util

    from click.testing import CliRunner

    from fedxrisk.flower.__main__ import main

    _, _, _, paths, _, _ = federation
    app = tmp_path / "app"
    res = CliRunner().invoke(main, ["evaluate", str(app), "--model", paths[0], "--against", paths[1], "--exact",
                                    "--set", "secure-aggregation=true", "--set", "min-nodes=3"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "NOT PRIVATE — exact mode: the server learned" in res.output
    assert "secure-aggregation = true" in (app / "pyproject.toml").read_text()
    spec = importlib.util.spec_from_file_location("fedxrisk_eval_app", app / "fedxrisk_app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert type(module.server_app).__name__ == "ServerApp" and module.client_app is client_app
    assert repr(paths) in (app / "fedxrisk_app.py").read_text()


@pytest.mark.parametrize("secure", [True, False])
def test_a_site_without_a_test_file_is_named(federation, secure):
    rc, nodes, data, paths, states, cfg = federation
    rc = {**rc, "secure-aggregation": secure}
    (Path(nodes[101]["data-dir"]) / "test.npz").unlink()
    with pytest.raises(RuntimeError, match=r"site 101: .*holds neither test.npz nor test.csv") as info:
        run_on_grid(InProcessGrid(client_app, rc, nodes), FlowerConfig.from_run_config(rc), paths, dp=None)
    assert "\n" not in str(info.value)


def test_one_model_needs_one_secure_sum(federation, monkeypatch):
    """With one model the server skips round 2 (the moments follow from the pooled histogram) and
    gets the simulation's numbers."""
    rc, nodes, data, paths, states, cfg = federation
    rc = {**rc, "secure-aggregation": True}
    calls = []
    real = secagg.secure_exchange

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    import fedxrisk.flower.evaluate_app as evaluate_app

    monkeypatch.setattr(evaluate_app, "secure_exchange", counting)
    result = run_on_grid(
        InProcessGrid(client_app, rc, nodes), FlowerConfig.from_run_config(rc), paths[:1], dp=None
    )
    assert len(calls) == 1
    _, (totals, moments) = _simulated(cfg, data, states[:1])
    sim = federated_delong(totals, moments)
    assert result["models"][0]["auroc"] == pytest.approx(sim.auroc, abs=1e-12)
    assert result["models"][0]["variance"] == pytest.approx(sim.variance, abs=1e-12)


def test_a_private_evaluation_releases_only_the_noisy_pooled_histogram(federation):
    """Each site adds its share N(0, σ²/K) before SecAgg+: the server's sum differs from the true
    pooled histogram by noise of spread σ, and the private AUROC is computed from it (or refused)."""
    pytest.importorskip("dp_accounting")
    from fedxrisk.stats.dp_eval import DP_BINS, DP_LIMIT, noise_sigma

    rc, nodes, data, paths, states, cfg = federation
    rc = {**rc, "secure-aggregation": True}
    eps = 50.0
    result = run_on_grid(
        InProcessGrid(client_app, rc, nodes), FlowerConfig.from_run_config(rc), paths[:1], dp=(eps, 1e-5)
    )
    sites = [(y, [_scores(cfg, states[0], x)]) for x, y in data]
    true, _ = simulate(sites, logit_edges(DP_BINS, DP_LIMIT))
    residual = (np.asarray(result["totals"]) - true[0])[:, :-1]
    sigma = noise_sigma(eps, 1e-5)
    assert residual.std() == pytest.approx(sigma, rel=0.2) and np.abs(residual).max() > 0
    private = result["private"]
    assert "refused" in private or private["low"] <= private["auroc"] <= private["high"]
    assert result["mode"] == "private" and result["sigma"] == pytest.approx(sigma)

"""Secure aggregation on Flower (issue 23 item 4), in one process: the real fedxrisk ClientApp with
Flower's ``secaggplus_mod`` behind an in-process Grid, the real ``SecAggPlusWorkflow`` on the server.

- the same model as without SecAgg+, to the quantization's tolerance;
- each secure mean equals the exact mean of the sites' vectors within one quantization step;
- the server side never receives a site's unmasked payload (the coordinator's reduce gets the
  aggregate only; every reply the server pulls holds masked integers and unmasked bytes without
  a payload);
- a value beyond ``secure-aggregation-range`` stops the run with one line naming the tensor;
- refusals, one line each (non-mean collectives found by probing, DP, ...).

The real-process federation (TLS, node authentication) is in test_flower_deploy.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")

from flwr.common import bytes_to_ndarray  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key  # noqa: E402

import fedxrisk.flower.federation as federation_module  # noqa: E402
import fedxrisk.flower.secagg as secagg  # noqa: E402
from fedxrisk.engines import Simulation  # noqa: E402
from fedxrisk.engines.privacy import ClientDP  # noqa: E402
from fedxrisk.errors import ConfigError  # noqa: E402
from fedxrisk.flower.app import GridTransport, client_app  # noqa: E402
from fedxrisk.flower.config import FlowerConfig  # noqa: E402
from fedxrisk.flower.coordinator import Coordinator, FederationError  # noqa: E402
from fedxrisk.flower.secure import flat_vector, levels, packet_from_bytes, step  # noqa: E402
from flower_grid import InProcessGrid  # noqa: E402
from helpers import make_sim, max_abs_diff, run_all  # noqa: E402
from test_flower_protocol import run_config, run_local, trial_nodes  # noqa: E402

SECURE = {"secure-aggregation": True}
PRIVACY = {"clip": 0.5, "noise_multiplier": 0.8, "reproducible_noise": 7}
DP = {"privacy": json.dumps(PRIVACY)}
MODEL_TOL = 1e-5  # 3 rounds; one secure mean is off by < 2R/levels = 1.2e-7 (R = 64, 2 sites)


def loop_model_with_dp(rc: dict, algorithm: str, clients: int, dp: ClientDP) -> dict:
    """The loop engine's global parameters for the Flower run config ``rc`` (trial sites) under ``dp``."""
    base = make_sim(
        algorithm, "loop", clients=clients, rounds=rc["rounds"], local_steps=rc["local-steps"],
        batch_size=rc["batch-size"], lr=rc["lr"], stages=rc["stages"], partition="iid", imratio=0.3, seed=0,
    )  # fmt: skip
    sim = Simulation(base.algorithm, base.data, base.schedule, base.batch_size, base.seed, "loop", privacy=dp)
    return run_all(sim).global_model()[0]


def run_secure(rc: dict, nodes: dict[int, dict]) -> tuple[dict, InProcessGrid]:
    cfg = FlowerConfig.from_run_config(rc)
    grid = InProcessGrid(client_app, rc, nodes)
    return Coordinator(cfg, GridTransport(grid, cfg), poll_interval=0.01).run(), grid


def test_quantization_levels_keep_the_sum_of_sites_below_the_modulus():
    for k in (2, 3, 4, 5, 8, 100):
        assert k * levels(k) < 2**32 and 2 * k * levels(k) >= 2**31  # the largest power of two that fits
    assert step(64.0, 2) == pytest.approx(1.1920929e-07)


@pytest.mark.parametrize(
    "algorithm, sites, value_range",
    [
        ("codasca", 2, 64.0),
        ("localscgdam", 2, 64.0),
        pytest.param("codasca", 3, 64.0, marks=pytest.mark.slow),
        ("coda", 2, 256.0),
    ],
)  # coda: class sums and counts (n_pos up to the stage batch, so R = 256), 2 means a round
def test_secure_aggregation_gives_the_plain_model(algorithm, sites, value_range, tmp_path):
    nodes = trial_nodes(sites)
    rc = run_config(algorithm, tmp_path / "plain", **{"min-nodes": sites})
    plain, _ = run_local(rc, nodes)
    extra = {**SECURE, "secure-aggregation-range": value_range, "out-dir": str(tmp_path / "secure")}
    secure, _ = run_secure({**rc, **extra}, nodes)
    assert secure["status"] == "completed", secure["error"]
    a, b = (torch.load(tmp_path / d / "model.pt")["params"] for d in ("plain", "secure"))
    assert 0 < max_abs_diff(a, b) < MODEL_TOL  # not bitwise: the values were quantized
    assert secure["final"]["test_auroc"] == pytest.approx(plain["final"]["test_auroc"], abs=MODEL_TOL)
    for key in ("client_auroc_mean", "train_loss"):  # per-site statistics are not released under SecAgg+
        assert plain["final"][key] is not None and secure["final"][key] is None, key
    assert secure["communication"] == plain["communication"]  # the algorithm's bytes, as without SecAgg+


def test_the_server_receives_only_masked_vectors_and_the_aggregate(tmp_path, monkeypatch):
    sent: list[torch.Tensor] = []  # what each site's handler hands to the mod, unmasked
    means: list[dict] = []  # what the coordinator's reduce receives

    def spy_flat(payload):
        vector, layout = flat_vector(payload)
        sent.append(vector.clone())
        return vector, layout

    def spy_mean(coordinator, replies, round_, what):
        assert all("payload" not in r.arrays for r in replies.values())  # no site's own tensors
        means.append(next(iter(replies.values())).arrays["mean"])
        return real_mean(coordinator, replies, round_, what)

    real_mean = federation_module.secure_mean
    monkeypatch.setattr(secagg, "flat_vector", spy_flat)
    monkeypatch.setattr(federation_module, "secure_mean", spy_mean)
    rc = {**run_config("codasca", tmp_path), **SECURE}
    summary, grid = run_secure(rc, trial_nodes())
    assert summary["status"] == "completed", summary["error"]

    # each secure mean is the exact mean of the sites' vectors within one quantization step
    vectors = [v for v in sent if v.numel()]
    vectors, last = vectors[:-2], vectors[-2:]  # the last exchange holds the validation histograms only
    assert [v.numel() for v in last] == [2 * 4097] * 2
    assert len(vectors) == 2 * len(means) == 2 * 3  # 3 rounds, one mean each, 2 sites
    for k, mean in enumerate(means):
        exact = (vectors[2 * k] + vectors[2 * k + 1]) / 2
        assert (flat_vector(mean)[0] - exact).abs().max() <= step(64.0, 2) + 1e-6 * exact.abs().max()

    # what the server pulled: masked integers, no array carrying values, no payload in the bytes
    masked = 0
    for reply in grid.replies:
        assert all(len(record) == 0 for record in reply.content.array_records.values())
        if reply.metadata.message_type != "train":  # the set-up query: counts only
            continue
        configs = reply.content.config_records[RECORD_KEY_CONFIGS]
        if Key.MASKED_PARAMETERS in configs:
            masked += 1
            _, vector = [bytes_to_ndarray(b) for b in configs[Key.MASKED_PARAMETERS]]
            as_plain = vector.astype(np.float64) * step(64.0, 2) - 64.0  # read as if unmasked
            for v in vectors:
                if v.numel() == vector.size:
                    assert np.abs(as_plain - v.numpy()).mean() > 1.0
            ours = packet_from_bytes(reply.content.config_records["fitres.metrics"][secagg.KEY])
            assert "payload" not in ours.arrays and "mean" not in ours.arrays
    assert masked == 2 * 4  # every step exchange: 4 (3 with a mean, the last finishes round 3)


@pytest.mark.parametrize("algorithm", ["codasca", "localsgdm"])
def test_client_dp_under_secagg_clips_on_the_sites_and_equals_the_loop_engine(
    algorithm, tmp_path, monkeypatch
):
    """Clip on the site, sum securely, noise on the server: the loop engine's DP numbers (same noise
    seed); the quantization range is C, so the error of a secure mean is below 2C/levels."""
    norms: list[float] = []

    def spy_flat(payload):
        vector, layout = flat_vector(payload)
        norms.append(float(vector.norm()))
        return vector, layout

    monkeypatch.setattr(secagg, "flat_vector", spy_flat)
    rc = {**run_config(algorithm, tmp_path, lr=0.05), **SECURE, **DP}
    summary, _ = run_secure(rc, trial_nodes())
    assert summary["status"] == "completed", summary["error"]
    assert summary["privacy"]["clipped_by"] == "sites"
    params = loop_model_with_dp(rc, algorithm, 2, ClientDP(0.5, 0.8, noise_seed=7))
    assert max_abs_diff(torch.load(tmp_path / "model.pt")["params"], params) < 1e-5
    sent = [n for n in norms if n > 0]  # what each site handed to the mod: its clipped update
    assert len(sent) == 2 * rc["rounds"] and max(sent) <= 0.5 * (1 + 1e-6)
    assert max(sent) > 0.4  # the updates are clipped (raw updates are larger than C here), not zero


def test_a_value_beyond_the_range_stops_the_run_naming_the_tensor(tmp_path):
    rc = {**run_config("codasca", tmp_path), **SECURE, "secure-aggregation-range": 0.01}
    with pytest.raises(FederationError) as e:
        run_secure(rc, trial_nodes())
    message = str(e.value)
    assert "beyond secure-aggregation-range = 0.01" in message and "\n" not in message
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"


def test_one_failing_site_is_named_though_the_secure_sum_breaks(tmp_path, monkeypatch):
    """Site 1 fails in its first exchange: its vector is empty, site 0's is not, so Flower's sum of
    masked vectors fails; the run still stops naming site 1 and its own error."""
    calls = []

    def fail_second(payload, bound):
        calls.append(1)
        return "site-made failure" if len(calls) == 2 else None

    monkeypatch.setattr(secagg, "check_range", fail_second)
    rc = {**run_config("codasca", tmp_path), **SECURE}
    with pytest.raises(FederationError) as e:
        run_secure(rc, trial_nodes())
    message = str(e.value)
    assert "site 1 (node 1001, partition-id 1) failed: site-made failure" in message, message
    assert "site 0 (node 1000, partition-id 0) failed: secure aggregation halted" in message
    assert "\n" not in message


def test_pools_are_refused_before_any_message(tmp_path):
    rc = {**run_config("fedxl2", tmp_path), **SECURE}
    with pytest.raises(ConfigError) as e:
        run_local(rc, trial_nodes())
    message = str(e.value)
    assert "fedxl2 calls collective(s) ['pool']" in message and "\n" not in message


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"min-nodes": 1}, "min-nodes ≥ 2"),
        ({"buffer-policy": "local"}, "BatchNorm statistics"),
        ({"secure-aggregation-range": 0.0}, "secure-aggregation-range must be"),
    ],
)
def test_secure_aggregation_refusals_are_one_line(extra, words, tmp_path):
    rc = {**run_config("codasca", tmp_path), **SECURE, **extra}
    with pytest.raises(ConfigError) as e:
        FlowerConfig.from_run_config(rc)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kind, rate",
    [
        pytest.param("fixed", 0.5, marks=pytest.mark.slow),
        pytest.param("poisson", 0.6, marks=pytest.mark.slow),
    ],
)
def test_client_sampling_under_secagg_equals_the_loop_engine(kind, rate, tmp_path):
    """A site not drawn this round sends zeros through SecAgg+, so the secure sum is the drawn sites'
    clipped updates; the server divides as the simulation does: the loop engine's numbers."""
    from fedxrisk.engines.privacy import ClientSampling

    sampling = {"privacy": json.dumps({**PRIVACY, "sampling": kind, "sampling_rate": rate})}
    rc = {**run_config("codasca", tmp_path, lr=0.05), **SECURE, **DP, **sampling}
    summary, _ = run_secure(rc, trial_nodes(3))
    assert summary["status"] == "completed", summary["error"]
    params = loop_model_with_dp(
        rc, "codasca", 3, ClientDP(0.5, 0.8, ClientSampling(rate, kind), noise_seed=7)
    )
    assert max_abs_diff(torch.load(tmp_path / "model.pt")["params"], params) < MODEL_TOL
    assert summary["privacy"]["sampling_rate"] == rate and summary["privacy"]["clipped_by"] == "sites"


def test_under_secagg_no_site_statistic_reaches_the_server_in_clear(tmp_path, monkeypatch):
    """Issue 30 item 7, spied on every reply the server pulls in a run with DP and validation data
    (selection under DP is refused, so the model is the last one): no site's loss, AUROC, validation
    count or histogram in clear; the histograms arrive only inside SecAgg+'s sum, which the server
    recovers as the exact integer sum."""
    import fedxrisk.flower.site as site_module
    from fedxrisk.flower.app import from_records

    sites_sent, sums = [], []
    real_counts, real_sum = site_module.secure_counts, secagg.summed_counts

    def spy_counts(counts, cfg, k):
        sites_sent.append(counts.clone())
        return real_counts(counts, cfg, k)

    def spy_sum(mean, cfg, k):
        sums.append(real_sum(mean, cfg, k))
        return sums[-1]

    monkeypatch.setattr(site_module, "secure_counts", spy_counts)
    monkeypatch.setattr(secagg, "summed_counts", spy_sum)
    extra = {"validation": 0.25, "eval-every": 1}
    rc = {**run_config("codasca", tmp_path, lr=0.05), **SECURE, **DP, **extra}
    summary, grid = run_secure(rc, trial_nodes())
    assert summary["status"] == "completed", summary["error"]
    assert len(sums) == len(sites_sent) == 2 * 3  # one histogram per site and evaluation
    assert all(torch.equal(a, b) for a, b in zip(sums[::2], sums[1::2]))  # every reply: the same sum
    sums = sums[::2]
    for r, total in enumerate(sums):
        assert torch.equal(total, sites_sent[2 * r] + sites_sent[2 * r + 1])  # exact, not approximate
        assert int(total.sum()) > 0 and total.dtype == torch.int64
    assert summary["selected"]["value"] is not None  # the validation value, from the secure sum
    for reply in grid.replies:
        if reply.metadata.message_type == "query":  # set-up: the counts privacy.md lists, no more
            assert set(from_records(reply.content).metrics) == {"num-samples", "num-positives", "has-val"}
            continue
        assert all(len(record) == 0 for record in reply.content.array_records.values())
        if "fitres.metrics" not in reply.content.config_records:
            continue  # SecAgg+'s own stages: keys, shares
        ours = packet_from_bytes(reply.content.config_records["fitres.metrics"][secagg.KEY])
        assert ours.metrics == {}  # no loss, no AUROC
        assert set(ours.arrays) <= {"model"}  # the global model at evaluations; no histogram
    assert summary["final"]["train_loss"] is None and summary["final"]["client_auroc_mean"] is None


def test_selection_under_dp_without_secagg_is_refused(tmp_path):
    """Under DP the validation histograms are a noised release of their secure sum (docs/privacy.md):
    without SecAgg+ the server would see each site's histogram, so the run is refused."""
    rc = {**run_config("codasca", tmp_path), **DP, "validation": 0.25, "selection": "best"}
    with pytest.raises(ConfigError, match="set secure-aggregation = true"):
        FlowerConfig.from_run_config(rc)
    assert FlowerConfig.from_run_config({**rc, **SECURE}).run.selection == "best"

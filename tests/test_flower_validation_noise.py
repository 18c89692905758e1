"""Issue 40 item 4, the validation half: under DP on Flower the sites add the validation noise.

The attacker is the Flower server (in one process: the real ClientApp behind Flower's SecAgg+
mod, the real SecAggPlusWorkflow). A DP run choosing on validation (``selection = "best"``)
used to give the server the exact integer sum of the sites' validation histograms before the
server added the noise. Spied on what SecAgg+ hands the server: it never holds an exact integer
histogram sum — only the sites' coarse histograms plus the noise, whose spread is the one the
release promises (zΔ per count).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")

import fedxrisk.flower.secagg as secagg  # noqa: E402
import fedxrisk.flower.site as site_module  # noqa: E402
from fedxrisk.engines.privacy.noise import NoiseSource  # noqa: E402
from fedxrisk.engines.privacy.validation import ValidationDP, coarsen, noise  # noqa: E402
from fedxrisk.flower.private import validation_share  # noqa: E402
from flower_grid import InProcessGrid  # noqa: E402,F401
from test_flower_protocol import run_config, trial_nodes  # noqa: E402
from test_flower_secagg import SECURE, run_secure  # noqa: E402

PRIVACY_NO_Z = {"clip": 0.5, "noise_multiplier": 0.8}
PRIVACY = {**PRIVACY_NO_Z, "validation_noise_multiplier": 0.05}


@pytest.mark.slow
def test_the_flower_server_never_holds_an_exact_validation_sum(tmp_path, monkeypatch):
    sent, sums, exact_sums = [], [], []
    real_counts, real_shares, real_exact = site_module.site_counts, secagg.summed_shares, secagg.summed_counts

    def spy_counts(cfg, y, scores):  # each site's own (fixed-mass) histogram, before its noise
        sent.append(real_counts(cfg, y, scores))
        return sent[-1]

    def spy_shares(*args):  # what the server obtains from SecAgg+
        sums.append(real_shares(*args))
        return sums[-1]

    def spy_exact(mean, cfg, k):
        exact_sums.append(real_exact(mean, cfg, k))
        return exact_sums[-1]

    monkeypatch.setattr(site_module, "site_counts", spy_counts)
    monkeypatch.setattr(secagg, "summed_shares", spy_shares)
    monkeypatch.setattr(secagg, "summed_counts", spy_exact)
    extra = {"validation": 0.25, "eval-every": 1, "selection": "best", "privacy": json.dumps(PRIVACY)}
    rc = {**run_config("codasca", tmp_path, lr=0.05), **SECURE, **extra}
    summary, _ = run_secure(rc, trial_nodes())
    assert summary["status"] == "completed", summary["error"]
    assert exact_sums == []  # no exact validation sum is ever decoded on the server
    assert len(sums) == len(sent) == 2 * 3  # one share per site and evaluation, the sum on each reply
    dp = ValidationDP(0.05, "client", 16, 1)
    residuals = []
    for r in range(3):
        total = sums[2 * r].numpy()
        exact = coarsen(sent[2 * r] + sent[2 * r + 1], dp.bins)
        assert exact.sum() > 0 and np.array_equal(exact, np.rint(exact))
        assert not np.array_equal(total, np.rint(total))  # no integer histogram reaches the server
        residuals.append((total - exact)[..., :-1].ravel())
    noise = np.concatenate(residuals)  # 3 × 2 classes × 16 bins of N(0, (zΔ)²) if the sites noised it
    assert abs(noise.std() / dp.std - 1) < 0.35 and abs(noise.mean()) < 4 * dp.std / math.sqrt(noise.size)
    assert summary["selected"]["value"] is not None  # the model is still chosen on the release


def test_a_sites_share_carries_its_part_of_the_noise_from_a_secret():
    """The shares of two sites sum to the Gaussian mechanism's output; two calls of one site (the
    secret source) draw different noise; the test mode's seed reproduces it."""
    from fedxrisk.flower.config import FlowerConfig

    rc = {**run_config("codasca", "/tmp/unused"), **SECURE, "validation": 0.25, "selection": "best"}
    cfg = FlowerConfig.from_run_config({**rc, "privacy": json.dumps(PRIVACY)})
    counts = np.zeros((1, 2, 4097), dtype=np.int64)
    counts[0, 0, 2000], counts[0, 1, 2100] = 256, 256
    a, b = validation_share(cfg, counts, 2, 0, 0), validation_share(cfg, counts, 2, 0, 0)
    assert a.shape == (1, 2, 17) and not np.array_equal(a, b) and (a[..., -1] == 0).all()
    dp = ValidationDP(0.05, "client", 16, 1)
    draws = np.stack([validation_share(cfg, counts, 4, 0, 0) - coarsen(counts, 16) for _ in range(200)])
    assert abs(draws[..., :-1].std() / (dp.std / 2) - 1) < 0.05  # σ/√K with K = 4
    seeded = FlowerConfig.from_run_config({**rc, "privacy": json.dumps({**PRIVACY, "reproducible_noise": 3})})
    # the test mode: the two sites' shares add up to the noise every simulation engine draws
    both = sum(validation_share(seeded, counts, 2, 5, k) - coarsen(counts, 16) for k in range(2))
    assert np.abs(both - noise(dp, NoiseSource.reproducible(3), 5, both.shape, 2)).max() < 1e-9
    assert np.array_equal(
        validation_share(seeded, counts, 2, 1, 0), validation_share(seeded, counts, 2, 1, 0)
    )
    assert not np.array_equal(
        validation_share(seeded, counts, 2, 1, 0), validation_share(seeded, counts, 2, 1, 1)
    )
    plain = FlowerConfig.from_run_config({**rc, "privacy": json.dumps(PRIVACY_NO_Z), "selection": "last"})
    assert validation_share(plain, counts, 2, 0, 0) is None  # not chosen on validation: no release

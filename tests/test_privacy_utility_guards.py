"""Issue 40 item 6: utility guards of DP runs.

1. A released validation AUROC within 2 noise SDs of ½ cannot tell a model from its inverse: the
   run says so (once). The noise SD it states (``val_auroc_noise_sd``, a parametric bootstrap of the
   release) is checked against the real spread of the release over independent (seeded) draws, and
   the rule fires on an inverted model seen through heavy noise but not on a good one through light.
2. Client-level DP states up front the noise-to-clip ratio σ/(qK) of the mean update, with a
   warning at ≥ 1: the ratio is checked against the noise the private aggregator really adds.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.engines.privacy.validation import (
    ValidationDP,
    ValidationRelease,
    auroc_noise_sd,
    inversion_warning,
    release,
)
from fedxrisk.engines.validation import released_validation, score_histograms
from fedxrisk.run.privacy_outputs import update_noise_note, update_noise_ratio
from fedxrisk.stats.histogram import histogram_auroc


def _fine(n: int, shift: float, seed: int = 0) -> np.ndarray:
    """Summed fine histograms of ``n`` records a model scores ``shift`` logits higher when positive."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    return score_histograms(y.astype(float), rng.normal(size=n) + shift * y, 1)


def test_the_stated_noise_sd_is_the_releases_real_spread():
    dp = ValidationDP(3.0, "instance", 8)
    fine = _fine(400, 1.0)
    # independent draws, seeded so that the test cannot fail on an unlucky spread (secret noise did)
    released = [release(fine, dp, NoiseSource.reproducible(seed), 1) for seed in range(400)]
    real = np.std([histogram_auroc(r[0]) for r in released])
    stated = np.median([auroc_noise_sd(r, dp) for r in released[:20]])
    assert stated == pytest.approx(real, rel=0.3) and real > 0.005


def test_an_inverted_model_through_heavy_noise_is_flagged_a_good_one_through_light_noise_is_not():
    heavy, light = ValidationDP(10.0, "instance", 16), ValidationDP(0.2, "instance", 16)
    for seed in range(5):  # test-mode noise: the same draws every time
        inverted = released_validation(
            _fine(60, -1.5), ValidationRelease(heavy, NoiseSource.reproducible(seed)), 1
        )
        good = released_validation(
            _fine(2000, 1.5), ValidationRelease(light, NoiseSource.reproducible(seed)), 1
        )
        assert "cannot tell this model from its inverse" in inversion_warning(
            inverted["val_auroc"], inverted["val_auroc_noise_sd"]
        )
        assert good["val_auroc"] > 0.8
        assert inversion_warning(good["val_auroc"], good["val_auroc_noise_sd"]) is None
    assert (
        inversion_warning(0.45, 0.02) is None and inversion_warning(0.47, 0.02) is not None
    )  # the 2-SD rule


@pytest.mark.slow  # a DP run end to end
def test_a_dp_run_choosing_on_noise_warns_once_and_writes_the_noise_sd(tmp_path, capsys):
    from fedxrisk.run.configfile import load_config
    from fedxrisk.run.recipes import run_experiment

    sets = [
        "experiment.rounds=3", "data.clients=2", "experiment.eval_every=1", "experiment.tensorboard=false",
        "algorithm.algorithm=localsgdm", "data.validation=0.25", "privacy.clip=0.5", "privacy.noise_multiplier=1",
        "privacy.level=instance", "experiment.selection=best", "privacy.validation_noise_multiplier=8",
        "privacy.validation_bins=8", "data.imratio=0.3",
    ]  # fmt: skip
    run_experiment(load_config(None, sets), tmp_path / "run")
    rows = list(csv.DictReader(open(tmp_path / "run" / "history.csv")))
    sds = [float(r["val_auroc_noise_sd"]) for r in rows]
    assert len(sds) == 3 and all(sd > 0 for sd in sds)
    flagged = [inversion_warning(float(r["val_auroc"]), sd) for r, sd in zip(rows, sds)]
    assert any(flagged)  # z = 8 on a few dozen validation records: the release is noise
    assert capsys.readouterr().err.count("cannot tell this model from its inverse") == 1  # said once


def test_the_update_noise_ratio_is_the_noise_the_aggregator_adds():
    """σ/(qK)·C per coordinate: measured on the private collective's noised mean of K zero updates."""
    from fedxrisk.engines.privacy import ClientDP, PrivateAggregator

    sigma, clip, k = 2.0, 0.5, 4

    class Zero:  # the smallest algorithm the aggregator needs: one mean of a flat tree
        name = "zero"

    try:
        agg = PrivateAggregator(ClientDP(clip, sigma), Zero(), {"w": torch.zeros(4000)}, 0, k)
        stacked = {"w": torch.zeros(k, 4000)}
        out = agg.aggregate(stacked, torch.ones(k, dtype=torch.bool), 0, float(k))
    except (TypeError, AttributeError) as e:  # the aggregator wants more of an algorithm
        pytest.skip(f"aggregator API: {e}")
    measured = float(next(iter(out.values())).double().std())
    assert measured == pytest.approx(update_noise_ratio(sigma, 1.0, k) * clip, rel=0.05)


def test_client_level_dp_states_the_ratio_up_front_and_warns_when_hopeless():
    assert update_noise_ratio(9.5, 1.0, 4) == pytest.approx(2.375)
    assert "WARNING" in update_noise_note("client", 9.5, 1.0, 4, 1.0)
    assert "WARNING" not in update_noise_note("client", 0.8, 0.5, 40, 1.0)  # 0.04× C
    assert update_noise_note("instance", 9.5, 1.0, 4, 1.0) is None
    hopeless = CliRunner().invoke(main, ["check", "--set", "privacy.clip=1", "--set", "privacy.noise_multiplier=9.5",
                                         "--set", "data.clients=4"])  # fmt: skip
    assert (
        hopeless.exit_code == 0 and "2.38× the clip C = 1" in hopeless.output and "WARNING" in hopeless.output
    )
    fine = CliRunner().invoke(main, ["check", "--set", "privacy.clip=1", "--set", "privacy.noise_multiplier=0.5",
                                     "--set", "data.clients=50"])  # fmt: skip
    assert "0.01× the clip C" in fine.output and "WARNING" not in fine.output
    assert not math.isnan(update_noise_ratio(1.0, 0.1, 10))

"""Issue 40 item 5: refusals and errors that read no private count, attacked by comparing messages.

An attacker who sees an error message tries to learn a site's counts from it: two sites'
data that differ only in private counts must give the same message, with no number the data
determine (the controls: the refusal still happens).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedxrisk.engines.privacy.validation import ValidationDP, noise_refusal, sites_needed
from fedxrisk.run.privacy import DEFAULTS


def test_the_client_level_noise_refusal_names_no_sites_class_masses():
    dp = ValidationDP(DEFAULTS["validation_noise_multiplier"], "client", DEFAULTS["validation_bins"])
    answers = set()
    for positives in ((5, 9), (0, 9), (1, 1), (40, 0)):  # per site: how many validation positives
        y = np.concatenate([np.r_[np.ones(p), np.zeros(30)] for p in positives])
        shards = [np.arange(0, 30 + positives[0]), np.arange(30 + positives[0], len(y))]
        answers.add(noise_refusal(dp, y, shards))
    assert len(answers) == 1  # the same line whoever holds which class
    (line,) = answers
    assert "would be noise" in line and "the 2 sites holding validation data" in line
    assert f"needs {sites_needed(dp)} sites" in line and "positive" not in line


def test_the_secure_sum_overflow_names_no_count():
    pytest.importorskip("flwr", reason="needs the optional extra")
    from fedxrisk.flower.secure import count_cap, secure_counts

    cap = count_cap(2)

    from fedxrisk.flower.config import FlowerConfig

    cfg = FlowerConfig.from_run_config({"min-nodes": 2, "secure-aggregation": True})
    lines = set()
    for count in (cap + 1, cap + 12345):
        with pytest.raises(ValueError) as e:
            secure_counts(torch.tensor([count, 0]), cfg, 2)
        lines.add(str(e.value))
    assert len(lines) == 1 and str(cap + 1) not in next(iter(lines))


def test_client_level_dp_takes_the_declared_p_not_the_sites_count():
    """Issue 40 item 5: the pooled p counted from every site moved with one site's data; the loss
    and the default lr now see the declared p whatever the sites hold."""
    from fedxrisk.run.build import build
    from fedxrisk.run.configfile import load_config

    base = [
        "experiment.rounds=1",
        "algorithm.algorithm=codasca",
        "privacy.clip=1",
        "privacy.noise_multiplier=1",
    ]
    ps, lrs = [], []
    for clients in (3, 4):  # one site more or less: other counts
        setup = build(
            load_config(None, [*base, f"data.clients={clients}", "privacy.pos_ratio=0.2", "data.imratio=0.1"])
        )
        ps.append(setup.simulation.states["p"].unique().tolist())
        lrs.append(setup.simulation.schedule.stages[0].lr)
        assert setup.data.data.pos_ratio != 0.2  # the counted ratio is not what the loss sees
    assert ps == [[pytest.approx(0.2)]] * 2
    assert lrs == [pytest.approx(3 * 0.1 * 0.9 / (0.2 * 0.8))] * 2  # the default lr at the declared p

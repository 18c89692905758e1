"""Survival core: Harrell's C-index against lifelines, its variance against the bootstrap, the Cox
objective against a brute-force partial likelihood and its X-risk form, and the readers' refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedxrisk.data.readers.base import DataFileError
from fedxrisk.data.readers.survival import read_survival_table
from fedxrisk.objectives.survival import (
    concordance_surrogate,
    cox_compositional,
    cox_partial_likelihood,
)
from fedxrisk.stats.concordance import concordance, per_site_concordance

lifelines = pytest.importorskip("lifelines")


def _survival(n: int, seed: int, tied_times: bool = False, tied_scores: bool = False):
    rng = np.random.default_rng(seed)
    risk = rng.normal(size=n)
    t = rng.exponential(np.exp(-risk))
    c = rng.exponential(1.5, size=n)
    times, events = np.minimum(t, c), (t <= c).astype(int)
    if tied_times:
        times = np.round(times * 4) / 4
    scores = risk + rng.normal(scale=0.7, size=n)
    if tied_scores:
        scores = np.round(scores)
    return times, events, scores


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [(False, False), (True, False), (False, True), (True, True)])
def test_c_index_equals_lifelines(seed, ties):
    times, events, scores = _survival(60 + 17 * seed, seed, *ties)
    ours = concordance(times, events, scores).c_index
    ref = lifelines.utils.concordance_index(times, -scores, events)
    assert abs(ours - ref) < 1e-12


def test_c_index_all_censored_but_one_and_no_pairs():
    times = np.array([1.0, 2.0, 3.0])
    assert concordance(times, np.array([1, 0, 0]), np.array([3.0, 2.0, 1.0])).c_index == 1.0
    with pytest.raises(ValueError, match="no comparable pair"):
        concordance(times, np.array([0, 0, 0]), np.array([3.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="0 \\(censored\\) or 1"):
        concordance(times, np.array([2, 0, 0]), np.array([3.0, 2.0, 1.0]))


@pytest.mark.slow  # a bootstrap of many resamples
def test_variance_matches_the_bootstrap():
    """The U-statistic variance is within 25 % of 2,000 bootstrap resamples' variance."""
    times, events, scores = _survival(300, 11, tied_times=True)
    est = concordance(times, events, scores)
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(2000):
        i = rng.integers(0, len(times), len(times))
        boots.append(concordance(times[i], events[i], scores[i]).c_index)
    ratio = est.variance / np.var(boots)
    assert 0.75 < ratio < 1.25, ratio
    assert est.low < est.c_index < est.high


def test_per_site_equals_each_site_alone():
    times, events, scores = _survival(200, 3)
    sites = np.arange(200) % 3
    per = per_site_concordance(times, events, scores, sites)
    for s in range(3):
        alone = concordance(times[sites == s], events[sites == s], scores[sites == s])
        assert per[s] == alone


def _brute_cox(eta: np.ndarray, times: np.ndarray, events: np.ndarray) -> float:
    total = 0.0
    for i in np.flatnonzero(events):
        risk = [math.exp(eta[j]) for j in range(len(eta)) if times[j] >= times[i]]
        total += eta[i] - math.log(sum(risk))
    return -total / events.sum()


@pytest.mark.parametrize("tied", [False, True])
def test_cox_equals_brute_force_and_the_xrisk_form_has_its_gradient(tied):
    times, events, _ = _survival(40, 5, tied_times=tied)
    eta = torch.tensor(np.random.default_rng(1).normal(size=40), dtype=torch.float64, requires_grad=True)
    t, e = torch.tensor(times), torch.tensor(events)
    loss = cox_partial_likelihood(eta, t, e)
    assert abs(loss.item() - _brute_cox(eta.detach().numpy(), times, events)) < 1e-12
    (g1,) = torch.autograd.grad(loss, eta)
    ev = e.bool()
    xrisk = cox_compositional(eta[ev], t[ev], eta, t)
    assert abs(xrisk.item() + math.log(40) - loss.item()) < 1e-12
    (g2,) = torch.autograd.grad(xrisk, eta)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-12)


def test_concordance_surrogate_is_monotone_in_the_c_index():
    times, events, scores = _survival(80, 2)
    t, e = torch.tensor(times), torch.tensor(events)
    good = concordance_surrogate(torch.tensor(scores), t, e)
    bad = concordance_surrogate(torch.tensor(-scores), t, e)
    assert concordance(times, events, scores).c_index > 0.5 and good < bad


def test_generic_reader_refuses_bad_survival_labels(tmp_path):
    def write(rows):
        p = tmp_path / "s.csv"
        p.write_text("time,event,age\n" + "\n".join(rows) + "\n")
        return p

    good = [f"{i + 1},{i % 2},{30 + i}" for i in range(20)]
    data = read_survival_table(write(good))
    assert len(data.y_train) + len(data.y_test) == 20 and "time" in data.groups_train
    with pytest.raises(DataFileError, match="negative survival time"):
        read_survival_table(write(["-1,1,30", *good]))
    with pytest.raises(DataFileError, match="events must be 0"):
        read_survival_table(write(["1,2,30", *good]))
    with pytest.raises(DataFileError, match="no event observed"):
        read_survival_table(write([f"{i + 1},0,{i}" for i in range(20)]))

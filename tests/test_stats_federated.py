"""Federated DeLong (fedxrisk.stats.federated) against the pooled exact DeLong (pROC-checked)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedxrisk.stats import delong, delong_paired, histogram_ap, histogram_pauc, logit_edges
from fedxrisk.stats.federated import (
    bin_index,
    federated_delong,
    federated_paired,
    placement_shares,
    se_bound,
    simulate,
    site_histograms,
)


def _sites(seed: int, sizes: list[int], rate: float = 0.3, ties: bool = False):
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        y = rng.random(n) < rate
        s1 = rng.normal(size=n) + 1.2 * y
        s2 = 0.6 * s1 + 0.8 * rng.normal(size=n) + 0.4 * y
        if ties:
            s1, s2 = np.round(s1, 1), np.round(s2, 1)
        out.append((y, [s1, s2]))
    return out


def _pooled(sites):
    y = np.concatenate([s[0] for s in sites])
    return y, np.concatenate([s[1][0] for s in sites]), np.concatenate([s[1][1] for s in sites])


def _centres(edges: np.ndarray) -> np.ndarray:
    return np.r_[edges[0] - 0.5, (edges[:-1] + edges[1:]) / 2, edges[-1] + 0.5]


@pytest.mark.parametrize(
    "sizes, ties",
    [([60, 90, 40, 25], False), ([60, 90, 40, 25], True), ([3, 2, 200, 1], False), ([400], True)],
)
def test_on_bin_centres_equal_to_exact_delong(sizes, ties):
    """Scores on bin centres: no bin holds two different scores, so every number is exact."""
    edges = logit_edges(64, 4.0)
    centres = _centres(edges)
    sites = [(y, [centres[bin_index(s, edges)] for s in ss]) for y, ss in _sites(1, sizes, ties=ties)]
    totals, moments = simulate(sites, edges)
    y, s1, s2 = _pooled(sites)
    fed, exact = federated_delong(totals, moments), delong(y, s1)
    assert fed.auroc == pytest.approx(exact.auroc, abs=1e-12)
    assert fed.variance == pytest.approx(exact.variance, abs=1e-12)
    assert (fed.low, fed.high) == pytest.approx((exact.low, exact.high), abs=1e-12)
    fp, ep = federated_paired(totals, moments), delong_paired(y, s1, s2)
    assert fp.difference == pytest.approx(ep.difference, abs=1e-12)
    assert fp.se == pytest.approx(ep.se, abs=1e-12)
    assert fp.p_value == pytest.approx(ep.p_value, abs=1e-12)
    assert fed.ap == pytest.approx(histogram_ap(totals[0]), abs=0)


def test_equal_to_exact_delong_of_the_bin_indices():
    """Whatever the scores, federated DeLong is the exact DeLong of the scores replaced by their bins."""
    edges = logit_edges(20, 2.0)  # coarse: many different scores share a bin
    sites = _sites(2, [50, 70, 35])
    totals, moments = simulate(sites, edges)
    y, s1, s2 = _pooled(sites)
    b1, b2 = bin_index(s1, edges), bin_index(s2, edges)
    fed, exact = federated_delong(totals, moments, model=1), delong(y, b2)
    assert fed.auroc == pytest.approx(exact.auroc, abs=1e-12)
    assert fed.variance == pytest.approx(exact.variance, abs=1e-12)
    fp, ep = federated_paired(totals, moments), delong_paired(y, b1, b2)
    assert (fp.z, fp.p_value) == pytest.approx((ep.z, ep.p_value), abs=1e-12)
    assert exact.auroc != pytest.approx(delong(y, s2).auroc, abs=1e-6)  # the bins did change something


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("bins", [12, 40, 4096])
def test_within_the_printed_binning_bound(seed, bins):
    edges = logit_edges(bins, 3.0)
    sites = _sites(seed, [40, 25, 7, 60], ties=seed % 2 == 1)
    totals, moments = simulate(sites, edges)
    y, s1, s2 = _pooled(sites)
    fed, exact = federated_delong(totals, moments), delong(y, s1)
    tol = 1e-12
    assert abs(fed.auroc - exact.auroc) <= fed.auroc_bound + tol
    assert abs(fed.se - exact.se) <= fed.se_bound + tol
    assert abs(fed.low - exact.low) <= fed.ci_bound + tol and abs(fed.high - exact.high) <= fed.ci_bound + tol
    fp, ep = federated_paired(totals, moments), delong_paired(y, s1, s2)
    assert abs(fp.difference - ep.difference) <= fp.difference_bound + tol
    assert abs(fp.se - ep.se) <= fp.se_bound + tol
    assert fp.p_low - tol <= ep.p_value <= fp.p_high + tol
    if bins == 12:  # coarse bins: the bounds are not vacuous zeros
        assert fed.auroc_bound > 0 and fed.se_bound > 0 and fp.p_high > fp.p_low


def test_one_class_and_empty_sites_add_nothing_wrong():
    edges = logit_edges()
    rng = np.random.default_rng(3)
    only_neg = (np.zeros(30, bool), [rng.normal(size=30)] * 2)
    only_pos = (np.ones(4, bool), [rng.normal(size=4) + 1] * 2)
    empty = (np.zeros(0, bool), [np.zeros(0)] * 2)
    sites = [*_sites(3, [50, 20]), only_neg, only_pos, empty]
    totals, moments = simulate(sites, edges)
    y, s1, _ = _pooled(sites)
    fed, exact = federated_delong(totals, moments), delong(y, s1)
    assert abs(fed.auroc - exact.auroc) <= fed.auroc_bound + 1e-12
    assert abs(fed.se - exact.se) <= fed.se_bound + 1e-12
    assert (fed.positives, fed.negatives) == (int(y.sum()), int((~y).sum()))
    assert placement_shares(totals, *empty, edges).tolist() == [0.0] * 12


def test_a_class_missing_everywhere_or_a_nan_score_gives_nan():
    edges = logit_edges()
    only_neg = [(np.zeros(10, bool), [np.arange(10.0)])]
    assert math.isnan(federated_delong(*simulate(only_neg, edges)).auroc)
    y = np.r_[np.ones(5, bool), np.zeros(5, bool)]
    s = np.arange(10.0)
    s[3] = np.nan
    fed = federated_delong(*simulate([(y, [s])], edges))
    assert math.isnan(fed.auroc) and math.isnan(fed.variance) and math.isnan(delong(y, s).auroc)


def test_one_positive_has_an_auroc_but_no_variance():
    y = np.r_[True, np.zeros(9, bool)]
    s = np.arange(10.0)[::-1]
    fed = federated_delong(*simulate([(y, [s])], logit_edges()))
    assert fed.auroc == delong(y, s).auroc == 1.0
    assert math.isnan(fed.variance) and math.isnan(fed.low)


def test_histograms_and_shares_are_sums_over_sites():
    """The secure aggregator only adds: two sites merged into one give the same totals and moments."""
    edges = logit_edges(256, 4.0)
    a, b = _sites(5, [30, 45])
    merged = (np.r_[a[0], b[0]], [np.r_[a[1][i], b[1][i]] for i in range(2)])
    t2, m2 = simulate([a, b], edges)
    t1, m1 = simulate([merged], edges)
    assert np.array_equal(t1, t2) and np.allclose(m1, m2, atol=1e-14)
    assert np.array_equal(site_histograms(*a, edges) + site_histograms(*b, edges), t2)
    assert ((m2 >= 0) & (m2 <= 1 + 1e-12)).all()


def test_ap_and_pauc_are_the_histogram_metrics_of_the_pooled_counts():
    edges = logit_edges()
    sites = _sites(6, [80, 40])
    totals, moments = simulate(sites, edges)
    fed = federated_delong(totals, moments, max_fpr=0.2)
    assert fed.ap == histogram_ap(totals[0]) and fed.pauc == histogram_pauc(totals[0], 0.2)


def test_every_score_in_one_bin():
    """One bin holds everything: binned V10 = V01 = ½ (AUROC ½, SE 0); the bounds cover the exact values."""
    y = np.r_[np.ones(6, bool), np.zeros(6, bool)]
    s = np.r_[np.linspace(0.05, 0.2, 6), np.linspace(0.0, 0.15, 6)]
    edges = logit_edges(3, 1.0)
    totals, moments = simulate([(y, [s])], edges)
    fed, exact = federated_delong(totals, moments), delong(y, s)
    assert fed.auroc == 0.5 and fed.auroc_bound == 0.5 and fed.se == 0.0
    assert 0.5 < exact.auroc <= 1.0 and 0 < exact.se <= se_bound(totals[0])


def test_one_models_moments_follow_from_its_pooled_histogram():
    """Round 2 adds nothing for one model: the summed placement shares equal those computed from
    the pooled histogram alone (a binned placement value depends only on its bin)."""
    from fedxrisk.stats.federated import histogram_moments

    edges = logit_edges(50, 3.0)
    sites = [(y, [ss[0]]) for y, ss in _sites(7, [40, 25, 9], ties=True)]
    totals, moments = simulate(sites, edges)
    assert np.allclose(histogram_moments(totals), moments, atol=1e-15, rtol=0)
    with pytest.raises(ValueError, match="one model"):
        histogram_moments(np.concatenate([totals, totals]))

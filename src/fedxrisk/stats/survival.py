"""Harrell's C-index of a survival model's test risk scores, pooled and per site, with intervals that
resample patients (the test set's sampling uncertainty, not the training seed's).

:func:`cindex_report` is what ``summary.json`` (``test_cindex``) and ``fedxrisk evaluate`` give for a
survival run: the pooled C-index, each site's own C-index, and the mean of the sites' C-indices
(FLamby's "mean regional" convention), each with a percentile interval over ``draws`` resamples of
the patients *within each site* (so every resample keeps the sites' sizes). A resample is a
multinomial count per patient, and Harrell's C of a resample is the count-weighted ratio
``Σ w_i w_j K_ij / Σ w_i w_j M_ij`` (:mod:`fedxrisk.stats.concordance`'s K and M), which is C on the
resampled patients (a patient is never comparable with its own copy). O(draws · n²).

No interval is given — and the record says why — where one would mislead: a C-index of exactly 0
or 1 (every comparable pair agrees: the percentile bootstrap cannot leave the bound, it would print
[1, 1]) or fewer than :data:`MIN_EVENTS` events (the C-index then rests on a handful of patients).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedxrisk.stats.concordance import _survival_arrays, comparable_pairs

MIN_EVENTS = 5  # fewer events than this: a C-index without an interval (said in its note)
DRAWS = 1000


def _pair_matrices(t: np.ndarray, e: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = comparable_pairs(t, e)
    return m * ((s[:, None] > s[None, :]) + 0.5 * (s[:, None] == s[None, :])), m


def _weighted_c(k: np.ndarray, m: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Harrell's C of each resample (rows of counts ``w``); NaN where no pair is comparable."""
    num, den = ((w @ k) * w).sum(1), ((w @ m) * w).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _entry(c: float, draws: np.ndarray, events: int, patients: int, level: float) -> dict[str, Any]:
    out: dict[str, Any] = {"c_index": c, "low": None, "high": None, "patients": patients, "events": events}
    finite = draws[np.isfinite(draws)]
    if not np.isfinite(c):
        out["note"] = "no comparable pair (no event before another patient's time): no C-index"
    elif events < MIN_EVENTS:
        out["note"] = f"only {events} event(s): too few for an interval"
    elif c in (0.0, 1.0):
        out["note"] = (
            f"C = {c:g}: every comparable pair agrees, so resampling the patients cannot leave {c:g}; "
            "no interval (it would read [{0}, {0}])".format(f"{c:g}")
        )
    elif len(finite) < 0.9 * len(draws):
        out["note"] = "fewer than 90 % of the resamples have a comparable pair: no interval"
    else:
        alpha = (1 - level) / 2
        out["low"], out["high"] = (float(v) for v in np.quantile(finite, [alpha, 1 - alpha]))
    return out


def _resample_counts(site: np.ndarray, draws: int, seed: int) -> np.ndarray:
    """``[draws, n]`` multinomial counts: each draw resamples the patients within each site."""
    rng = np.random.default_rng([seed, 41])
    w = np.zeros((draws, len(site)))
    for k in np.unique(site):
        rows = np.flatnonzero(site == k)
        w[:, rows] = rng.multinomial(len(rows), np.full(len(rows), 1 / len(rows)), size=draws)
    return w


def _site_draws(
    k_all: np.ndarray, m_all: np.ndarray, site: np.ndarray, w: np.ndarray
) -> list[tuple[Any, np.ndarray, float, np.ndarray]]:
    """Each site's (id, rows, Harrell's C of its patients, C of each resample ``w``'s rows), in
    ``np.unique`` order: the one per-site loop of :func:`bootstrap_draws` and :func:`cindex_report`."""
    out = []
    for k in np.unique(site):
        rows = np.flatnonzero(site == k)
        ks, ms = k_all[np.ix_(rows, rows)], m_all[np.ix_(rows, rows)]
        c = float(_weighted_c(ks, ms, np.ones((1, len(rows))))[0])
        out.append((k, rows, c, _weighted_c(ks, ms, w[:, rows])))
    return out


def bootstrap_draws(
    times: Any, events: Any, scores: Any, sites: Any, draws: int = DRAWS, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(pooled C, mean over sites of the sites' C) of each of ``draws`` resamples of the patients
    within each site; the same ``seed`` draws the same resamples for another model's scores of the
    same patients (paired), so per-draw values of several models (seeds) can be averaged."""
    t, e, s = _survival_arrays(times, events, scores)
    site = np.asarray(sites).ravel()
    w = _resample_counts(site, draws, seed)
    k_all, m_all = _pair_matrices(t, e, s)
    per_site = [d for _, _, _, d in _site_draws(k_all, m_all, site, w)]
    with np.errstate(invalid="ignore"):
        return _weighted_c(k_all, m_all, w), np.nanmean(np.stack(per_site), 0)


def cindex_report(
    times: Any,
    events: Any,
    scores: Any,
    sites: Any = None,
    site_names: Sequence[str] = (),
    draws: int = DRAWS,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """Pooled, per-site and mean-over-sites Harrell's C of risk ``scores`` (higher = earlier
    failure) with patient-bootstrap percentile intervals at ``level`` (module doc)."""
    t, e, s = _survival_arrays(times, events, scores)
    site = np.zeros(len(t), np.int64) if sites is None else np.asarray(sites).ravel()
    w = _resample_counts(site, draws, seed)
    k_all, m_all = _pair_matrices(t, e, s)
    pooled = _entry(
        float(_weighted_c(k_all, m_all, np.ones((1, len(t))))[0]),
        _weighted_c(k_all, m_all, w),
        int(e.sum()),
        len(t),
        level,
    )
    sites_draws = _site_draws(k_all, m_all, site, w)
    per_site, site_draws, site_values = {}, [], []
    for key, rows, c, d in sites_draws:
        k = int(key)
        name = site_names[k] if 0 <= k < len(site_names) else f"site {k}"
        per_site[name] = _entry(c, d, int(e[rows].sum()), len(rows), level)
        if np.isfinite(c):
            site_values.append(c)
            site_draws.append(d)
    out = {
        "pooled": pooled,
        "per_site": per_site,
        "interval": f"{level:.0%} percentile interval over {draws} resamples of the evaluated patients within "
        f"each site (seed {seed}); Harrell's C, ties in score count ½",
    }
    if len(sites_draws) > 1 and site_values:
        mean = float(np.mean(site_values))
        with np.errstate(invalid="ignore"):
            mean_draws = np.nanmean(np.stack(site_draws), 0) if site_draws else np.full(draws, np.nan)
        entry = _entry(mean, mean_draws, int(e.sum()), len(t), level)
        entry["sites"] = len(site_values)
        out["mean_over_sites"] = entry
    return out


def describe(entry: dict[str, Any]) -> str:
    """``0.812 [0.74, 0.87] (57 events)``, or the value with its note when there is no interval."""
    c = entry["c_index"]
    value = "—" if c is None or not np.isfinite(c) else f"{c:.3f}"
    events = f"{entry['events']} event{'' if entry['events'] == 1 else 's'}"
    if entry.get("low") is not None:
        return f"{value} [{entry['low']:.3f}, {entry['high']:.3f}] ({events})"
    return f"{value} ({events}; {entry.get('note', 'no interval')})"

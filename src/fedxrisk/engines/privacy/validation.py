"""Validation under DP: the summed per-class validation score histograms through the Gaussian mechanism.

A run that chooses its model on validation data (``selection = "best"``, early stopping) releases,
at every evaluation, the sum over clients of their per-class score histograms; under DP each
release gets Gaussian noise and is accounted like a round (a ``GaussianDpEvent``, no subsampling;
:mod:`~fedxrisk.engines.privacy.accountant`). What one unit moves (L2 sensitivity Δ):

* instance level: one validation record moves one count by 1 in each label's histogram: Δ = √L;
* client level: one site's whole histogram. Each site scales each of its per-class histograms to
  the fixed mass :data:`SITE_MASS` (integers, largest-remainder rounding: SecAgg+ still sums them
  exactly), so a site's contribution has L1 mass ≤ S per class and Δ = √(2L)·S, whatever its size.
  What it changes: the released AUROC is that of the equal-weight mixture of the sites' per-class
  score distributions, not of the pooled records.

The release (:func:`release`): the summed histogram is coarsened to ``bins`` logit bins over
±:data:`LIMIT` (the fine bins of :func:`~fedxrisk.stats.score_histogram` grouped; the NaN column is
not released), N(0, (zΔ)²) is added to every count from the run's
:class:`~fedxrisk.engines.privacy.noise.NoiseSource` (sub-stream (:data:`VALIDATION_STREAM`, round)),
and the result is clipped at 0 and rounded (post-processing). The noise is the sum of K shares
N(0, (zΔ)²/K), one per site (sub-stream (:data:`VALIDATION_STREAM`, round, site)): on Flower each site
adds its own share before SecAgg+'s sum, so the server never holds an exact sum (issue 40); the
simulation engines add the same K shares, so in the test mode every engine selects the same model.

**When the release is noise** (:meth:`ValidationDP.signal`): the clipped noise puts an expected
mass m = bins·zΔ/√(2π) into each class's histogram, spread over all bins, which pulls the AUROC
towards ½ by the factor ρ = Π_c n_c / (n_c + m) (n_c: the class's mass). At client level a run
with ρ < ½ is refused: its validation AUROC keeps less than half of its distance from chance. At
instance level n_c are counts of private records, so no rule reads them: the run is not refused and
summary.json states the public (1 + √2)·m records per class that ρ ≥ ½ needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedxrisk.stats.histogram import logit_edges

VALIDATION_STREAM = 0x56414C  # the noise source's sub-stream key of validation releases
SITE_MASS = 256  # client level: each site's per-class histogram is scaled to this mass
LIMIT = 8.0  # the released bins split [−LIMIT, LIMIT] logits; the end bins are open
DEFAULT_BINS = 16  # benchmarks/privacy/privacy_validation.py
DEFAULT_NOISE = 10.0  # z: ≈ 10 % of ε in the plans of benchmarks/privacy/privacy_validation.py
LEVELS = ("client", "instance")


@dataclass(frozen=True)
class ValidationDP:
    """The validation release's settings: noise multiplier z (noise std / Δ), the unit's ``level``,
    the released ``bins`` and the number of ``labels``."""

    noise_multiplier: float = DEFAULT_NOISE
    level: str = "client"
    bins: int = DEFAULT_BINS
    labels: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.noise_multiplier < math.inf:
            raise ValueError(
                f"validation noise multiplier must be a finite number > 0, got {self.noise_multiplier}"
            )
        if self.level not in LEVELS:
            raise ValueError(f"validation DP level must be one of {LEVELS}, got {self.level!r}")
        if not 3 <= self.bins <= 4096:
            raise ValueError(f"privacy.validation_bins must lie in [3, 4096], got {self.bins}")

    @property
    def sensitivity(self) -> float:
        """Δ: L2 norm of one unit's contribution to the summed histograms (module docstring)."""
        return math.sqrt(self.labels) * (math.sqrt(2) * SITE_MASS if self.level == "client" else 1.0)

    @property
    def std(self) -> float:
        """The noise std on every released count: zΔ."""
        return self.noise_multiplier * self.sensitivity

    def noise_mass(self) -> float:
        """Expected mass the clipped noise adds to one class's histogram: bins·zΔ/√(2π)."""
        return self.bins * self.std / math.sqrt(2 * math.pi)

    def signal(self, class_mass: tuple[float, float]) -> float:
        """ρ: the expected share of the AUROC's distance from ½ the release keeps (module docstring);
        ``class_mass``: the (negative, positive) mass of the summed histogram (client level: S per
        site holding validation data)."""
        m = self.noise_mass()
        return math.prod(n / (n + m) for n in class_mass)

    def summary(self, releases: int) -> dict[str, Any]:
        """summary.json ``privacy.validation``."""
        return {
            "noise_multiplier": self.noise_multiplier, "bins": self.bins, "level": self.level,
            "sensitivity": self.sensitivity, "noise_std": self.std, "expected_noise_mass": self.noise_mass(),
            "planned_releases": releases, "site_mass": SITE_MASS if self.level == "client" else None,
            **({"records_needed_per_class": records_needed(self)} if self.level == "instance" else {}),
        }  # fmt: skip


def site_mass(counts: np.ndarray, mass: int = SITE_MASS) -> np.ndarray:
    """One site's ``[L, 2, B + 1]`` histograms with each (label, class) row scaled to ``mass``
    (largest remainder; NaN column dropped; an empty row stays empty)."""
    counts = np.asarray(counts, dtype=np.int64)
    out = np.zeros_like(counts)
    for index in np.ndindex(*counts.shape[:-1]):
        row = counts[index][:-1]
        total = int(row.sum())
        if total == 0:
            continue
        exact = row * mass / total
        whole = np.floor(exact).astype(np.int64)
        extra = mass - int(whole.sum())
        order = np.argsort(-(exact - whole), kind="stable")  # ties: the lower bin first
        whole[order[:extra]] += 1
        out[index][:-1] = whole
    return out


def coarse_index(fine_bins: int, bins: int, limit: float = LIMIT) -> np.ndarray:
    """For each of the ``fine_bins`` bins of :func:`~fedxrisk.stats.score_histogram` (default
    layout over ±16), the released bin holding its centre (the open end bins map to the ends)."""
    edges = logit_edges(fine_bins)
    centres = np.r_[-np.inf, (edges[:-1] + edges[1:]) / 2, np.inf]
    return np.searchsorted(logit_edges(bins, limit), centres, side="right")


def coarsen(counts: np.ndarray, bins: int) -> np.ndarray:
    """``[..., B + 1]`` fine histograms → ``[..., bins + 1]`` float64 (NaN column zero: not released)."""
    counts = np.asarray(counts)
    index = coarse_index(counts.shape[-1] - 1, bins)
    out = np.zeros((*counts.shape[:-1], bins + 1))
    for j in range(bins):
        out[..., j] = counts[..., :-1][..., index == j].sum(-1)
    return out


def share(
    dp: ValidationDP, source: Any, round_: int, site: int, sites: int, shape: tuple[int, ...]
) -> np.ndarray:
    """Site ``site``'s share N(0, (zΔ)²/K) of the noise of evaluation ``round_`` (K = ``sites``; NaN
    column zero), float64, from the sub-stream (VALIDATION_STREAM, round, site) of ``source``: what a
    Flower site adds before SecAgg+'s sum (distributed noise, issue 40)."""
    draws = source.spawn(VALIDATION_STREAM, round_, site).standard_normal(math.prod(shape)).reshape(shape)
    z = draws * (dp.std / math.sqrt(sites))
    z[..., -1] = 0.0
    return z


def noise(dp: ValidationDP, source: Any, round_: int, shape: tuple[int, ...], sites: int = 1) -> np.ndarray:
    """N(0, (zΔ)²) for the release of evaluation ``round_``: the sum of the ``sites`` shares
    (:func:`share`), so in the test mode every engine draws what Flower's sites add (NaN column zero)."""
    return np.sum([share(dp, source, round_, k, sites, shape) for k in range(sites)], axis=0)


def finish(noisy: np.ndarray) -> np.ndarray:
    """The released counts: the noised sum clipped at 0 and rounded (post-processing), int64."""
    return np.rint(np.clip(noisy, 0.0, None)).astype(np.int64)


def release(counts: np.ndarray, dp: ValidationDP, source: Any, round_: int, sites: int = 1) -> np.ndarray:
    """The released ``[L, 2, bins + 1]`` histograms of summed fine ``counts`` at evaluation ``round_``."""
    coarse = coarsen(counts, dp.bins)
    return finish(coarse + noise(dp, source, round_, coarse.shape, sites))


@dataclass
class ValidationRelease:
    """What a server needs to release validation: the settings, the run's noise source (never
    written) and the number of sites whose shares make up the noise (:func:`noise`)."""

    dp: ValidationDP
    source: Any
    sites: int = 1

    def __reduce__(self) -> Any:  # its source is never saved
        raise TypeError("a ValidationRelease holds the run's noise source: it is never saved")


def run_source(sim: Any) -> Any:
    """The simulation's noise source: client level the private collective's, instance level the
    Poisson sampler's (distributed, client level: rank 0's on every rank)."""
    if getattr(sim, "privacy", None) is not None:
        return sim.privacy.source
    return sim.sampler.source


def class_mass(dp: ValidationDP, y_val: np.ndarray, shards: list[np.ndarray]) -> list[tuple[float, float]]:
    """Per label, the (negative, positive) mass of the summed validation histograms: the counts at
    instance level; at client level :data:`SITE_MASS` a class per site holding validation data (public)."""
    y = np.asarray(y_val).reshape(len(y_val), -1)
    out = []
    for j in range(y.shape[1]):
        per_site = [(int((y[s, j] == 0).sum()), int((y[s, j] == 1).sum())) for s in shards]
        if dp.level == "client":  # public: S a class per site holding validation data (issue 40)
            per_site = [(SITE_MASS * (n + p > 0),) * 2 for n, p in per_site]
        out.append((float(sum(n for n, _ in per_site)), float(sum(p for _, p in per_site))))
    return out


def sites_needed(dp: ValidationDP) -> int:
    """Client level: the sites holding validation data that keep ρ ≥ ½, ⌈(1 + √2)·m / S⌉ (public)."""
    return math.ceil((1.0 + math.sqrt(2.0)) * dp.noise_mass() / SITE_MASS)


def records_needed(dp: ValidationDP) -> float:
    """Instance level: the validation records each class needs for ρ ≥ ½ when both classes hold as
    many, (1 + √2)·m: a public number (z, bins), stated instead of read off private counts."""
    return (1.0 + math.sqrt(2.0)) * dp.noise_mass()


def noise_refusal(dp: ValidationDP, y_val: np.ndarray, shards: list[np.ndarray]) -> str | None:
    """Why the release would be noise (ρ < ½ for some label, module docstring), or None."""
    return mass_refusal(dp, class_mass(dp, y_val, shards))


def mass_refusal(dp: ValidationDP, masses: list[tuple[float, float]]) -> str | None:
    """:func:`noise_refusal` from the per-label (negative, positive) masses of the summed histograms.

    Client level only: at instance level the class counts are the private data themselves, so
    whether a run is refused (and its message) would disclose them (issue 40); such a run is never
    refused here, and summary.json states :func:`records_needed` instead."""
    if dp.level == "instance":
        return None
    rho = min(dp.signal(m) for m in masses)
    if rho >= 0.5:
        return None
    sites = min(min(m) for m in masses) / SITE_MASS  # public: the sites holding validation data
    return (
        f"the validation release would be noise: z = {dp.noise_multiplier:g} adds an expected mass "
        f"{dp.noise_mass():.4g} per class over {dp.bins} bins against the site mass S = {SITE_MASS} of each of "
        f"the {sites:g} sites holding validation data, keeping ρ = {rho:.2f} < 0.5 of the AUROC's distance "
        f"from 0.5 (ρ ≥ ½ needs {sites_needed(dp)} sites); use more validation data "
        "(client level: more sites), fewer privacy.validation_bins, a smaller privacy.validation_noise_multiplier "
        "(more ε), or selection = 'last' without early stopping"
    )


NOISE_DRAWS = 64  # re-noised copies of a release that estimate its AUROC's noise SD
INVERSION_SDS = 2.0  # |AUROC − ½| below this many noise SDs: the release cannot tell a model from its inverse


def auroc_noise_sd(released: np.ndarray, dp: ValidationDP, draws: int = NOISE_DRAWS) -> float:
    """SD of the released (label-mean) validation AUROC due to the noise: the released ``[L, 2, bins + 1]``
    counts re-noised with N(0, (zΔ)²), clipped and rounded as the release is, ``draws`` times
    (a parametric bootstrap: post-processing of the release, so a seeded generator is fine)."""
    from fedxrisk.stats.histogram import histogram_auroc

    rng = np.random.default_rng(0)
    values = []
    for _ in range(draws):
        again = finish(
            released
            + rng.normal(0.0, dp.std, released.shape)
            * (np.arange(released.shape[-1]) < released.shape[-1] - 1)
        )
        aurocs = [histogram_auroc(c) for c in again]
        values.append(np.nanmean(aurocs) if not np.isnan(aurocs).all() else np.nan)
    return float(np.nanstd(values)) if not np.isnan(values).all() else math.nan


def inversion_warning(auroc: float, sd: float) -> str | None:
    """The utility guard (issue 40): a released validation AUROC within :data:`INVERSION_SDS` noise SDs
    of ½ cannot tell the model from its inverse (AUROC 1 − a, released on the other side of ½ with
    probability above Φ(−2) ≈ 2.3 %), so choosing on it is choosing on noise; the warning, or None."""
    if math.isnan(auroc) or math.isnan(sd) or abs(auroc - 0.5) >= INVERSION_SDS * sd:
        return None
    return (
        f"privacy: the released validation AUROC {auroc:.3f} lies within {INVERSION_SDS:g} noise SDs "
        f"(SD {sd:.3f}) of 0.5: it cannot tell this model from its inverse, so selection = 'best' / early "
        "stopping choose on noise; more validation data (client level: more sites), fewer "
        "privacy.validation_bins or a smaller privacy.validation_noise_multiplier (column val_auroc_noise_sd)"
    )


def release_rounds(rounds: int, eval_every: int, initial: bool) -> tuple[int, ...]:
    """The evaluations that release validation: every ``eval_every`` rounds and the last (1-based, as
    history.csv's ``round``), and 0 when the starting weights are evaluated."""
    return (0,) * initial + tuple(r for r in range(1, rounds + 1) if r % eval_every == 0 or r == rounds)

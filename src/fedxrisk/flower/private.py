"""Client-level DP on Flower: the server (coordinator) clips every site's update and adds the noise.

The run config's ``privacy`` (the ``[privacy]`` table of ``fedxrisk run`` as JSON, e.g.
``privacy='{"clip": 1.0, "target_epsilon": 3.0}'``; level ``client`` only): noise and site sampling come from the server's
:meth:`~fedxrisk.engines.privacy.NoiseSource.secret`, never written (``reproducible_noise = SEED``:
the test mode of the simulation, the run then NOT PRIVATE); ``sampling_rate``
q and ``sampling`` (``poisson`` or ``fixed``): the server draws
each round's participants with :meth:`~fedxrisk.engines.privacy.ClientSampling.mask` from that
source and tells each site whether it takes part; a site sitting the round out keeps its
state as the simulation's idle clients do and sends zeros of its payload's shape (excluded from
the sum). The server is the :class:`~fedxrisk.engines.privacy.PrivateAggregator` of the
simulation engines, so a Flower run with the same test-mode seed gives the loop engine's numbers.

What it protects: a site's whole contribution, against the other sites and anyone who sees the
model; not against the server, which sees each site's update, unless ``secure-aggregation`` is
on: then each site clips its own update (:class:`~fedxrisk.flower.secure.SiteClip`), SecAgg+
sums them, and the server adds the noise to the sum (:meth:`ServerDP.release`).

A run choosing on validation (``selection = "best"``, early stopping) releases the summed validation
histograms through the Gaussian mechanism (:mod:`fedxrisk.engines.privacy.validation`): each site
scales its per-class histogram to a fixed mass (:func:`site_counts`), coarsens it to the released bins
and adds its share N(0, (zΔ)²/K) of the noise from a secret of its own (:func:`validation_share`,
distributed noise), SecAgg+ sums the K shares: the server holds the sum plus N(0, (zΔ)²) and never
an exact histogram sum (issue 40). ε composes the releases as on every engine.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedxrisk.algorithms.base import ClientInfo
from fedxrisk.engines.privacy import ClientDP, PrivateAggregator
from fedxrisk.engines.privacy.accountant import Segment, relation
from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.engines.privacy.validation import (
    SITE_MASS,
    ValidationDP,
    ValidationRelease,
    coarsen,
    share,
    site_mass,
)
from fedxrisk.engines.validation import score_histograms
from fedxrisk.errors import ConfigError
from fedxrisk.run.privacy import PrivacyPlan
from fedxrisk.tree import Tree, leaves, tmap


def check_flower_privacy(cfg: Any) -> None:
    """One-line :class:`ConfigError` for a ``[privacy]`` table a Flower run cannot honour (the run
    layer's :func:`~fedxrisk.run.privacy_rules.check_privacy` has checked the rest)."""
    p = cfg.privacy
    if p is None:
        return
    if p["level"] != "client":
        raise ConfigError(
            f"privacy.level = {p['level']!r}: a Flower deployment adds client-level noise on the server; "
            "use level = 'client' (instance-level DP-SGD runs in simulation)"
        )
    run = cfg.run
    if (run.selection == "best" or run.early_stopping) and not cfg.deploy.secure_aggregation:
        raise ConfigError(
            "selection = 'best' / early-stopping under privacy on Flower choose on the sites' validation "
            "histograms, which then travel only inside SecAgg+'s sum: set secure-aggregation = true"
        )


class ServerDP:
    """The server's private mean for one Flower run (one ``mean`` per round, every site), around the
    run's one privacy plan (:class:`~fedxrisk.run.privacy.PrivacyPlan`, from the assembly: σ, δ,
    the ledger and ε, exactly as ``fedxrisk run`` plans them); it adds who clips and adds the noise."""

    def __init__(self, cfg: Any, plan: PrivacyPlan, config: ClientDP, algorithm: Any, initial: Tree):
        """``config``: the assembly's client-level DP; ``initial``: one site's initial state."""
        self.plan, self.config, self.sampling = plan, config, config.sampling
        self.k, self.rounds, self.delta = plan.num_clients, len(plan.steps_per_round), plan.delta
        self.target_epsilon, self.releases = plan.target_epsilon, plan.releases
        self.aggregator = PrivateAggregator(config, algorithm, initial, 0, self.k)
        self.rounds_meaned: set[int] = set()
        self.clipped_by = "sites" if cfg.deploy.secure_aggregation else "server"
        self.validation = None  # the validation release's settings (its noise: the sites' shares)
        if plan.validation is not None:
            self.validation = ValidationRelease(plan.validation, self.aggregator.source, self.k)
            self.z = plan.validation.noise_multiplier

    def _once(self, round_: int) -> None:
        if round_ in self.rounds_meaned:
            raise ConfigError(
                f"client-level DP: {self.aggregator.name} sends a second 'mean' in round {round_ + 1}"
            )
        self.rounds_meaned.add(round_)

    def mean(self, stacked: Tree, round_: int) -> Tree:
        """The noised mean of the sites' stacked contributions (leading axis: sites); the sites not
        drawn this round are left out of the sum."""
        self._once(round_)
        mask = self.participants(round_)
        flat = self.aggregator.aggregate(stacked, mask, round_, self._denominator(mask))
        return _rebuild(stacked, flat)

    def release(self, mean: Tree, round_: int) -> Tree:
        """Under SecAgg+: ``mean`` is the secure mean over all K sites of their clipped updates
        (:class:`~fedxrisk.flower.secure.SiteClip`; a site not drawn this round sends zeros); add the
        noise and the reference, as :meth:`mean`."""
        self._once(round_)
        sums = {p: t.double() * self.k for p, t in leaves(mean)}
        like = tmap(lambda t: t.unsqueeze(0), mean)
        denominator = self._denominator(self.participants(round_))
        return _rebuild(mean, self.aggregator.release(sums, like, round_, denominator))

    def _denominator(self, mask: torch.Tensor) -> float:
        return self.config.sampling.denominator(self.k, int(mask.sum()))

    def participants(self, round_: int) -> torch.Tensor:
        """Bool ``[K]``: the sites taking part in round ``round_`` (0-based), as the simulation draws them."""
        mask = self.aggregator.sampled(round_, list(range(self.k)))
        return torch.ones(self.k, dtype=torch.bool) if mask is None else mask

    def epsilon(self, rounds: int) -> float:
        return self.plan.epsilon(rounds)

    def ledger(self, rounds: int) -> list[Segment]:
        return self.plan.ledger(rounds)

    @property
    def private(self) -> bool:
        """False in the reproducible test mode (its files are marked NOT PRIVATE)."""
        return bool(self.aggregator.private)

    @property
    def differs(self) -> bool:
        """Whether replacing one site's data costs more than the relation ε is stated under."""
        return self.plan.differs

    def replace_epsilon(self, rounds: int) -> float | None:
        """ε for replacing one site's data, where it differs from :meth:`epsilon` (None: fixed sampling)."""
        return self.plan.replace_epsilon(rounds) if self.differs else None

    def describe(self) -> str:
        s = self.config.sampling
        sampling = f", {s.kind} sampling q = {s.rate:.4g}" if not s.everyone else ""
        replace = self.replace_epsilon(self.rounds)
        return (
            f"differential privacy: ({self.epsilon(self.rounds):.3g}, {self.delta:.3g})-DP per site, "
            f"{relation(s.kind, s.rate)} site, after "
            f"{self.rounds} rounds (C = {self.config.clip:g}, σ = {self.config.noise_multiplier:.4g}{sampling}), "
            f"clipped by the {self.clipped_by}, noise added by the server"
            + ("" if replace is None else f"; replacing one site's data: ε = {replace:.3g}")
            + (f"; {len(self.releases)} validation releases (z = {self.z:g})" if self.releases else "")
            + (
                ""
                if self.aggregator.private
                else " — NOT PRIVATE: reproducible test noise (privacy.reproducible_noise)"
            )
        )

    def summary(self, rounds: int) -> dict[str, Any]:
        """summary.json ``privacy``: ``fedxrisk run``'s block (the plan's), and who clips and who adds
        the noise."""
        return {**self.plan.summary(rounds), "noise_added_by": "server", "clipped_by": self.clipped_by}


def _rebuild(tree: Tree, flat: dict[str, torch.Tensor], prefix: str = "") -> Tree:
    if isinstance(tree, dict):
        return {k: _rebuild(v, flat, f"{prefix}{k}.") for k, v in tree.items()}
    return flat[prefix[:-1]]


def chooses_on_validation(cfg: Any) -> bool:
    """Whether a DP run chooses its model on validation: its validation is then a noised release."""
    return cfg.privacy is not None and (cfg.run.selection == "best" or cfg.run.early_stopping > 0)


def site_counts(cfg: Any, y: Any, scores: Any) -> Any:
    """A site's validation histogram: scaled to the fixed mass when the run releases it under DP."""
    counts = score_histograms(y, scores, 1)
    return site_mass(counts) if chooses_on_validation(cfg) else counts


def validation_share(cfg: Any, counts: Any, num_sites: int, round_: int, site: int) -> Any:
    """A site's share of the validation release (a DP run choosing on validation; else None): its
    ``[L, 2, B + 1]`` :func:`site_counts` coarsened to ``privacy.validation_bins`` plus its share
    N(0, (zΔ)²/K) of the noise (:func:`~fedxrisk.engines.privacy.validation.share`), so the K shares
    sum to the Gaussian mechanism's output (float64, NaN column 0). ``round_``: history.csv's round
    of the evaluation. The noise comes from a fresh :meth:`NoiseSource.secret` of this site, never
    sent; in the test mode (``privacy.reproducible_noise``) from that seed, as every engine draws it."""
    if not chooses_on_validation(cfg):
        return None
    dp = share_dp(cfg, len(counts))
    coarse = coarsen(counts, dp.bins)
    seed = cfg.privacy.get("reproducible_noise")
    source = NoiseSource.secret() if seed is None else NoiseSource.reproducible(int(seed))
    return coarse + share(dp, source, round_, site, num_sites, coarse.shape)


def share_dp(cfg: Any, labels: int) -> ValidationDP:
    """The validation release's settings as a site knows them (client level: Flower's only level)."""
    p = cfg.privacy
    return ValidationDP(p["validation_noise_multiplier"], "client", p["validation_bins"], labels)


def share_cap(cfg: Any, size: int, num_sites: int) -> float:
    """The bound on |a validation share's count| its secure encoding covers: the site mass S plus 12
    noise SDs (a larger draw, probability < 10⁻³², is clipped there); ``size``: the share's length."""
    dp = share_dp(cfg, size // (2 * (cfg.privacy["validation_bins"] + 1)))
    return SITE_MASS + 12 * dp.std / math.sqrt(max(num_sites, 1))


def server_dp(cfg: Any, parts: Any, sites: list[Any], log: Any) -> ServerDP | None:
    """The run's :class:`ServerDP` around the assembly's plan (None without ``privacy``); logs the
    guarantee. ``parts``: the server's :class:`~fedxrisk.run.assemble.Assembly`."""
    if parts.privacy is None:
        return None
    first, widest = sites[0], max(s.samples for s in sites)
    initial = parts.algorithm.init(ClientInfo(0, first.samples, first.positives / first.samples, widest))
    dp = ServerDP(cfg, parts.privacy, parts.client_dp, parts.algorithm, initial)
    log(dp.describe())
    return dp

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
scales its per-class histogram to a fixed mass (:func:`site_counts`), SecAgg+ sums them, the server
adds the noise from the same source (:attr:`ServerDP.validation`) and ε composes the releases.
"""

from __future__ import annotations

from typing import Any

import torch

from fedxrisk.algorithms.base import ClientInfo
from fedxrisk.engines.privacy import (
    ClientDP,
    ClientSampling,
    PrivateAggregator,
    check_client_dp,
    noise_for_epsilon,
)
from fedxrisk.engines.privacy.accountant import REPLACE, Segment, ledger_epsilon, relation, replace_epsilon
from fedxrisk.engines.privacy.validation import (
    SITE_MASS,
    ValidationDP,
    ValidationRelease,
    release_rounds,
    site_mass,
)
from fedxrisk.engines.validation import score_histograms
from fedxrisk.errors import ConfigError
from fedxrisk.run.privacy import default_delta
from fedxrisk.run.privacy_outputs import privacy_block
from fedxrisk.tree import Tree, leaves, tmap


def check_flower_privacy(cfg: Any) -> None:
    """One-line :class:`ConfigError` for a ``[privacy]`` table a Flower run cannot honour (the run
    layer's :func:`~fedxrisk.run.privacy.check_privacy` has checked the rest)."""
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
    """The server's private mean for one Flower run (one ``mean`` per round, every site)."""

    def __init__(
        self, cfg: Any, problem: Any, samples: list[int], positives: list[int], max_samples: int, val_sites: int = 0
    ):  # fmt: skip
        algorithm = cfg.build_algorithm(problem)
        check_client_dp(algorithm)
        p = cfg.privacy
        self.k, self.rounds = len(samples), cfg.run.rounds
        self.delta = p["delta"] if p["delta"] is not None else default_delta(sum(samples))
        sampling = ClientSampling(p["sampling_rate"], p["sampling"])
        self.sampling, self.validation, self.releases = sampling, None, ()
        if chooses_on_validation(cfg) and val_sites:
            self.releases = release_rounds(self.rounds, cfg.run.eval_every, False)
            dp = ValidationDP(p["validation_noise_multiplier"], "client", p["validation_bins"])
            if dp.signal((SITE_MASS * val_sites,) * 2) < 0.5:  # the sites' class counts are not sent
                raise ConfigError(
                    f"privacy: the validation release would be noise with {val_sites} sites holding validation "
                    f"data (z = {dp.noise_multiplier:g}, {dp.bins} bins; docs/privacy.md); use more sites, fewer "
                    "validation-bins or a smaller validation-noise-multiplier (more ε), or selection = 'last'"
                )
            self.z = dp.noise_multiplier
        sigma = p["noise_multiplier"] or noise_for_epsilon(
            p["target_epsilon"], self.rounds, self.delta, sampling.rate, sampling.kind, self.k,
            extra=self._validation(self.rounds),
        )  # fmt: skip
        seed = p["reproducible_noise"]  # None: a secret source (NoiseSource.secret), never written
        self.config = ClientDP(p["clip"], sigma, sampling, noise_seed=seed)
        self.target_epsilon = p["target_epsilon"]
        initial = algorithm.init(ClientInfo(0, samples[0], positives[0] / samples[0], max_samples))
        self.aggregator = PrivateAggregator(self.config, algorithm, initial, 0, self.k)
        self.rounds_meaned: set[int] = set()
        self.clipped_by = "sites" if cfg.deploy.secure_aggregation else "server"
        if self.releases:  # the server adds the validation noise from the run's source
            self.validation = ValidationRelease(dp, self.aggregator.source)

    def _validation(self, rounds: int) -> list[Segment]:
        """The validation releases of the first ``rounds`` rounds as a ledger segment (none: [])."""
        count = sum(r <= rounds for r in self.releases)
        kind = "poisson" if self.differs else "fixed"  # a replace-one ledger halves z
        return [Segment(0, rounds, 1.0, self.z, count, kind, release="validation")] if count else []

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
        return ledger_epsilon(self._ledger(rounds), self.delta)

    def _ledger(self, rounds: int) -> list[Segment]:
        s = self.config.sampling
        own = Segment(0, rounds, s.rate, self.config.noise_multiplier, rounds, s.kind, self.k)
        return [own, *self._validation(rounds)]

    @property
    def private(self) -> bool:
        """False in the reproducible test mode (its files are marked NOT PRIVATE)."""
        return bool(self.aggregator.private)

    @property
    def differs(self) -> bool:
        """Whether replacing one site's data costs more than the relation ε is stated under."""
        return relation(self.sampling.kind, self.sampling.rate) != REPLACE

    def replace_epsilon(self, rounds: int) -> float | None:
        """ε for replacing one site's data, where it differs from :meth:`epsilon` (None: fixed sampling)."""
        return replace_epsilon(self._ledger(rounds), self.delta) if self.differs else None

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
        """summary.json ``privacy``: ``fedxrisk run``'s block (run/privacy.privacy_block), and who
        clips and who adds the noise."""
        s = self.config.sampling
        block = privacy_block(
            "client", self.epsilon(rounds), self.delta, f"{relation(s.kind, s.rate)} client",
            self.replace_epsilon(rounds), self.config.clip, self.config.noise_multiplier,
            self.target_epsilon, s.rate, s.kind, self._ledger(rounds), self.aggregator.private,
            self.validation.dp.summary(len(self.releases)) if self.validation else None,
        )  # fmt: skip
        return {**block, "noise_added_by": "server", "clipped_by": self.clipped_by}


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


def server_dp(
    cfg: Any, problem: Any, sites: list[Any], max_samples: int, log: Any, val_sites: int = 0
) -> ServerDP | None:
    """The run's :class:`ServerDP` (None without ``privacy``); logs the guarantee. ``val_sites``: the
    sites holding validation data (under DP each says only whether it does)."""
    if cfg.privacy is None:
        return None
    samples, positives = [s.samples for s in sites], [s.positives for s in sites]
    dp = ServerDP(cfg, problem, samples, positives, max_samples, val_sites)
    log(dp.describe())
    return dp

"""Client-level DP on Flower: the server (coordinator) clips every site's update and adds the noise.

Run-config keys (flat, as Flower wants them): ``privacy-clip`` (C; 0: DP off),
``privacy-noise-multiplier`` (σ) or ``privacy-target-epsilon`` (ε for the planned rounds),
``privacy-delta`` (0: min(1e-5, 1/(10·N)), N the sites' training samples), ``privacy-noise-seed``
(-1, the default: the server's :meth:`~fedxrisk.engines.privacy.NoiseSource.secret`, never
written; ≥ 0: the reproducible test mode, as the simulation's ``privacy.reproducible_noise`` —
the run is then not private),
``privacy-sampling-rate`` q and ``privacy-sampling`` (``poisson`` or ``fixed``): the server draws
each round's participants with :meth:`~fedxrisk.engines.privacy.ClientSampling.mask` from the
noise source and tells each site whether it takes part; a site sitting the round out keeps its
state as the simulation's idle clients do and sends zeros of its payload's shape (excluded from
the sum). The server is the :class:`~fedxrisk.engines.privacy.PrivateAggregator` of the
simulation engines, so a Flower run with the same test-mode seed gives the loop engine's numbers.

What it protects: a site's whole contribution, against the other sites and anyone who sees the
model; not against the server, which sees each site's update, unless ``secure-aggregation`` is
on: then each site clips its own update (:class:`~fedxrisk.flower.secure.SiteClip`), SecAgg+
sums them, and the server adds the noise to the sum (:meth:`ServerDP.release`).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from fedxrisk.algorithms.base import ClientInfo
from fedxrisk.engines.privacy import (
    ClientDP,
    ClientSampling,
    PrivateAggregator,
    check_client_dp,
    epsilon,
    noise_for_epsilon,
)
from fedxrisk.engines.privacy.accountant import REPLACE, Segment, relation, replace_epsilon
from fedxrisk.errors import ConfigError
from fedxrisk.tree import Tree, leaves, tmap


def check_flower_privacy(cfg: Any) -> None:
    """One-line :class:`ConfigError` for privacy settings a Flower run cannot honour."""
    ClientSampling(cfg.privacy_sampling_rate, cfg.privacy_sampling)  # one line on a bad rate or kind
    if cfg.privacy_clip == 0:
        if cfg.privacy_noise_multiplier or cfg.privacy_target_epsilon:
            raise ConfigError("privacy-noise-multiplier / privacy-target-epsilon need privacy-clip > 0")
        if cfg.privacy_sampling_rate < 1:
            raise ConfigError(
                "privacy-sampling-rate < 1 samples sites for client-level DP: set privacy-clip > 0 too"
            )
        return
    if cfg.privacy_clip < 0:
        raise ConfigError(f"privacy-clip must be > 0 (0: no DP), got {cfg.privacy_clip}")
    if (cfg.privacy_noise_multiplier > 0) == (cfg.privacy_target_epsilon > 0):
        raise ConfigError(
            "privacy: set exactly one of privacy-noise-multiplier and privacy-target-epsilon (> 0)"
        )
    if not 0 <= cfg.privacy_delta < 1:
        raise ConfigError(f"privacy-delta must lie in [0, 1) (0: 1/N), got {cfg.privacy_delta}")
    cls = cfg.algorithm_class
    stub = types.SimpleNamespace(
        name=cfg.algorithm, begin_batch=cls.begin_batch, problem=None,
        stage_batch_size=cfg.options.get("stage_batch_size", getattr(cls, "stage_batch_size", 0)),
        round_batch_size=cfg.options.get("round_batch_size", getattr(cls, "round_batch_size", 0)),
    )  # fmt: skip
    try:
        check_client_dp(stub)
    except ConfigError as e:
        raise ConfigError(f"privacy-clip: {e}") from None


class ServerDP:
    """The server's private mean for one Flower run (one ``mean`` per round, every site)."""

    def __init__(self, cfg: Any, problem: Any, samples: list[int], positives: list[int], max_samples: int):
        algorithm = cfg.build_algorithm(problem)
        check_client_dp(algorithm)
        self.k, self.rounds = len(samples), cfg.rounds
        self.delta = cfg.privacy_delta or min(1e-5, 1.0 / (10 * sum(samples)))  # run.privacy.default_delta
        sampling = ClientSampling(cfg.privacy_sampling_rate, cfg.privacy_sampling)
        sigma = cfg.privacy_noise_multiplier or noise_for_epsilon(
            cfg.privacy_target_epsilon, cfg.rounds, self.delta, sampling.rate, sampling.kind, self.k
        )
        seed = cfg.privacy_noise_seed if cfg.privacy_noise_seed >= 0 else None  # None: a secret source
        self.config = ClientDP(cfg.privacy_clip, sigma, sampling, noise_seed=seed)
        initial = algorithm.init(ClientInfo(0, samples[0], positives[0] / samples[0], max_samples))
        self.aggregator = PrivateAggregator(self.config, algorithm, initial, 0, self.k)
        self.rounds_meaned: set[int] = set()
        self.clipped_by = "sites" if cfg.secure_aggregation else "server"

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
        s = self.config.sampling
        return epsilon(self.config.noise_multiplier, rounds, self.delta, s.rate, s.kind, self.k)

    def _ledger(self, rounds: int) -> list[Segment]:
        s = self.config.sampling
        return [Segment(0, rounds, s.rate, self.config.noise_multiplier, rounds, s.kind, self.k)]

    def replace_epsilon(self, rounds: int) -> float | None:
        """ε for replacing one site's data, where it differs from :meth:`epsilon` (None: fixed sampling)."""
        s = self.config.sampling
        if relation(s.kind, s.rate) == REPLACE:
            return None
        return replace_epsilon(self._ledger(rounds), self.delta)

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
            + (
                ""
                if self.aggregator.private
                else " — NOT PRIVATE: reproducible test noise (privacy-noise-seed)"
            )
        )

    def summary(self, rounds: int) -> dict[str, Any]:
        s = self.config.sampling
        return {
            "level": "client", "epsilon": self.epsilon(rounds), "delta": self.delta, "clip": self.config.clip,
            "noise_multiplier": self.config.noise_multiplier, "sampling_rate": self.config.sampling.rate,
            "sampling": self.config.sampling.kind, "accountant": "RDP (dp-accounting)", "noise_added_by": "server",
            "clipped_by": self.clipped_by, "relation": f"{relation(s.kind, s.rate)} client",
            **({} if (r := self.replace_epsilon(rounds)) is None else {"epsilon_replace_one": r}),
            "private": self.aggregator.private,
        }  # fmt: skip


def _rebuild(tree: Tree, flat: dict[str, torch.Tensor], prefix: str = "") -> Tree:
    if isinstance(tree, dict):
        return {k: _rebuild(v, flat, f"{prefix}{k}.") for k, v in tree.items()}
    return flat[prefix[:-1]]


def server_dp(cfg: Any, problem: Any, sites: list[Any], max_samples: int, log: Any) -> ServerDP | None:
    """The run's :class:`ServerDP` (None without ``privacy-clip``); logs the guarantee."""
    if not cfg.privacy_clip:
        return None
    dp = ServerDP(cfg, problem, [s.samples for s in sites], [s.positives for s in sites], max_samples)
    log(dp.describe())
    return dp

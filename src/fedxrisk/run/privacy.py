"""The ``[privacy]`` section of a run: differential privacy settings, their checks, and the plan.

Keys (all optional but ``clip`` and one of ``noise_multiplier`` / ``target_epsilon``)::

    [privacy]
    level = "client"          # "client" (DP-FedAvg around the round's mean) or "instance" (DP-SGD)
    clip = 1.0                # L2 norm C: of a client's joint round update, or of one sample's gradient
    noise_multiplier = 1.1    # σ: noise std / C ...
    target_epsilon = 3.0      # ... or ε to reach after the planned rounds (σ by bisection)
    delta = "none"            # "none": min(1e-5, 1/(10·N)), N the training samples (see below)
    sampling_rate = 1.0       # client level: the fraction q of clients per round
    sampling = "poisson"      # or "fixed" (round(q·K) clients, without replacement)
    reproducible_noise = "none"  # "none": secret noise (fresh OS entropy, never written);
                                 # an integer: TEST MODE, noise fixed by it — the run is not private
    pos_ratio = "none"        # the AUC losses' public p under DP; "none": data.imratio
    validation_noise_multiplier = 10.0  # z of the validation releases (selection = "best", early stopping)
    validation_bins = 16      # logit bins of the released validation histograms

δ's default is min(1e-5, 1/(10·N)) with N the training samples, at both levels
(:func:`default_delta`): well below 1/N, which admits a mechanism that publishes one record in
full (at instance level the unit is a record); at client level the unit is a client, for which
the rule is δ ≪ 1/K, and 1/(10·N) ≤ 1/(10·K) holds it too, so ε numbers of both levels share δ.

:func:`privacy_from_table` type-checks the table, :mod:`fedxrisk.run.privacy_rules` checks it against the
run (one line per refusal), :func:`plan_privacy` turns it into the engine's
:class:`~fedxrisk.engines.privacy.ClientDP` or an instance-private algorithm, and a
:class:`PrivacyPlan` that reports ε(δ) after any number of rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedxrisk.errors import ConfigError, raise_all
from fedxrisk.run.privacy_outputs import privacy_block, unit_of

if TYPE_CHECKING:
    from fedxrisk.engines.privacy.accountant import Segment

LEVELS = ("client", "instance")
KEYS: dict[str, tuple[type, ...]] = {
    "level": (str,),
    "clip": (float,),
    "noise_multiplier": (float, type(None)),
    "target_epsilon": (float, type(None)),
    "delta": (float, type(None)),
    "sampling_rate": (float,),
    "sampling": (str,),
    "reproducible_noise": (int, type(None)),
    "noise_seed": (int, type(None)),  # replaced by reproducible_noise: only "none" is accepted
    "pos_ratio": (float, type(None)),
    "validation_noise_multiplier": (float,),
    "validation_bins": (int,),
}
DEFAULTS: dict[str, Any] = {
    "level": "client", "noise_multiplier": None, "target_epsilon": None, "delta": None,
    "sampling_rate": 1.0, "sampling": "poisson", "reproducible_noise": None,
}  # fmt: skip
DEFAULTS["pos_ratio"] = None  # the public p of the AUC losses under DP (None: data.imratio)
# the validation release (engines/privacy/validation.py DEFAULT_NOISE, DEFAULT_BINS; docs/privacy.md)
DEFAULTS |= {"validation_noise_multiplier": 10.0, "validation_bins": 16}


def default_delta(train_samples: int) -> float:
    """δ when ``privacy.delta`` is not set: min(1e-5, 1/(10·N)) (see the module docstring)."""
    return min(1e-5, 1.0 / (10 * train_samples))


def _value(key: str, value: Any) -> Any:
    allowed = KEYS[key]
    if type(None) in allowed and (value is None or value == "none"):
        return None
    if float in allowed and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if int in allowed and isinstance(value, int) and not isinstance(value, bool):
        return value
    if str in allowed and isinstance(value, str):
        return value
    names = " or ".join(
        {float: "a number", int: "an integer", str: "a string"}.get(t, '"none"') for t in allowed
    )
    raise ConfigError(f"privacy.{key}: expected {names}, got {value!r} ({type(value).__name__})")


def privacy_from_table(table: Any) -> dict[str, Any]:
    """A ``[privacy]`` table, type-checked, with every key filled (defaults); the first error raised."""
    errors: list[ConfigError] = []
    values = privacy_table(table, errors)
    raise_all(errors[:1])
    return values


def privacy_table(table: Any, errors: list[ConfigError]) -> dict[str, Any]:
    """A ``[privacy]`` table, type-checked, with every key filled (defaults); every error appended (a
    wrong key or value is left out: its default stays), as :mod:`fedxrisk.run.nested`'s readers."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"[privacy] must be a table of keys, got {table!r}")
    allowed = ", ".join(k for k in KEYS if k != "noise_seed")
    errors += [
        ConfigError(f"unknown key privacy.{k}; [privacy] allows: {allowed}")
        for k in sorted(set(table) - set(KEYS))
    ]
    if "clip" not in table:
        errors.append(ConfigError("privacy.clip is missing: the L2 clipping norm C (e.g. clip = 1.0)"))
    values = dict(DEFAULTS)
    for key in (k for k in table if k in KEYS):
        try:
            values[key] = _value(key, table[key])
        except ConfigError as e:
            errors.append(e)
    if values.pop("noise_seed", None) is not None:
        errors.append(
            ConfigError(
                "privacy.noise_seed is gone: noise is secret by default; privacy.reproducible_noise = SEED "
                "is the test mode (the run is then not private)"
            )
        )
    return values


def instance_pos_ratio(cfg: Any) -> float | None:
    """The public p of the AUC losses under DP, at either level (issue 40): ``privacy.pos_ratio``, else
    the ratio the data were resampled to (``data.imratio``, the user's choice); None when neither is
    set or the run has no DP (docs/privacy.md, "The prior p"). Never counted from the records."""
    if cfg.privacy is None:
        return None
    p = privacy_from_table(cfg.privacy)["pos_ratio"]
    return p if p is not None else cfg.imratio


def instance_noise(cfg: Any) -> Any:
    """The engine's noise source at instance level in the test mode (``privacy.reproducible_noise``:
    batches and noise fixed, the run marked not private); None otherwise (the engine draws a secret one)."""
    if cfg.privacy is None:
        return None
    p = privacy_from_table(cfg.privacy)
    if p["level"] != "instance" or p["reproducible_noise"] is None:
        return None
    from fedxrisk.engines.privacy import NoiseSource

    return NoiseSource.reproducible(p["reproducible_noise"])


@dataclass(frozen=True)
class PrivacyPlan:
    """A run's DP guarantee: ε(δ) after any number of completed rounds (:meth:`epsilon`), from the
    ledger of the rounds actually run (:meth:`ledger`): ``earlier`` (the rounds a resumed or
    extended run ran before, read from its checkpoint) then this process's rounds at σ."""

    level: str
    clip: float
    noise_multiplier: float
    delta: float
    q: float  # client level: clients per round / K; instance level: the records' sampling rate
    sampling: str
    num_clients: int
    steps_per_round: tuple[int, ...]  # accountant steps of each planned round (1 or its local steps)
    target_epsilon: float | None = None
    private: bool = True  # False: reproducible test noise (privacy.reproducible_noise)
    earlier: tuple[Segment, ...] = ()
    validation: Any = None  # ValidationDP when the run chooses on validation (engines/privacy/validation.py)
    releases: tuple[int, ...] = ()  # the evaluations (history.csv rounds) that release validation

    @property
    def start(self) -> int:
        """Rounds run before this process (the ledger's earlier segments)."""
        return self.earlier[-1].last if self.earlier else 0

    def ledger(self, rounds: int) -> list[Segment]:
        """The segments of the first ``rounds`` rounds (rounds ≥ :attr:`start`; earlier: the
        earlier segments that ended by then)."""
        from fedxrisk.engines.privacy.accountant import Segment

        if rounds <= self.start:
            return [s for s in self.earlier if s.last <= rounds]
        n = self.num_clients if self.level == "client" else None
        steps = sum(self.steps_per_round[self.start : rounds])
        own = Segment(self.start, rounds, self.q, self.noise_multiplier, steps, self.sampling, n)
        count = sum(self.start < r <= rounds or r == self.start == 0 for r in self.releases)
        if not count:
            return [*self.earlier, own]
        kind = "fixed" if not self.differs else "poisson"  # a replace-one ledger halves z
        z = self.validation.noise_multiplier
        return [*self.earlier, own, Segment(self.start, rounds, 1.0, z, count, kind, release="validation")]

    def epsilon(self, rounds: int) -> float:
        """ε at δ after the first ``rounds`` rounds under :attr:`relation` (RDP, composed ledger)."""
        from fedxrisk.engines.privacy.accountant import ledger_epsilon

        return ledger_epsilon(self.ledger(rounds), self.delta)

    def replace_epsilon(self, rounds: int) -> float:
        """ε for replacing one unit's data (PLD accountant); :meth:`epsilon` under fixed sampling."""
        from fedxrisk.engines.privacy.accountant import replace_epsilon

        return replace_epsilon(self.ledger(rounds), self.delta)

    @property
    def unit(self) -> str:
        return unit_of(self.level)

    @property
    def relation(self) -> str:
        """The neighbouring relation of :meth:`epsilon`, e.g. "add/remove one client"."""
        from fedxrisk.engines.privacy.accountant import relation

        return f"{relation(self.sampling, self.q)} {self.level if self.level == 'client' else 'record'}"

    @property
    def differs(self) -> bool:
        """Whether the replace-one ε is a second number (not under fixed sampling)."""
        return not self.relation.startswith("replace")

    def describe(self) -> str:
        """The guarantee in one line (printed at the start of a run)."""
        rounds = len(self.steps_per_round)
        sampling = f", {self.sampling} sampling q = {self.q:.4g}" if self.q < 1 else ""
        replace = f"; replacing one {self.level if self.level == 'client' else 'record'}'s data: " \
            f"ε = {self.replace_epsilon(rounds):.3g}" if self.differs else ""  # fmt: skip
        v = self.validation
        test = (
            f"; {len(self.releases)} validation releases (z = {v.noise_multiplier:g}, {v.bins} bins)"
            if v
            else ""
        )
        test += "" if self.private else " — NOT PRIVATE: reproducible test noise (privacy.reproducible_noise)"
        return (
            f"differential privacy: ({self.epsilon(rounds):.3g}, {self.delta:.3g})-DP per {self.unit}, "
            f"{self.relation}, after {rounds} rounds (C = {self.clip:g}, σ = {self.noise_multiplier:.4g}"
            f"{sampling}){replace}{test}"
        )

    def summary(self, rounds: int) -> dict[str, Any]:
        return privacy_block(
            self.level, self.epsilon(rounds), self.delta, self.relation,
            self.replace_epsilon(rounds) if self.differs else None,
            self.clip, self.noise_multiplier, self.target_epsilon, self.q, self.sampling,
            self.ledger(rounds), self.private,
            self.validation.summary(len(self.releases)) if self.validation else None,
        )  # fmt: skip


def plan_privacy(
    cfg: Any, algorithm: Any, facts: Any, schedule: Any, batch_size: int, ledger: list[dict] | None = None
) -> tuple[Any, Any, Any]:
    """(algorithm to train — instance level: its DP-SGD copy —, the engine's ClientDP or None,
    the :class:`PrivacyPlan`); (algorithm, None, None) when ``cfg.privacy`` is None. ``facts``:
    the set-up facts (:class:`fedxrisk.run.assemble.Facts`: N, the clients, the smallest
    shard, the validation masses); ``ledger``: the checkpoint's ledger of a resumed or extended
    run (its rounds are never re-accounted)."""
    if cfg.privacy is None:
        return algorithm, None, None
    from fedxrisk.engines.privacy import (
        ClientDP,
        ClientSampling,
        check_client_dp,
        instance_private,
        noise_for_epsilon,
    )
    from fedxrisk.engines.privacy.accountant import Segment

    p = privacy_from_table(cfg.privacy)
    plans = list(schedule.plan())
    delta = p["delta"] if p["delta"] is not None else default_delta(facts.train_samples)
    if p["level"] == "client":
        check_client_dp(algorithm)
        q, sampling, steps = p["sampling_rate"], p["sampling"], tuple(1 for _ in plans)
    else:
        q = min(1.0, batch_size / facts.smallest_shard)
        sampling, steps = "poisson", tuple(plan.window for plan in plans)
    n = facts.num_clients if p["level"] == "client" else None
    earlier = tuple(Segment.from_dict(d) for d in ledger or ())
    validation, releases = validation_plan(cfg, p, facts, len(plans))
    kind = "fixed" if sampling == "fixed" and q < 1.0 else "poisson"

    def planned(first: int) -> tuple[Segment, ...]:  # the validation releases after round `first`
        count = sum(r > first or r == first == 0 for r in releases)
        z = validation.noise_multiplier if validation else 0.0
        return (Segment(first, len(plans), 1.0, z, count, kind, release="validation"),) if count else ()

    sigma = p["noise_multiplier"]
    if sigma is None:
        sigma = noise_for_epsilon(p["target_epsilon"], sum(steps), delta, q, sampling, n, extra=planned(0))
        if earlier and any(s.noise_multiplier != sigma or s.q != q for s in earlier):  # an extension
            start = earlier[-1].last
            sigma = noise_for_epsilon(
                p["target_epsilon"], sum(steps[start:]), delta, q, sampling, n, earlier=earlier,
                extra=planned(start),
            )  # fmt: skip
    private = p["reproducible_noise"] is None
    plan = PrivacyPlan(
        p["level"], p["clip"], sigma, delta, q, sampling, facts.num_clients, steps, p["target_epsilon"], private,
        earlier, validation, releases,
    )  # fmt: skip
    if p["level"] == "instance":
        return instance_private(algorithm, p["clip"], sigma, instance_pos_ratio(cfg)), None, plan
    return algorithm, ClientDP(p["clip"], sigma, ClientSampling(q, sampling), p["reproducible_noise"]), plan


def validation_plan(cfg: Any, p: dict[str, Any], facts: Any, rounds: int) -> tuple[Any, tuple[int, ...]]:
    """(ValidationDP, the evaluations releasing validation) of a run choosing on validation under DP,
    else (None, ()); a release that would be noise is refused in one line (docs/privacy.md)."""
    if not (cfg.selection == "best" or cfg.early_stopping) or facts.validation is None:
        return None, ()
    from fedxrisk.engines.privacy.validation import ValidationDP, mass_refusal, release_rounds

    dp = ValidationDP(p["validation_noise_multiplier"], p["level"], p["validation_bins"], facts.num_labels)
    reason = mass_refusal(dp, facts.validation(dp))
    if reason is not None:
        raise ConfigError(f"privacy: {reason}")
    return dp, release_rounds(rounds, cfg.eval_every, facts.evaluates_start)

"""ε(δ) of a run from Google's ``dp-accounting`` (optional extra ``privacy``), from a ledger.

A run of DP is a sequence of releases of the sampled Gaussian mechanism. The *ledger* is the
list of :class:`Segment` s actually run — rounds [first, last) at one sampling rate q, noise
multiplier σ and number of accountant steps — and ε is the composition of all of them
(dp-accounting ``ComposedDpEvent``): a resumed or extended run appends a segment, it never
re-accounts earlier rounds at a new σ.

Neighbouring relations (what ε protects):

* Poisson sampling (and q = 1): **add/remove one** unit (a client with all its data, or one
  record) — the unit's clipped contribution (norm ≤ C) is in the sum or not; RDP accountant.
  Replacing one unit's data by another's moves the sum by up to 2C; :func:`replace_epsilon`
  gives that ε too (PLD accountant, ``REPLACE_ONE``: it takes the sensitivity C per unit, i.e.
  the σ/2 of a 2C move).
* Fixed-size sampling (m of K without replacement, q < 1): only **replace one** is defined
  (the number of participants is public). The library's bound for it (Wang et al. 2019) is
  for a mechanism whose output moves by 1 = σ·(noise std) when one unit is replaced; here
  replacing a client moves the sum by 2C, so it is accounted with noise multiplier σ/2.

A ``release = "validation"`` segment counts the validation releases of its rounds
(:mod:`~fedxrisk.engines.privacy.validation`): ``steps`` Gaussian mechanisms at noise multiplier
z, no subsampling (σ/2 in a fixed-sampling ledger, whose relation is replace one).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fedxrisk.errors import ConfigError

SAMPLINGS = ("poisson", "fixed")
ADD_REMOVE, REPLACE = "add/remove one", "replace one"


# The accountant's inputs, bounded (issue 40): below SIGMA_MIN one Gaussian release alone is
# beyond ε = 5000 and dp-accounting's PLD grid outgrows memory; a target outside EPSILON_RANGE
# is either no promise (above) or below the bisection's tolerance (0.01).
SIGMA_MIN = 0.01
EPSILON_RANGE = (0.05, 100.0)


def input_refusal(
    noise_multiplier: float | None, target_epsilon: float | None, validation_z: float
) -> str | None:
    """One line naming the accountant input out of its bounds and the way out, or None."""
    for name, value in (
        ("noise_multiplier", noise_multiplier),
        ("validation_noise_multiplier", validation_z),
    ):
        if value is not None and value < SIGMA_MIN:
            return (
                f"privacy.{name} = {value:g} is below {SIGMA_MIN:g}: ε would exceed 5000 per release, "
                f"beyond what the accountant computes; set it ≥ {SIGMA_MIN:g} (or drop [privacy])"
            )
    low, high = EPSILON_RANGE
    if target_epsilon is not None and not low <= target_epsilon <= high:
        return (
            f"privacy.target_epsilon = {target_epsilon:g} lies outside [{low:g}, {high:g}]: above, ε promises "
            f"nothing (drop [privacy]); below, it is under the accountant's precision; set it within the range"
        )
    return None


def _library() -> Any:
    try:
        import dp_accounting
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "differential privacy needs the dp-accounting package: pip install 'fedxrisk[privacy]'"
        ) from e
    return dp_accounting


def fixed_count(q: float, num_clients: int) -> int:
    """Clients per round under fixed-fraction sampling: round(q·K), at least 1."""
    return max(1, min(num_clients, round(q * num_clients)))


def relation(sampling: str, q: float) -> str:
    """The neighbouring relation the main ε of this sampling is stated under."""
    return REPLACE if sampling == "fixed" and q < 1.0 else ADD_REMOVE


@dataclass(frozen=True)
class Segment:
    """Rounds ``first`` … ``last - 1`` (0-based) run at one (q, σ): ``steps`` accountant steps in all
    (client level: one per round; instance level: the local steps)."""

    first: int
    last: int
    q: float
    noise_multiplier: float
    steps: int
    sampling: str = "poisson"
    num_clients: int | None = None
    release: str = "train"  # or "validation": the validation releases of these rounds

    def __post_init__(self) -> None:
        _check(self.noise_multiplier, self.q, self.steps, 0.5, self.sampling, self.num_clients)

    def event(self, replace: bool = False) -> Any:
        """The segment's DpEvent; ``replace``: for the PLD replace-one accountant (Poisson / q = 1)."""
        dpa = _library()
        sigma = self.noise_multiplier
        if self.release == "validation":  # replace one under fixed sampling moves a count twice: σ/2
            halve = self.sampling == "fixed" and not replace
            return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(sigma / 2 if halve else sigma), self.steps)
        if self.sampling == "fixed" and self.q < 1.0:
            m = fixed_count(self.q, self.num_clients)  # type: ignore[arg-type]
            one = dpa.SampledWithoutReplacementDpEvent(self.num_clients, m, dpa.GaussianDpEvent(sigma / 2))
        elif self.q >= 1.0:
            one = dpa.GaussianDpEvent(sigma)
        else:
            one = dpa.PoissonSampledDpEvent(self.q, dpa.GaussianDpEvent(sigma))
        return dpa.SelfComposedDpEvent(one, self.steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        return cls(**d)


def _check(noise_multiplier: float, q: float, steps: int, delta: float, sampling: str, num_clients) -> None:
    if sampling not in SAMPLINGS:
        raise ConfigError(f"privacy sampling must be one of {SAMPLINGS}, got {sampling!r}")
    if not 0.0 < q <= 1.0:
        raise ConfigError(f"privacy sampling rate q must lie in (0, 1], got {q}")
    if noise_multiplier < 0:
        raise ConfigError(f"privacy noise_multiplier must be ≥ 0, got {noise_multiplier}")
    if steps < 0:
        raise ConfigError(f"privacy steps (rounds) must be ≥ 0, got {steps}")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"privacy delta must lie in (0, 1), got {delta}")
    if sampling == "fixed" and q < 1.0 and not num_clients:
        raise ConfigError("privacy sampling 'fixed' needs the number of clients")


def _quiet(compute: Any) -> float:
    absl = logging.getLogger("absl")  # the library warns for every RDP order it skips as unstable
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        return float(compute())
    finally:
        absl.setLevel(level)


def _trivial(ledger: Sequence[Segment]) -> float | None:
    live = [s for s in ledger if s.steps > 0]
    if not live:
        return 0.0
    if any(s.noise_multiplier == 0 for s in live):
        return math.inf
    return None


def ledger_epsilon(ledger: Sequence[Segment], delta: float) -> float:
    """ε at ``delta`` of the composed ledger under its relation (:func:`relation`; RDP accountant)."""
    return _ledger_epsilon(tuple(ledger), float(delta))


@functools.lru_cache(maxsize=4096)
def _ledger_epsilon(ledger: tuple[Segment, ...], delta: float) -> float:
    """:func:`ledger_epsilon`, remembered: a plan's bisection, its check and every history row ask for
    the same ledgers again (segments are frozen, so equal ledgers hash alike)."""
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"privacy delta must lie in (0, 1), got {delta}")
    trivial = _trivial(ledger)
    if trivial is not None:
        return trivial
    dpa = _library()
    relations = {relation(s.sampling, s.q) for s in ledger if s.steps > 0 and s.release == "train"}
    neighbours = dpa.NeighboringRelation.REPLACE_ONE if REPLACE in relations else None
    accountant = dpa.rdp.RdpAccountant(
        neighboring_relation=neighbours or dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    if len(relations) > 1:  # add/remove segments bound replace one too (each at σ/2)
        raise ConfigError(
            "privacy: a ledger mixes fixed-size and Poisson sampling; the accountant cannot compose it"
        )
    event = dpa.ComposedDpEvent([s.event() for s in ledger if s.steps > 0])

    def compute() -> float:
        accountant.compose(event)
        return accountant.get_epsilon(delta)

    return _quiet(compute)


def replace_epsilon(ledger: Sequence[Segment], delta: float) -> float:
    """ε at ``delta`` for *replacing* one unit's data (PLD accountant, ``REPLACE_ONE``); equals
    :func:`ledger_epsilon` for fixed-size sampling, whose relation it already is."""
    trivial = _trivial(ledger)
    if trivial is not None:
        return trivial
    if any(relation(s.sampling, s.q) == REPLACE for s in ledger if s.steps > 0 and s.release == "train"):
        return ledger_epsilon(ledger, delta)
    dpa = _library()
    # the PLD's grid: 1e-3 for small ε, 1e-2 above 10 (10× faster, < 0.1 % off; pessimistic either way)
    interval = 1e-3 if ledger_epsilon(ledger, delta) < 10 else 1e-2
    accountant = dpa.pld.PLDAccountant(
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE, value_discretization_interval=interval
    )
    event = dpa.ComposedDpEvent([s.event(replace=True) for s in ledger if s.steps > 0])

    def compute() -> float:
        accountant.compose(event)
        return accountant.get_epsilon(delta)

    return _quiet(compute)


def epsilon(
    noise_multiplier: float,
    steps: int,
    delta: float,
    q: float = 1.0,
    sampling: str = "poisson",
    num_clients: int | None = None,
) -> float:
    """ε at ``delta`` after ``steps`` rounds at one (q, σ) (a one-segment ledger, RDP accountant).

    ``noise_multiplier`` σ: noise std / clipping norm; ``q``: sampling rate (1: every client
    every round); ``sampling``: ``"poisson"`` or ``"fixed"`` (needs ``num_clients``; replace-one,
    σ/2). ``inf`` without noise."""
    _check(noise_multiplier, q, steps, delta, sampling, num_clients)
    return ledger_epsilon([Segment(0, steps, q, noise_multiplier, steps, sampling, num_clients)], delta)


def noise_for_epsilon(
    target_epsilon: float,
    steps: int,
    delta: float,
    q: float = 1.0,
    sampling: str = "poisson",
    num_clients: int | None = None,
    tolerance: float = 0.01,
    earlier: Sequence[Segment] = (),
    extra: Sequence[Segment] = (),
) -> float:
    """The smallest σ (to ``tolerance`` in ε) whose ε — the ``earlier`` ledger composed with ``steps``
    more at σ and the ``extra`` segments (the planned validation releases) — is ≤ ``target_epsilon``:
    bisection on σ, as Opacus's ``get_noise_multiplier`` does."""
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ConfigError(f"privacy target_epsilon must be a finite number > 0, got {target_epsilon}")
    spent = ledger_epsilon([*earlier, *extra], delta) if earlier or extra else 0.0
    if spent >= target_epsilon - tolerance:
        raise ConfigError(
            f"privacy.target_epsilon {target_epsilon:g} is already spent by the rounds run and the planned "
            f"validation releases (ε = {spent:.3g}): "
            "a target is spent over the rounds planned; start a new run planned with the rounds wanted"
        )
    start = earlier[-1].last if earlier else 0

    def eps(sigma: float) -> float:
        segment = Segment(start, start + steps, q, sigma, steps, sampling, num_clients)
        return ledger_epsilon([*earlier, segment, *extra], delta)

    low, high = 0.0, 1.0
    while eps(high) > target_epsilon:
        low, high = high, 2 * high
        if high > 1e6:
            raise ConfigError(f"privacy target_epsilon {target_epsilon} is unreachable (σ > 1e6)")
    while True:
        middle = (low + high) / 2
        value = eps(middle)
        if value > target_epsilon:
            low = middle
        else:
            high = middle
            if target_epsilon - value < tolerance:
                return high
        if high - low < 1e-9:
            return high

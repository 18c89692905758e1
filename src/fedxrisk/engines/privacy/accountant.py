"""ε(δ) of a run from Google's ``dp-accounting`` (optional extra ``privacy``).

A run of client-level DP is ``rounds`` releases of the sampled Gaussian mechanism:
each round a client takes part with probability ``q`` (Poisson sampling) and its
clipped update's sum gets N(0, (σC)²) noise. The RDP accountant composes them
(add-or-remove-one neighbouring: a client, with all its data, is present or not).
Fixed-fraction sampling (m of K clients, without replacement) is accounted under the
replace-one relation, the one the library's amplification bound for it holds under.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fedxrisk.errors import ConfigError

SAMPLINGS = ("poisson", "fixed")


def _library() -> Any:
    try:
        import dp_accounting
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "differential privacy needs the dp-accounting package: pip install 'fedxrisk[privacy]'"
        ) from e
    return dp_accounting


def _event(noise_multiplier: float, q: float, sampling: str, num_clients: int | None) -> Any:
    dpa = _library()
    gaussian = dpa.GaussianDpEvent(noise_multiplier)
    if q >= 1.0:
        return gaussian
    if sampling == "poisson":
        return dpa.PoissonSampledDpEvent(q, gaussian)
    m = fixed_count(q, num_clients)  # type: ignore[arg-type]
    return dpa.SampledWithoutReplacementDpEvent(num_clients, m, gaussian)


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


def fixed_count(q: float, num_clients: int) -> int:
    """Clients per round under fixed-fraction sampling: round(q·K), at least 1."""
    return max(1, min(num_clients, round(q * num_clients)))


def epsilon(
    noise_multiplier: float,
    steps: int,
    delta: float,
    q: float = 1.0,
    sampling: str = "poisson",
    num_clients: int | None = None,
) -> float:
    """ε at ``delta`` after ``steps`` rounds of the sampled Gaussian mechanism (RDP accountant).

    ``noise_multiplier`` σ: noise std / clipping norm; ``q``: sampling rate (1: every client
    every round); ``sampling``: ``"poisson"`` or ``"fixed"`` (needs ``num_clients``).
    ``inf`` without noise."""
    _check(noise_multiplier, q, steps, delta, sampling, num_clients)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    dpa = _library()
    relation = dpa.NeighboringRelation
    neighbours = relation.REPLACE_ONE if sampling == "fixed" and q < 1.0 else relation.ADD_OR_REMOVE_ONE
    accountant = dpa.rdp.RdpAccountant(neighboring_relation=neighbours)
    absl = logging.getLogger("absl")  # the library warns for every RDP order it skips as unstable
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant.compose(_event(noise_multiplier, q, sampling, num_clients), steps)
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


def noise_for_epsilon(
    target_epsilon: float,
    steps: int,
    delta: float,
    q: float = 1.0,
    sampling: str = "poisson",
    num_clients: int | None = None,
    tolerance: float = 0.01,
) -> float:
    """The smallest σ (to ``tolerance`` in ε) whose ε after ``steps`` rounds is ≤ ``target_epsilon``:
    bisection on σ, as Opacus's ``get_noise_multiplier`` does for ``make_private_with_epsilon``."""
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ConfigError(f"privacy target_epsilon must be a finite number > 0, got {target_epsilon}")

    def eps(sigma: float) -> float:
        return epsilon(sigma, steps, delta, q, sampling, num_clients)

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

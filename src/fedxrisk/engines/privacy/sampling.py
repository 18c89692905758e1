"""Which clients take part in a round: every client, Poisson, or a fixed fraction.

The set is drawn from the run's :class:`~fedxrisk.engines.privacy.noise.NoiseSource` (secret by
default: amplification by sampling assumes nobody outside learns who took part) and depends only on
(source, round) and the number of clients, so every engine (and every rank of the distributed
engine, each picking its own rows) draws the same set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedxrisk.engines.privacy.accountant import SAMPLINGS, fixed_count
from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.errors import ConfigError
from fedxrisk.tree import tmap

SAMPLING_STREAM = 0x53414D50  # separates this stream from the noise stream of the same round


@dataclass(frozen=True)
class ClientSampling:
    """Client sampling per round: ``rate`` q ∈ (0, 1] and ``kind`` ``"poisson"`` (each client
    independently with probability q) or ``"fixed"`` (round(q·K) clients, without replacement).
    q = 1 is every client every round."""

    rate: float = 1.0
    kind: str = "poisson"

    def __post_init__(self) -> None:
        if self.kind not in SAMPLINGS:
            raise ConfigError(f"client sampling must be one of {SAMPLINGS}, got {self.kind!r}")
        if not 0.0 < self.rate <= 1.0:
            raise ConfigError(f"client sampling rate must lie in (0, 1], got {self.rate}")

    @property
    def everyone(self) -> bool:
        return self.rate >= 1.0

    def mask(
        self,
        source: NoiseSource | int,
        round_: int,
        num_clients: int,
        weights: Sequence[float] | None = None,
    ) -> torch.Tensor:
        """Bool ``[num_clients]``: who takes part in round ``round_`` (0-based); ``source``: the
        run's noise source (an integer: :meth:`NoiseSource.reproducible` of it, for tests).
        ``weights`` (fixed sampling only; the non-DP ``data.participation = "weighted"``): draw the m
        clients without replacement with probability ∝ weight, by the keys log(u_k)/w_k, the m
        largest (Efraimidis & Spirakis 2006, A-Res); None: uniform, the m smallest u_k."""
        if self.everyone:
            return torch.ones(num_clients, dtype=torch.bool)
        if not isinstance(source, NoiseSource):
            source = NoiseSource.reproducible(source)
        u = torch.from_numpy(source.spawn(round_, SAMPLING_STREAM).uniform(num_clients))
        if self.kind == "poisson":
            return u < self.rate
        # fixed: the clients holding the m smallest of K uniforms (m without replacement)
        m = fixed_count(self.rate, num_clients)  # a partial selection: O(K), not a sort
        picked = (
            torch.topk(u, m, largest=False).indices
            if weights is None
            else torch.topk(u.log() / _weights(weights), m, largest=True).indices
        )
        chosen = torch.zeros(num_clients, dtype=torch.bool)
        chosen[picked] = True
        return chosen

    def denominator(self, num_clients: int, participants: int) -> float:
        """What the sum of clipped updates is divided by: the number of participants, except under
        Poisson sampling, where it is the expected number q·K (the fixed-denominator estimator
        of McMahan et al. 2018: the count itself would depend on whether a client is present)."""
        if self.kind == "poisson" and not self.everyone:
            return self.rate * num_clients
        return float(participants)


def _weights(weights: Sequence[float]) -> torch.Tensor:
    w = torch.as_tensor(list(weights), dtype=torch.float64)
    if not bool((w > 0).all()):
        raise ValueError("client sampling weights must all be > 0")
    return w


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(like.device).reshape(-1, *[1] * (like.dim() - 1))


def keep_idle(mask: torch.Tensor, new: Any, old: Any) -> Any:
    """``new`` for the clients in ``mask``, ``old`` for the others (stacked trees, same structure)."""
    return tmap(lambda n, o: torch.where(_rows(mask, n), n, o), new, old)


# state entries a client keeps while it sits a round out, although ``communicate`` rewrites them
# from its (unchanged) local state: SCAFFOLD's and CODASCA's own control variate c_k
IDLE_KEEPS = ("c_local",)


def before_communicate(mask: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
    """Make an idle client's stage average defined: a client that took no step this stage
    (CoDA-family ``iterate_count`` = 0) averages its current point, the last global it received."""
    if "iterate_count" not in state or bool(mask.all()):
        return state
    count = state["iterate_count"]
    empty = (~mask.to(count.device)) & (count == 0)
    if not bool(empty.any()):
        return state
    sums = state["iterate_sum"]
    point = {k: {b: state["buffers"][b] for b in sums[k]} if k == "buffers" else state[k] for k in sums}
    filled = tmap(lambda s, x: torch.where(_rows(empty, s), x.to(s.dtype), s), sums, point)
    return dict(state, iterate_sum=filled, iterate_count=torch.where(empty, torch.ones_like(count), count))


def after_communicate(mask: torch.Tensor, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """An idle client leaves the round with the broadcast (what it receives when next sampled)
    and keeps its own :data:`IDLE_KEEPS` entries."""
    if bool(mask.all()):
        return after
    kept = {k: keep_idle(mask, after[k], before[k]) for k in IDLE_KEEPS if k in after and k in before}
    return {**after, **kept}

"""Partial participation: which clients train each round, and a round of only them (issue 43).

One mechanism for every engine, with or without DP: a round's participants are a bool mask ``[K]``
(``data.clients_per_round``: :class:`Participation`; client-level DP: its own Poisson or fixed
draw from the secret noise source, :class:`~fedxrisk.engines.privacy.ClientSampling`, whose
accounting is unchanged). Both draws are :meth:`ClientSampling.mask`; the participation draw uses
a reproducible source seeded by ``data.participation_seed`` (else the run seed), so the set of a
round depends only on (seed, round, K) and every engine, rank and the Flower server draw the same.

Given the mask, :func:`~fedxrisk.engines.clientround.local_steps` steps only the participants'
rows (:func:`take_rows`, :func:`put_rows`: time ∝ participants), and ``communicate`` runs through
:class:`ParticipantCollective`: ``mean`` over the participants (each weighted as in a full round),
``pool`` of the participants' records only. What absent clients keep is stated in
docs/participation.md and :mod:`fedxrisk.engines.privacy.sampling` (``keep_idle``,
``before_communicate``, ``after_communicate``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedxrisk.engines.privacy.accountant import fixed_count
from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.engines.privacy.sampling import ClientSampling
from fedxrisk.errors import ConfigError
from fedxrisk.tree import Tree, tmap

PARTICIPATION_STREAM = 0x50415254  # the participation draw's sub-stream key (beside DP's)


@dataclass(frozen=True)
class Participation:
    """``data.clients_per_round``: m of K clients per round, without replacement, drawn uniformly
    or with probability ∝ shard size (``weights``), from ``seed`` (fixed-size sampling, as
    Flower's ``fraction_train`` and FedAvg's C·K: McMahan et al. 2017, Alg. 1)."""

    per_round: int | float
    num_clients: int
    seed: int = 0
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        m = self.per_round
        if isinstance(m, int) and not 1 <= m <= self.num_clients:
            raise ConfigError(
                f"data.clients_per_round = {m} must lie in [1, {self.num_clients}] (the data has "
                f"{self.num_clients} clients); set at most {self.num_clients}"
            )
        if isinstance(m, float) and not 0.0 < m <= 1.0:
            raise ConfigError(f"data.clients_per_round = {m}: a fraction must lie in (0, 1]")

    @property
    def count(self) -> int:
        """m: clients per round (a fraction q: round(q·K), at least 1)."""
        m = self.per_round
        return m if isinstance(m, int) else fixed_count(m, self.num_clients)

    @property
    def everyone(self) -> bool:
        return self.count >= self.num_clients

    def mask(self, round_: int) -> torch.Tensor | None:
        """Bool ``[K]`` of round ``round_``'s participants (0-based); None when every client takes part."""
        if self.everyone:
            return None
        sampling = ClientSampling(self.count / self.num_clients, "fixed")
        source = NoiseSource.reproducible(self.seed).spawn(PARTICIPATION_STREAM)
        return sampling.mask(source, round_, self.num_clients, self.weights)

    def describe(self) -> dict[str, Any]:
        """summary.json ``participation``."""
        how = "uniform" if self.weights is None else "weighted"
        return {
            "clients_per_round": self.count,
            "of": self.num_clients,
            "participation": how,
            "seed": self.seed,
        }


PARTICIPATION_FILE = "participation.csv"


def participation_csv(participation: Participation, rounds: int) -> str:
    """The run folder's record of who took part: one row per round (1-based, as history.csv),
    the participants' client indices separated by spaces (recomputed from the seed: a resumed run
    writes the same rows)."""
    lines = ["round,clients"]
    for r in range(rounds):
        mask = participation.mask(r)
        chosen = range(participation.num_clients) if mask is None else mask.nonzero().flatten().tolist()
        lines.append(f"{r + 1},{' '.join(str(k) for k in chosen)}")
    return "\n".join(lines) + "\n"


def participation_of(
    clients_per_round: int | float | None, shard_sizes: Sequence[int], seed: int, weighted: bool = False
) -> Participation | None:
    """The :class:`Participation` of ``clients_per_round`` (``data.clients_per_round``) among clients
    of ``shard_sizes``, drawn uniformly or ``weighted`` by shard size (None: every client every round)."""
    if clients_per_round is None:
        return None
    weights = tuple(float(n) for n in shard_sizes) if weighted else None
    out = Participation(clients_per_round, len(shard_sizes), seed, weights)
    return None if out.everyone else out


def round_mask(
    privacy: Any, participation: Participation | None, round_: int, clients: list[int]
) -> torch.Tensor | None:
    """Bool over ``clients`` (this process's): who takes part in round ``round_``: client-level DP's
    draw (``privacy``: its ``PrivateAggregator``) or ``participation``'s; None when every client does."""
    if privacy is not None:
        return privacy.sampled(round_, clients)
    mask = None if participation is None else participation.mask(round_)
    if mask is None or clients == list(range(len(mask))):  # every client, in order
        return mask
    return mask[torch.as_tensor(clients)]


def round_collective(
    comm: Any, privacy: Any, participation: Participation | None, round_: int, mask: torch.Tensor | None
) -> Any:
    """The round's collective: ``comm`` under client-level DP, or among the participants."""
    if privacy is not None:
        return privacy.wrap(comm, round_, mask)
    if mask is None or participation is None:
        return comm
    return ParticipantCollective(comm, mask, participation.count)


def take_rows(tree: Tree, rows: torch.Tensor) -> Tree:
    """The participants' rows of a stacked tree."""
    return tmap(lambda x: x.index_select(0, rows.to(x.device)), tree)


def put_rows(full: Tree, rows: torch.Tensor, part: Tree, fill: dict[str, float]) -> Tree:
    """``full`` with its ``rows`` replaced by ``part``; absent rows keep their values. An entry whose
    per-client shape the participants' steps changed (FeDXL's score records grow every step) is
    rebuilt: absent rows hold ``fill[entry]`` (the algorithm's ``idle_fill``: nothing recorded)."""

    def put(name: str, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        if x.shape[1:] == p.shape[1:]:
            out = x.clone()
        elif name in fill:
            out = torch.full((x.shape[0], *p.shape[1:]), fill[name], dtype=p.dtype, device=p.device)
        else:
            raise ValueError(f"state entry {name!r} changed shape in a local step; declare it in idle_fill")
        out[rows.to(x.device)] = p
        return out

    def entry(name: str, x: Any, p: Any) -> Any:
        return put(name, x, p) if isinstance(x, torch.Tensor) else tmap(lambda a, b: put(name, a, b), x, p)

    return {k: entry(k, v, part[k]) for k, v in full.items()}


class ParticipantCollective:
    """A round's collective among its participants (``mask``: this process's rows; ``participants``:
    m over all processes): ``mean`` is the participants' mean (absent rows zeroed, the inner mean
    over K scaled by K/m), ``pool`` merges the participants' records only. Everyone receives the
    answer (an absent client keeps what docs/participation.md says)."""

    def __init__(self, inner: Any, mask: torch.Tensor, participants: int):
        self.inner, self.mask, self.participants = inner, mask, participants
        self.num_clients = inner.num_clients

    def _zero_absent(self, tree: Tree) -> Tree:
        keep = self.mask
        return tmap(lambda x: torch.where(keep.to(x.device).reshape(-1, *[1] * (x.dim() - 1)), x, 0), tree)

    def mean(self, tree: Tree) -> Tree:
        scale = self.num_clients / self.participants
        return tmap(lambda x: x * scale, self.inner.mean(self._zero_absent(tree)))

    def pool(self, groups: dict[str, Tree], valid: dict[str, torch.Tensor], key: int) -> dict[str, Tree]:
        return self.inner.pool(groups, self._zero_absent(valid), key)

    def gather(self, tree: Tree) -> Tree:
        raise ConfigError(
            "data.clients_per_round: this algorithm gathers every client's values each round, which absent "
            "clients cannot send; drop clients_per_round"
        )

    def per_client(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return self.inner.per_client(fn, *trees)

    def __getattr__(self, name: str) -> Any:  # engine extras of the wrapped collective (e.g. ``finish``)
        return getattr(self.inner, name)

"""A round among its participants only, the global state kept once (issue 43, item 3).

Under ``data.clients_per_round`` a round's local steps already run on the m participants' rows
(:func:`~fedxrisk.engines.clientround.local_steps`); this module makes the rest of the round
O(m) too, where the algorithm allows. Between rounds a client's state is of two kinds:

- **its own** entries (the algorithm's ``own_state``: control variates c_k, the stage sums, the
  last loss, p_k): kept per client in the stacked store, written back only for the participants;
- **shared** entries (everything else: the model, the global control variate, momentum, the
  round's start point): after a round, equal to the broadcast on every client. They are kept
  **once** (``template``, one row) and written into a client's row only when it is gathered, or
  into every row when something reads :attr:`LazyStates.states` (evaluation, checkpoints).

A lazy round runs the algorithm's ``communicate`` on the m participants' rows plus the template
row, which stands for every absent client (zeroed out of the mean, it receives the broadcast),
so its result for the shared entries is what each absent client receives in a round over all K
rows. It is used only where that round leaves every absent client's own entries unchanged (CODA's
stage ends and stage starts rewrite them: those rounds run over all K rows), after round 0,
without client-level DP, personal entries, buffers or the round's extra batches, and on the
single-process engines; otherwise the round runs over all K rows as before. It equals that round
up to the mean's summation order
(``tests/test_participation.py::test_a_lazy_round_equals_the_round_over_every_client``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fedxrisk.algorithms.base import Algorithm
from fedxrisk.algorithms.personal import site_collective
from fedxrisk.algorithms.schedule import RoundPlan
from fedxrisk.engines.clientround import communicate, local_steps, round_context
from fedxrisk.engines.participation import ParticipantCollective, take_rows
from fedxrisk.tree import Tree, index, is_finite, leaves, tmap


def own_entries(algorithm: Algorithm, states: Tree) -> tuple[str, ...] | None:
    """The entries a client keeps as its own between rounds, when lazy rounds apply to this
    algorithm and model (its class declares ``own_state`` itself: a subclass adding state does
    not inherit it); None otherwise."""
    own = type(algorithm).__dict__.get("own_state")
    problem = getattr(algorithm, "problem", None)
    if own is None or getattr(problem, "local_names", ()) or algorithm.round_batch_size:
        return None
    if algorithm.begin_batch or next(leaves(states.get("buffers", {})), None) is not None:
        return None
    return tuple(own)


def lazy_round_applies(algorithm: Algorithm, plans: list[RoundPlan], r: int) -> bool:
    """Whether round ``r`` may run among its participants only (see the module docstring)."""
    if r == 0 or (plans[r].stage_end and algorithm.stage_batch_size):
        return False
    # a stage end, and a stage's first round, rewrite absent clients' own entries (CODA's new
    # ``ref`` and reset sums; an idle client's empty stage sum takes the point it holds)
    return not (algorithm.acts_at_stage_end and (plans[r].stage_end or plans[r - 1].stage_end))


class LazyStates:
    """The stacked state of K clients whose shared entries may be kept once (``_template``);
    reading :attr:`states` writes them into every row first."""

    _rows: Tree
    _template: Tree | None = None  # the shared entries' current value, when rows are stale
    _own: tuple[str, ...] = ()
    _owned = False  # whether the own entries' tensors are this object's alone (written in place)

    @property
    def states(self) -> Tree:
        if self._template is not None:
            k, template = next(leaves(self._rows))[1].shape[0], self._template
            self._rows = {
                key: value if key in self._own else tmap(lambda t: _repeat(t, k), template[key])
                for key, value in self._rows.items()
            }
            self._template = None
        self._owned = False  # the reader may keep these tensors
        return self._rows

    @states.setter
    def states(self, value: Tree) -> None:
        self._rows, self._template, self._owned = value, None, False


def _repeat(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.unsqueeze(0).expand(n, *t.shape).contiguous()


class RowsCollective:
    """The mean over the rows given (absent ones zeroed by :class:`ParticipantCollective`) of K
    clients: their sum / K, with ``inner``'s byte accounting."""

    def __init__(self, inner: Any):
        self.inner, self.num_clients = inner, inner.num_clients

    def mean(self, tree: Tree) -> Tree:
        self.inner.ledger.record("mean", tree, self.num_clients)
        return tmap(lambda x: (x.sum(0, keepdim=True) / self.num_clients).expand_as(x).clone(), tree)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def lazy_round(
    sim: Any, mask: torch.Tensor, next_batch: Callable[[int, torch.Tensor | None], Tree], inner: Any
) -> bool:
    """Round ``sim.round`` among the participants ``mask`` (bool ``[K]``) and the template row;
    the participants' own entries are written into ``sim``'s store in place, the shared ones kept
    once. ``inner``: the round's collective over all K clients (its byte ledger). Whether every
    participant's loss and model are finite."""
    store, own = sim._rows, sim._own
    template = sim._template if sim._template is not None else tmap(torch.clone, index(store, 0))
    if not sim._owned:  # copy once what others may hold, then write in place
        store = {k: tmap(torch.clone, v) if k in own else v for k, v in store.items()}
    rows = mask.nonzero().flatten()
    m, chosen = len(rows), torch.ones(len(rows) + 1, dtype=torch.bool)
    chosen[-1] = False  # the template row: every absent client
    gathered = take_rows({k: store[k] for k in own}, rows)
    part = {
        key: tmap(lambda g, t: torch.cat([g, t.unsqueeze(0)]), gathered[key], template[key])
        if key in own
        else tmap(lambda t: _repeat(t, m + 1), template[key])
        for key in store
    }
    plans, r, algorithm = sim.plans, sim.round, sim.algorithm
    part = local_steps(algorithm, sim.engine, part, plans[r], lambda step, _: next_batch(step, rows), chosen)
    ctx = round_context(plans, r, None, None, lambda _: {})  # no extra batches (lazy_round_applies)
    comm = ParticipantCollective(RowsCollective(inner), chosen, m)
    after = communicate(
        algorithm, part, site_collective(comm, getattr(algorithm, "problem", None)), ctx, chosen
    )
    for key in own:
        tmap(lambda s, a: s.index_copy_(0, rows.to(s.device), a[:m]), store[key], after[key])
    sim._rows, sim._template, sim._owned = store, index(after, m), True
    return bool(torch.isfinite(after["loss"][:m]).all()) and is_finite(tmap(lambda x: x[:m], after["w"]))

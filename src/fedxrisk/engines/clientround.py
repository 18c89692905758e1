"""One client round, the same for every engine: I local steps, the round's extra batches, ``communicate``.

:func:`client_round` is what :class:`~fedxrisk.engines.simulation.Simulation` (and so the
distributed engine) runs each round, on the clients it holds. A Flower site runs the same two
halves, :func:`local_steps` and :func:`communicate`, in separate messages, because a ClientApp
cannot wait for the server's answer and replays ``communicate`` instead (flower/site.py).

Under client sampling (``mask``: bool ``[K]``, None when every client takes part: DP's draw or
``data.clients_per_round``, :mod:`fedxrisk.engines.participation`) only the drawn clients' rows are
stepped (gathered, stepped, put back: time ∝ participants); a client not drawn takes no step and
draws no batch, gets its stage average defined and keeps its own control variate, as
:mod:`fedxrisk.engines.privacy.sampling` says; for a mask of all True these are the identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedxrisk.algorithms.base import Algorithm, RoundContext, StepContext
from fedxrisk.algorithms.schedule import RoundPlan
from fedxrisk.engines import privacy as dp
from fedxrisk.engines.participation import put_rows, take_rows
from fedxrisk.tree import Tree

Positions = Callable[[int], np.ndarray]  # draws that many positions per client (the auxiliary sampler)
ToBatch = Callable[[np.ndarray], Tree]  # positions → a batch of the clients' data


def local_steps(
    algorithm: Algorithm,
    engine: Any,
    states: Tree,
    plan: RoundPlan,
    next_batch: Callable[[int, torch.Tensor | None], Tree],
    mask: torch.Tensor | None = None,
) -> Tree:
    """The round's ``plan.window`` local steps on every client in ``mask`` (``engine.local_steps`` on
    their rows only), each on ``next_batch(step, rows)`` (the global step: instance-level DP's noise
    is drawn for it; ``rows``: the participants' row indices, None for all); the clients outside
    ``mask`` keep their state and are made ready for ``communicate``."""
    rows = None if mask is None else mask.nonzero().flatten()
    part = states if rows is None else take_rows(states, rows)
    for i in range(plan.window if rows is None or len(rows) else 0):
        ctx = StepContext(plan.first_step + i, i, plan.round, plan.stage, plan.lr, plan.window)
        part = engine.local_steps(algorithm.local_step, ctx, part, next_batch(ctx.step, rows))
    if mask is None:
        return part
    states = put_rows(states, rows, part, getattr(algorithm, "idle_fill", {}))
    return dp.before_communicate(mask, states)


def extra_positions(
    algorithm: Algorithm, plan: RoundPlan, last: bool, sample: Positions
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Positions of the stage-end batch (``stage_batch_size``, not after the last round) and of the
    round batch (``round_batch_size``), drawn in this order from the auxiliary sampler."""
    size = algorithm.stage_batch_size
    stage = sample(size) if size and plan.stage_end and not last else None
    round_size = algorithm.round_batch_size
    return stage, (sample(round_size) if round_size else None)


def round_context(
    plans: list[RoundPlan],
    r: int,
    stage: np.ndarray | None,
    round_: np.ndarray | None,
    to_batch: ToBatch,
) -> RoundContext:
    """``communicate``'s context for round ``r``, its extra batches built from their positions."""
    next_plan = plans[r + 1] if r + 1 < len(plans) else None
    batch = lambda p: None if p is None else to_batch(p)  # noqa: E731
    return RoundContext(plans[r], next_plan, batch(stage), batch(round_))


def communicate(
    algorithm: Algorithm, states: Tree, comm: Any, ctx: RoundContext, mask: torch.Tensor | None = None
) -> Tree:
    """The algorithm's ``communicate``; a client outside ``mask`` leaves with the broadcast and its own
    control variate."""
    after = algorithm.communicate(states, comm, ctx)
    return after if mask is None else dp.after_communicate(mask, states, after)


def client_round(
    algorithm: Algorithm,
    engine: Any,
    states: Tree,
    plans: list[RoundPlan],
    r: int,
    next_batch: Callable[[int, torch.Tensor | None], Tree],
    sample: Positions,
    to_batch: ToBatch,
    collective: Callable[[Tree], Any],
    mask: torch.Tensor | None = None,
) -> Tree:
    """Round ``r`` of every client: :func:`local_steps`, the extra batches, :func:`communicate` through
    the collective ``collective(states)`` builds from the states after the local steps (the
    distributed engine packs their losses into its reduce), after the batches are drawn."""
    states = local_steps(algorithm, engine, states, plans[r], next_batch, mask)
    stage, round_ = extra_positions(algorithm, plans[r], r + 1 == len(plans), sample)
    ctx = round_context(plans, r, stage, round_, to_batch)
    return communicate(algorithm, states, collective(states), ctx, mask)

"""Callbacks: what the training loop calls at its events, with state that survives a resume.

A :class:`Callback` overrides the hooks it needs. The loop passes a
:class:`LoopState` to each hook; setting ``state.should_stop = True`` ends
training after the current round (the run then finishes normally: model,
summary). A callback whose :meth:`Callback.state_dict` is not empty has it
saved in ``checkpoint.pt`` under ``callbacks[state_key]`` and handed back to
:meth:`Callback.load_state_dict` on resume — the seam for model selection and
early stopping. Under the distributed engine only rank 0 evaluates, so a
callback that stops must make every rank agree first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedxrisk.run.spec import RunConfig
from fedxrisk.tree import Tree

ProgressFn = Callable[[dict[str, Any], int, int], None]  # (row or {}, rounds done, total)


@dataclass
class LoopState:
    """What a hook may read: the run, the rounds done so far, the history; ``should_stop`` it may set."""

    config: RunConfig
    out: Path
    total: int
    round: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    primary: bool = True
    should_stop: bool = False
    global_model: Callable[[], tuple[Tree, Tree]] | None = None  # the current (params, buffers)
    positive: str = ""  # the positive class(es), one line (data.types.describe_positive)
    site_states: Callable[[], Any] | None = None  # a copy of every site's state (a personalized run)


class Callback:
    """No-op hooks; override the ones needed. ``all_ranks``: under the distributed engine
    ``on_evaluation`` runs on every rank too, with a row of the ``val_*`` metrics only (the same
    numbers on every rank), so a stop decided from them is taken by all ranks together."""

    all_ranks = False

    @property
    def state_key(self) -> str:
        return type(self).__name__

    def on_start(self, state: LoopState) -> None:
        """Before the first round (after a resume: before the next round)."""

    def on_evaluation(self, row: dict[str, Any], state: LoopState) -> None:
        """After each evaluation row is written (round 0: the starting weights of a run with ``init``)."""

    def on_round_end(self, row: dict[str, Any], state: LoopState) -> None:
        """After each round and its checkpoint; ``row`` is ``{}`` when the round was not evaluated."""

    def on_end(self, state: LoopState) -> None:
        """When training stops, also on a failure."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class Announce(Callback):
    """Calls ``say(line)`` once at the start (and on resume): which class is positive."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def on_start(self, state: LoopState) -> None:
        if state.primary and state.positive:
            self.say(state.positive)


class Progress(Callback):
    """Calls ``fn(row or {}, rounds done, total)``: the progress function of :func:`run_experiment`."""

    def __init__(self, fn: ProgressFn) -> None:
        self.fn = fn

    def on_start(self, state: LoopState) -> None:
        if state.round:  # resumed: show where the run stands
            self.fn(state.history[-1] if state.history else {}, state.round, state.total)

    def on_evaluation(self, row: dict[str, Any], state: LoopState) -> None:
        if row["round"] == 0:  # the starting weights: no round follows to report it
            self.fn(row, 0, state.total)

    def on_round_end(self, row: dict[str, Any], state: LoopState) -> None:
        self.fn(row, state.round, state.total)


TB_SCALARS = ("test_auroc", "test_ap", "train_loss", "client_auroc_mean", "lr")


class TensorBoard(Callback):
    """TensorBoard events in ``RUN/tensorboard`` when ``cfg.tensorboard`` and tensorboard is installed."""

    def __init__(self) -> None:
        self.writer: Any = None

    def on_start(self, state: LoopState) -> None:
        if not (state.primary and state.config.tensorboard):
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return
        purge = state.round + 1 if state.round else None  # drop events after the checkpoint
        self.writer = SummaryWriter(str(state.out / "tensorboard"), purge_step=purge)

    def on_evaluation(self, row: dict[str, Any], state: LoopState) -> None:
        if self.writer is None or row["round"] == 0:  # round 0 (starting weights) is not logged
            return
        for key in TB_SCALARS:
            self.writer.add_scalar(key, row[key], row["round"])

    def on_end(self, state: LoopState) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def improves(new: float, old: float) -> bool:
    """``new`` is strictly better (higher) than ``old``; NaN never improves, anything beats NaN."""
    return not math.isnan(new) and (math.isnan(old) or new > old)


class BestModel(Callback):
    """Keeps the model of the evaluation with the highest ``monitor`` (a ``val_*`` column; the
    first of equal values) and that row: ``selection = "best"`` writes it as ``model.pt``; in a
    personalized run also every site's state then (``state.site_states``), from which the sites'
    models and their fine-tuning start. Its state (value, round, row, weights) goes into the
    checkpoint, so a resumed run keeps it."""

    all_ranks = True

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self.value = math.nan
        self.row: dict[str, Any] | None = None
        self.params: Tree | None = None
        self.buffers: Tree | None = None
        self.states: Any = None

    def on_evaluation(self, row: dict[str, Any], state: LoopState) -> None:
        value = float(row.get(self.monitor, math.nan))
        if not improves(value, self.value):
            return
        self.value, self.row = value, dict(row)
        if state.primary and state.global_model is not None:  # only the writer keeps the weights
            params, buffers = state.global_model()
            self.params = {k: v.detach().cpu().clone() for k, v in params.items()}
            self.buffers = {k: v.detach().cpu().clone() for k, v in buffers.items()}
        if state.primary and state.site_states is not None:
            self.states = state.site_states()

    def state_dict(self) -> dict[str, Any]:
        if self.row is None:
            return {}
        return {"monitor": self.monitor, "value": self.value, "row": self.row, "params": self.params,
                "buffers": self.buffers, **({"states": self.states} if self.states is not None else {})}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.row = state["value"], state["row"]
        self.params, self.buffers = state["params"], state["buffers"]
        self.states = state.get("states")


class EarlyStopping(Callback):
    """Stops training after ``patience`` evaluations in a row without a strictly better
    ``monitor`` (a NaN value counts as no improvement). Under the distributed engine every rank
    sees the same ``val_*`` numbers and stops at the same round."""

    all_ranks = True

    def __init__(self, monitor: str, patience: int) -> None:
        self.monitor, self.patience = monitor, patience
        self.best = math.nan
        self.wait = 0
        self.stopped_round: int | None = None

    def on_evaluation(self, row: dict[str, Any], state: LoopState) -> None:
        value = float(row.get(self.monitor, math.nan))
        if improves(value, self.best):
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            state.should_stop = True
            self.stopped_round = row["round"]

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "stopped_round": self.stopped_round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait, self.stopped_round = state["best"], state["wait"], state["stopped_round"]


def selection_callbacks(selection: str, monitor: str, early_stopping: int) -> list[Callback]:
    """The callbacks a run's settings ask for: :class:`BestModel` (``selection = "best"``) and
    :class:`EarlyStopping` (``early_stopping > 0``), both on ``monitor`` (``RunConfig.resolved_monitor``)."""
    out: list[Callback] = [BestModel(monitor)] if selection == "best" else []
    return out + ([EarlyStopping(monitor, early_stopping)] if early_stopping else [])


def default_callbacks(progress: ProgressFn | None, extra: Sequence[Callback] = ()) -> list[Callback]:
    """TensorBoard, any ``extra`` callbacks, then the progress function (called last, as before)."""
    return [TensorBoard(), *extra, *([Progress(progress)] if progress else [])]

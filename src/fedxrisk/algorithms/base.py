"""The algorithm contract (DESIGN.md): ``init`` / ``local_step`` / ``communicate``.

An algorithm is written from one client's point of view over a *state*: a
tree (nested dict) of tensors. Engines own everything else: data, sampling,
client layout, collectives, byte accounting, evaluation.

- ``init(client)`` returns the client's starting state.
- ``local_step(state, batch, ctx)`` is one local update with no communication.
  It is a pure function of its inputs (no randomness, no in-place mutation of
  ``state``), so engines may run it per client or batched with ``torch.func.vmap``.
- ``communicate(state, comm, ctx)`` ends a round: it calls ``comm.mean`` and
  ``comm.gather`` and does any server-side arithmetic. Here every state leaf
  carries a leading client axis (all clients of this process); code must be
  elementwise over it, which is what per-client vector arithmetic is anyway.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Protocol

import torch
from torch.func import grad_and_value

from fedxrisk.algorithms.schedule import RoundPlan, Schedule
from fedxrisk.problem import Problem
from fedxrisk.tree import Tree

State = dict[str, Any]
Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClientInfo:
    index: int
    num_samples: int
    pos_ratio: float  # the client's own positive ratio
    max_samples: int = 0  # the largest shard over all clients (size per-sample state with it for vmap)


@dataclass(frozen=True)
class StepContext:
    """What a local step may know besides its state and batch."""

    step: int  # global local-step index t (0-based)
    local_step: int  # index within the current round
    round: int
    stage: int
    lr: float
    window: int


@dataclass(frozen=True)
class RoundContext:
    """What ``communicate`` may know: the round just finished and the next one."""

    plan: RoundPlan
    next_plan: RoundPlan | None  # None after the last round
    stage_batch: Batch | None = None  # per-client large batch at stage ends, if requested
    round_batch: Batch | None = None  # per-client auxiliary batch every round, if requested

    @property
    def lr(self) -> float:
        return self.plan.lr

    @property
    def window(self) -> int:
        return self.plan.window

    @property
    def stage_end(self) -> bool:
        return self.plan.stage_end


class Collective(Protocol):
    """What ``communicate`` may use to talk to other clients."""

    num_clients: int

    def mean(self, tree: Tree) -> Tree:
        """Mean over all clients of each leaf, returned to every client (one packed reduce)."""

    def gather(self, tree: Tree) -> Tree:
        """Each leaf ``[*shape]`` becomes ``[num_clients, *shape]`` on every client."""

    def pool(self, groups: dict[str, Tree], valid: dict[str, torch.Tensor], key: int) -> dict[str, Tree]:
        """Merge per-sample records on the server (:mod:`fedxrisk.engines.pooling`): each group's
        leaves ``[n, ...]`` with a 0/1 mask ``valid[group]`` ``[n]`` (seen by the server only)
        become the valid entries of all clients, shuffled by ``(run seed, key, group)``:
        ``[N, ...]`` on every client."""

    def per_client(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        """Run a per-client function (no communication) over stacked trees."""


class GradientEstimator(Protocol):
    """``(loss(params, batch) -> (value, buffers), params, batch) -> (∇loss, (value, buffers))``."""

    def __call__(
        self, loss: Callable[..., tuple[torch.Tensor, Tree]], params: Tree, batch: Batch
    ) -> tuple[Tree, tuple[torch.Tensor, Tree]]: ...


class MeanGradient:
    """The plain estimator: autograd of the batch objective (the mean of the per-sample terms)."""

    def __call__(
        self, loss: Callable[..., tuple[torch.Tensor, Tree]], params: Tree, batch: Batch
    ) -> tuple[Tree, tuple[torch.Tensor, Tree]]:
        return grad_and_value(loss, has_aux=True)(params, batch)


class Algorithm:
    """Base class: hyperparameters are dataclass fields; subclasses implement the contract.

    Class attributes:
        name: registry key.
        communicates: names of state entries a round sends (documentation and tests).
        collectives: the collectives ``communicate`` and ``begin`` call besides ``per_client``
            (``"mean"``, ``"gather"``, ``"pool"``); wrappers read it (client-level DP covers
            one ``mean`` and refuses an algorithm declaring ``gather`` or ``pool``).
        fixed_window: a window the algorithm requires (NPA: 1), else None.
        stage_batch_size: per-client samples the engine draws at stage ends (CoDA).
        round_batch_size: per-client samples the engine draws every round, given to
            ``communicate`` as ``ctx.round_batch`` (LocalSGDM_RL's auxiliary set).
        default_lr: the learning rate used when a run does not set one.
        uniforms_per_step: U(0, 1) numbers the engine adds to each batch as
            ``batch["uniform"]`` (local steps may not draw random numbers themselves).
        positives_per_batch: when > 0, every batch holds this many positives first,
            then ``batch_size`` minus that many negatives (a class-aware sampler; a
            client lacking a class fills those slots from the other class).
        begin_batch: when True, the engine calls :meth:`begin` once before the
            first round with one regular batch per client (FeDXL seeds its pools).
        needs_both_classes: the objective needs positives and negatives on every
            client (AUC-type risks); False for cross-entropy, where a client holding
            one class is ordinary (no ``allow_missing_class`` needed).
        monitor: the validation column model selection and early stopping follow by
            default (``val_auroc``; the pAUC and AP objectives their own metric).
        task: the data it trains on: ``"binary"`` (labels 0/1) or ``"survival"`` (an event
            flag with a time: :mod:`fedxrisk.algorithms.survival`); a run refuses the other.
        restarts_w: (hyperparameter, value) under which ``communicate`` replaces w at a stage's
            end by another point than the round's mean (a server optimizer then steps from it).
        acts_at_stage_end: ``communicate`` changes the state at a stage's last round
            (CODA+'s restart): a run extended past its last round then differs from one
            planned longer (``fedxrisk run --resume RUN --rounds N`` warns).
        couples_samples: why one record's influence on a round is not bounded by clipping
            its own gradient (a pairwise or compositional loss, class sums sent in
            ``communicate``); None when :meth:`sample_loss` is all a record touches.
            Instance-level DP refuses an algorithm that says so (engines/privacy/instance.py).
        uses_pos_ratio: the objective weighs the classes by a prior p (AUC losses); at
            instance level p must then be public (docs/privacy.md).
        touches_labels: the computations of a step, outside :meth:`sample_loss`, that read the
            batch's labels (name → the label-free form they take when ``label_free`` is set, or
            None when they have none: instance-level DP then refuses the algorithm).
        label_free: every computation in ``touches_labels`` takes its label-free form (DP-SGD
            sets it: at instance level a label may reach a step only through the noised gradient).
        gradient_estimator: how :meth:`gradient` turns :meth:`sample_loss` into a gradient:
            :class:`MeanGradient` (autograd of the batch mean); DP-SGD supplies another.
        poisson_batches: the engine draws each record into a batch independently
            (``batch["mask"]`` marks the records of a padded batch); set by DP-SGD.
        noise_per_step: float64 N(0, 1) draws the engine adds to each batch as
            ``batch["noise"]`` from the run's secret noise source; set by DP-SGD.
        idle_fill: state entries whose per-client shape a local step changes (FeDXL's score
            records), with the value a client sitting a round out holds in them (nothing recorded).
    """

    name: ClassVar[str] = ""
    communicates: ClassVar[tuple[str, ...]] = ()
    collectives: ClassVar[tuple[str, ...]] = ("mean",)
    fixed_window: ClassVar[int | None] = None
    stage_batch_size: int = 0
    round_batch_size: int = 0
    default_lr: ClassVar[float] = 0.1
    uniforms_per_step: ClassVar[int] = 0
    positives_per_batch: int = 0
    begin_batch: ClassVar[bool] = False
    needs_both_classes: ClassVar[bool] = True
    task: ClassVar[str] = "binary"
    monitor: ClassVar[str] = "val_auroc"
    acts_at_stage_end: ClassVar[bool] = False
    restarts_w: ClassVar[tuple[str, Any] | None] = None
    couples_samples: ClassVar[str | None] = None
    uses_pos_ratio: ClassVar[bool] = False
    touches_labels: ClassVar[dict[str, str | None]] = {}
    label_free: bool = False
    gradient_estimator: GradientEstimator = MeanGradient()
    poisson_batches: bool = False
    noise_per_step: int = 0
    idle_fill: ClassVar[dict[str, float]] = {}

    problem: Problem

    def init(self, client: ClientInfo) -> State:
        raise NotImplementedError

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        raise NotImplementedError

    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        raise NotImplementedError

    def sample_loss(self, params: Tree, state: State, batch: Batch) -> tuple[torch.Tensor, Tree]:
        """(the objective on ``batch`` at ``params`` (:meth:`sample_params`), the buffers after the
        forward pass), where the objective is the mean over the batch of one term per sample given
        ``state`` (DP-SGD clips each term's gradient). Declared by the algorithms that take their
        gradient from :meth:`gradient`; the others leave it undeclared."""
        raise NotImplementedError(f"{self.name} declares no per-sample loss")

    @classmethod
    def declares_sample_loss(cls) -> bool:
        """Whether the algorithm's gradient comes from a declared :meth:`sample_loss`."""
        return cls.sample_loss is not Algorithm.sample_loss

    def sample_params(self, state: State) -> Tree:
        """The variables :meth:`sample_loss` is differentiated in (default: the model ``w``)."""
        return state["w"]

    def gradient(self, state: State, batch: Batch) -> tuple[Tree, tuple[torch.Tensor, Tree]]:
        """(∇ of :meth:`sample_loss` in :meth:`sample_params`, (its value, buffers)), by
        ``gradient_estimator``: the batch mean's gradient, or DP-SGD's private one."""
        loss = lambda params, b: self.sample_loss(params, state, b)  # noqa: E731
        return self.gradient_estimator(loss, self.sample_params(state), batch)

    def begin(self, state: State, comm: Collective, batch: Batch) -> State:
        """Once before the first round (stacked state, like ``communicate``), if ``begin_batch``."""
        return state

    def __post_init__(self) -> None:
        self.check_hyperparameters()

    def check_hyperparameters(self) -> None:
        """Range checks of the hyperparameter fields alone (never ``self.problem``): a ValueError
        naming the field. Run at construction, and by the config checks on the values before
        anything is built (:meth:`check_values`); work that needs the problem stays in ``__post_init__``."""

    def validate_schedule(self, schedule: Schedule) -> None:
        """Check hyperparameters that depend on the step sizes (engines call it before training)."""

    def model(self, state: State) -> tuple[Tree, Tree]:
        """The (params, buffers) to evaluate."""
        return state["w"], state["buffers"]

    @classmethod
    def default_lr_for(cls, pos_ratio: float) -> float:
        """The step size a run without ``lr`` uses on data with this positive ratio (default: ``default_lr``)."""
        return cls.default_lr

    @classmethod
    def stage_restart(cls, options: Mapping[str, Any]) -> str | None:
        """With these hyperparameters, how ``communicate`` replaces w at a stage's end (``restarts_w``
        holds: a restart from another point than the round's mean), or None."""
        if cls.restarts_w is None:
            return None
        key, value = cls.restarts_w
        try:
            values = cls._values(options)
        except ValueError:  # hyperparameters refused by their own check: reported there
            return None
        if getattr(values, key) != value:
            return None
        return f"it restarts each stage from the stage's average iterate ({key} = {value!r})"

    @classmethod
    def check_values(cls, options: Mapping[str, Any], schedule: Schedule | None = None) -> None:
        """What the class declares about its hyperparameters (:meth:`check_hyperparameters`, then
        :meth:`validate_schedule`), run on ``options`` over the defaults, without a problem."""
        values = cls._values(options)
        if schedule is not None:
            values.validate_schedule(schedule)

    @classmethod
    def _values(cls, options: Mapping[str, Any]) -> Algorithm:
        """The hyperparameters ``options`` over the defaults, checked (forms resolved), without a problem."""
        values = object.__new__(cls)  # the fields only: no __init__, no problem
        for f in fields(cls):  # type: ignore[arg-type]
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            default = None if default is MISSING else default  # the problem
            object.__setattr__(values, f.name, options.get(f.name, default))
        values.check_hyperparameters()
        return values

    @classmethod
    def hyperparameters(cls) -> dict[str, Any]:
        """Field name → default, for ``fedxrisk list`` and config validation."""
        return {f.name: f.default for f in fields(cls) if f.name != "problem"}  # type: ignore[arg-type]


HOOKS = (
    "gradient_estimator", "poisson_batches", "noise_per_step", "positives_per_batch", "problem", "label_free",
)  # fmt: skip


def with_hooks(algorithm: Algorithm, **hooks: Any) -> Algorithm:
    """A copy of ``algorithm`` with some of its declared hooks (:data:`HOOKS`) replaced: how
    DP-SGD and class-aware batches wrap an algorithm; the original object is left as it was."""
    unknown = sorted(set(hooks) - set(HOOKS))
    if unknown:
        raise TypeError(f"{unknown[0]!r} is not an algorithm hook; hooks: {', '.join(HOOKS)}")
    out = copy.copy(algorithm)
    for key, value in hooks.items():
        setattr(out, key, value)
    return out


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator adding an algorithm to :data:`ALGORITHMS` under ``cls.name``."""
    if not cls.name or cls.name in ALGORITHMS:
        raise ValueError(f"algorithm name {cls.name!r} missing or registered twice")
    ALGORITHMS[cls.name] = cls
    return cls


def model_payload(state: State, problem: Problem) -> Tree:
    """The model part of a round's message: parameters, plus float buffers if averaged."""
    payload = {"w": state["w"]}
    if problem.buffer_policy == "average":
        floats = {k: v for k, v in state["buffers"].items() if v.is_floating_point()}
        if floats:
            payload["buffers"] = floats
    return payload


def with_model(state: State, averaged: Tree) -> State:
    """Write an averaged model payload back into ``state``."""
    out = dict(state, w=averaged["w"])
    if "buffers" in averaged:
        out["buffers"] = {**state["buffers"], **averaged["buffers"]}
    return out

"""One assembly: a checked config plus the facts every party knows at set-up → a run's parts.

:func:`assemble` builds the problem, the algorithm with its wrappers (class-aware batches, privacy,
the server optimizer: in that order, the server step outermost so that it acts on the privatized
mean), the schedule, the one privacy plan (:class:`~fedxrisk.run.privacy.PrivacyPlan`) and the
clients drawn each round;
:func:`assemble_model` builds the model every party starts from. ``fedxrisk run``
(:func:`fedxrisk.run.build.build`, every engine), the Flower server
(:meth:`fedxrisk.flower.federation.Federation.connect`) and every Flower site
(:meth:`fedxrisk.flower.site.SiteRunner.initialize`) call them, so a setting means the same
wherever it runs. The :class:`Facts` are what every party can know before training without
seeing another party's data: the input shape, the labels, the public positive ratio, the
per-site counts and what the validation release would carry.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fedxrisk.algorithms import ALGORITHMS, Algorithm, Schedule
from fedxrisk.classaware import class_aware_batches
from fedxrisk.engines.participation import Participation, participation_of
from fedxrisk.engines.server_opt import ServerOptimizer, with_server_optimizer
from fedxrisk.errors import ConfigError
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from fedxrisk.run.privacy import PrivacyPlan, instance_pos_ratio, plan_privacy
from fedxrisk.run.rules import schedule as run_schedule
from fedxrisk.run.spec import RunConfig

ClassMass = Callable[[Any], list[tuple[float, float]]]  # ValidationDP → per label (negative, positive) mass


@dataclass(frozen=True)
class Facts:
    """What a party of a run knows at set-up, before any training step.

    ``pos_ratio``: the training data's positive ratio (on Flower: from the sites' set-up counts);
    ``max_samples``: the largest shard (``ClientInfo.max_samples``). The server's facts add what
    the privacy plan reads: ``train_samples`` (N, δ's default), ``smallest_shard`` (instance-level
    q), ``validation`` (the per-label class masses the summed validation histograms would carry
    under a given ``ValidationDP``; None: no party holds validation data) and ``evaluates_start``
    (the run loop evaluates the starting weights: a release at round 0). A party without
    ``train_samples`` (a Flower site) plans no privacy: the server clips and adds the noise; one
    with ``shard_sizes`` (every client's training samples) draws the clients of each round."""

    input_shape: tuple[int, ...]
    num_labels: int
    pos_ratio: Any  # float; per label for multi-label data
    num_clients: int
    max_samples: int
    train_samples: int | None = None
    smallest_shard: int | None = None
    validation: ClassMass | None = None
    evaluates_start: bool = False
    shard_sizes: tuple[int, ...] | None = None  # the party that draws each round's participants


@dataclass
class Assembly:
    """A run's parts: the config with its step size fixed for the data, the problem, the algorithm
    with its wrappers, the schedule, the engine's client-level DP, the privacy plan and the clients
    drawn each round (``data.clients_per_round``)."""

    config: RunConfig
    problem: Problem
    algorithm: Algorithm
    schedule: Schedule
    client_dp: Any = None  # engines.privacy.ClientDP: the server's clipping and noise; None without
    privacy: PrivacyPlan | None = None
    participation: Participation | None = None  # the clients of each round; None: every client


@contextmanager
def users_error() -> Iterator[None]:
    """A ValueError raised where the user's settings meet their data or model becomes a
    :class:`ConfigError` (exit 2); anywhere else a ValueError or TypeError is a bug, and raises."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from e


def data_facts(cfg: RunConfig, data: Any) -> Facts:
    """The facts of a simulation's :class:`~fedxrisk.data.FederatedData` (every client in this process)."""
    from fedxrisk.engines.privacy.validation import class_mass

    d, validation = data.data, None
    if data.val_shards is not None:
        y_val, shards = d.y_val.numpy(), list(data.val_shards)
        validation = lambda dp: class_mass(dp, y_val, shards)  # noqa: E731
    start = cfg.init_from is not None or (cfg.reset_head and cfg.pretrain is None)
    sizes = data.shard_sizes
    return Facts(
        tuple(d.input_shape), d.num_labels, d.pos_ratio, len(sizes), max(sizes), len(d.y_train), min(sizes),
        validation, bool(start), tuple(sizes),
    )  # fmt: skip


def with_data_lr(cfg: RunConfig, pos_ratio: Any) -> RunConfig:
    """``cfg`` with the step size fixed: an algorithm whose default depends on the data's positive ratio
    (CODA family, ``default_lr_for``) gets it written into the config, with a warning that it is untuned."""
    if cfg.lr is not None or not isinstance(pos_ratio, float):
        return cfg
    cls = ALGORITHMS[cfg.algorithm]
    lr = cls.default_lr_for(pos_ratio)
    if lr == cls.default_lr:
        return cfg
    warnings.warn(
        f"lr not set: {cfg.algorithm}'s default {cls.default_lr:g} lowered to {lr:.3g} for the positive "
        f"ratio {pos_ratio:.3f} (lr·p(1 − p) kept at its p = 0.1 value); untuned, see `fedxrisk tune`",
        stacklevel=2,
    )
    return dataclasses.replace(cfg, lr=lr)


def assemble_model(cfg: RunConfig, facts: Facts, normalize: Any = None) -> Any:
    """The model every party starts from: the registered ``model.name`` drawn from the seed, for
    the facts' input shape and labels (``normalize``: the per-channel input normalization)."""
    with users_error():  # a model that does not take this data's inputs
        return build_model(cfg.model, facts.input_shape, cfg.seed, facts.num_labels, normalize)


def saved_model(name: str, input_shape: tuple[int, ...], num_labels: int, normalize: Any = None) -> Any:
    """The network of a saved ``model.pt`` from its record (name, input shape, labels, input
    normalization), before its weights are loaded (``evaluate``, ``predict``)."""
    return build_model(name, tuple(input_shape), 0, num_labels, normalize)


def scoring_problem(model: Any, num_labels: int, device: str, eval_batch_size: int | None) -> Problem:
    """The problem ``evaluate`` and ``predict`` score a finished run's model with (no training: the
    positive ratio is not used)."""
    return Problem(model.to(device), 0.5, num_labels=num_labels, eval_batch_size=eval_batch_size)


def assemble(
    cfg: RunConfig,
    facts: Facts,
    model: Any,
    batch_size: int | None = None,
    eval_batch_size: int | None = None,
    privacy_ledger: list[dict[str, Any]] | None = None,
) -> Assembly:
    """The parts of a run of the checked ``cfg`` on a party knowing ``facts``, around ``model``
    (its starting weights already loaded). ``batch_size``: the batch the engine draws (capped at
    the largest shard; default ``cfg.batch_size``); ``eval_batch_size``: evaluation chunks (how
    an engine runs, not what it computes); ``privacy_ledger``: the rounds a resumed run ran."""
    public = instance_pos_ratio(cfg)  # DP: the declared p, never counted from the sites (issue 40)
    pos_ratio = public if public is not None and isinstance(facts.pos_ratio, float) else facts.pos_ratio
    cfg = with_data_lr(cfg, pos_ratio)
    problem = Problem(
        model.to(cfg.device), pos_ratio, cfg.buffer_policy, cfg.pos_ratio_mode, facts.num_labels,
        eval_batch_size=eval_batch_size, personal=cfg.personal,
    )  # fmt: skip
    schedule = run_schedule(cfg)  # the one rule (run/rules.py)
    with users_error():  # hyperparameters that meet the model or the data
        algorithm = ALGORITHMS[cfg.algorithm](problem, **cfg.options)
        algorithm = class_aware_batches(algorithm, cfg.resolved_positives(), cfg.batch_size)
        algorithm.validate_schedule(schedule)  # a data-dependent default lr (with_data_lr) included
        client_dp = privacy = None
        if facts.train_samples is not None:  # the party that plans, clips and adds the noise
            algorithm, client_dp, privacy = plan_privacy(
                cfg, algorithm, facts, schedule, batch_size or cfg.batch_size, privacy_ledger
            )
        if cfg.server is not None:  # outermost: it acts on the (privatized) mean of w
            algorithm = with_server_optimizer(algorithm, ServerOptimizer(**cfg.server))
        participation = None
        if facts.shard_sizes is not None:  # data.clients_per_round against the number of clients
            seed = cfg.seed if cfg.participation_seed is None else cfg.participation_seed
            participation = participation_of(
                cfg.clients_per_round, facts.shard_sizes, seed, cfg.participation == "weighted"
            )
    return Assembly(cfg, algorithm.problem, algorithm, schedule, client_dp, privacy, participation)

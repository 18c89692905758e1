"""Build a run's parts from a checked config: data, model (and its starting weights), algorithm, engine.

Nothing here writes a file; :func:`build` raises :class:`ConfigError` before any
output exists.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.algorithms import ALGORITHMS, Algorithm
from fedxrisk.data import FederatedData, make_federated
from fedxrisk.data.preprocessing import normalization, value_range
from fedxrisk.engines import DistributedSimulation, Simulation
from fedxrisk.problem import Problem
from fedxrisk.run.assemble import assemble, assemble_model, data_facts, users_error, with_data_lr
from fedxrisk.run.checks import CheckedConfig, checked
from fedxrisk.run.privacy import PrivacyPlan, instance_noise
from fedxrisk.run.spec import RunConfig


@dataclass
class Setup:
    """The built pieces of a run, before any training."""

    config: RunConfig
    data: FederatedData
    problem: Problem
    algorithm: Algorithm
    simulation: Simulation
    stream: Any = None  # data.stream.StreamChoice for file datasets: streamed or not, and why
    init: dict[str, Any] | None = None  # where the weights came from (run.weights.load_weights)
    privacy: PrivacyPlan | None = None  # the DP guarantee ([privacy], run.privacy)


def open_training_data(cfg: RunConfig) -> tuple[Any, Any]:
    """What ``make_federated`` should read for the run ``cfg``: the
    dataset's name (bundled data, or ``data.stream = false``: read into memory as always),
    or a binarized dataset read lazily, either decoded into memory here (``auto`` within
    the budget) or left lazy to be streamed; and the choice made (``data.stream.StreamChoice``)."""
    from fedxrisk.data.checks import check_labeled, check_test_classes
    from fedxrisk.data.loading import load_dataset
    from fedxrisk.data.registry import FILE_DATASETS
    from fedxrisk.data.stream import BadFileError, StreamChoice, choose, default_workers, is_lazy, materialize
    from fedxrisk.data.stream_choice import parse_bytes
    from fedxrisk.data.types import binarize
    from fedxrisk.errors import DataFileError

    if cfg.dataset not in FILE_DATASETS:
        return cfg.dataset, StreamChoice(False, "a bundled dataset, held in memory")
    if cfg.stream is False:
        return cfg.dataset, StreamChoice(False, "data.stream = false: the files are decoded into memory")
    lazy = load_dataset(
        cfg.dataset, cfg.data_dir, lazy=True, image_size=cfg.image_size, on_missing=cfg.on_missing
    )
    workers = default_workers() if cfg.workers is None else cfg.workers
    budget = parse_bytes(cfg.memory_budget)
    choice = choose(cfg.stream, int(lazy.x_train.nbytes), budget, workers)
    choice.on_bad_file = cfg.on_bad_file
    if cfg.cache:  # decoded once into a memory-mapped file (data/cache.py)
        from fedxrisk.data.cache import use_cache

        choice.cache = use_cache(lazy, cfg.cache, workers)
    for split in ("train", "test", "val"):
        x, y = getattr(lazy, f"x_{split}"), getattr(lazy, f"y_{split}")
        if is_lazy(x):
            x.attach(y, workers=workers, on_bad_file=cfg.on_bad_file, bad_log=choice.bad_log)
            if not choice.streamed:
                try:
                    setattr(lazy, f"x_{split}", materialize(x).numpy())
                except BadFileError as e:  # before training: nothing to resume, so keep only what failed
                    raise DataFileError(e.detail) from None
    if choice.streamed and cfg.feature_shift:
        raise ValueError("data.feature_shift shifts inputs in memory; it cannot be combined with streaming "
                         "(set data.stream = false)")  # fmt: skip
    check_labeled(lazy, cfg.data_dir or cfg.dataset)  # what is in memory now; streamed inputs are not scanned
    data = binarize(lazy, cfg.positive_classes)
    check_test_classes(data, cfg.data_dir or cfg.dataset)
    for x, y in ((data.x_train, data.y_train), (data.x_test, data.y_test), (data.x_val, data.y_val)):
        if is_lazy(x):
            x.attach(y.numpy())  # binary labels: a replacement keeps the task's label
    return data, choice


def build_data(cfg: RunConfig) -> tuple[FederatedData, Any]:
    """The run's training shards and test set as training sees them (``fedxrisk evaluate`` too),
    and the streaming choice (``data.stream.StreamChoice``, None for bundled data); no stream attached."""
    from fedxrisk.data.validation import with_validation

    source, choice = open_training_data(cfg)
    data = make_federated(
        source, cfg.clients, cfg.partition, cfg.imratio, cfg.seed,
        cfg.positive_classes, cfg.dirichlet_alpha, cfg.allow_missing_class, cfg.data_dir,
        cfg.feature_shift, one_class_ok=not ALGORITHMS[cfg.algorithm].needs_both_classes,
        num_samples=cfg.num_samples, test_imratio=cfg.test_imratio, image_size=cfg.image_size,
        sources=cfg.sources, on_missing=cfg.on_missing,
    )  # fmt: skip
    per_record = (cfg.privacy or {}).get("level") == "instance"  # neighbouring datasets stay neighbours
    return with_validation(data, cfg.validation, cfg.seed, per_record), choice


def build(
    cfg: RunConfig | CheckedConfig,
    init: str | Path | dict[str, Any] | None = None,
    data_from: Setup | None = None,
    privacy_ledger: list[dict[str, Any]] | None = None,
) -> Setup:
    """Check (unless checked already) and build everything; :class:`ConfigError` before any output.

    Only the user's mistakes become :class:`ConfigError`: the config's (:func:`checked`) and those
    met where the settings meet the data, the model and the algorithm (:func:`users_error`); any
    other ValueError or TypeError is a bug and raises as itself.

    The model starts from ``init`` (a path, or a state dict in memory) if given, else from
    ``cfg.init_from`` (a two-stage config's ``init_from`` belongs to its first stage).
    ``data_from``: reuse the data (and stream) of an earlier build with the same data settings.
    ``privacy_ledger``: the DP ledger of the rounds a resumed or extended run already ran.
    """
    cfg = checked(cfg).config
    from fedxrisk.data.budget import chunking
    from fedxrisk.data.stream import attach_stream, eval_batch_size, parse_bytes

    if init is None and cfg.pretrain is None:
        init = cfg.init_from
    if data_from is not None:  # its stream restarts when the new Simulation starts
        data, choice = data_from.data, data_from.stream
    else:
        with users_error():  # the data settings meet the data: too few samples, no class, …
            data, choice = build_data(cfg)
            attach_stream(data, choice, cfg.device, cfg.batch_size)
    if cfg.augment != "none":  # training batches only; the padding is 1/8 of the image side
        from fedxrisk.data.augment import RandomCropFlip

        padding = max(1, data.data.input_shape[-1] // 8) if cfg.augment == "crop_flip" else 0
        data.augment = RandomCropFlip(padding=padding, seed=cfg.seed)
    batch_size = check_batch_size(cfg.batch_size, data.shard_sizes)  # capped at the largest shard
    facts = data_facts(cfg, data)
    record_contract(data.data)  # model.pt carries it: predict refuses inputs on another scale
    with users_error():  # data.normalize's mean and std against the image channels
        norm = normalization(cfg.normalize, data.data.input_shape[0])
    if norm is not None:  # stored with the model (data/preprocessing.py), applied by its input hook
        data.data.preprocessing = {**data.data.preprocessing, "normalize": norm}
    model = assemble_model(cfg, facts, norm)
    source = None
    if init is not None or (cfg.reset_head and cfg.pretrain is None):  # two stages: the 2nd loads
        from fedxrisk.run.weights import load_weights

        source = load_weights(model, cfg.model, init, cfg.reset_head)
    with users_error():  # data.memory_budget against the model's measured activations (data/budget.py)
        memory = plan_for_run(cfg, data, model, batch_size)
    if memory is not None and choice is not None:
        choice.memory = memory.summary()
    eval_batch = (
        memory.eval_batch
        if memory is not None
        else eval_batch_size(data.data.input_shape, parse_bytes(cfg.memory_budget), cfg.eval_batch_size)
    )
    parts = assemble(cfg, facts, model, batch_size, eval_batch, privacy_ledger)
    cfg, algorithm, schedule, client_dp, privacy, participation = (
        parts.config,
        parts.algorithm,
        parts.schedule,
        parts.client_dp,
        parts.privacy,
        parts.participation,
    )
    if cfg.engine == "distributed":
        sim: Simulation = DistributedSimulation(
            algorithm, data, schedule, batch_size, cfg.seed, cfg.device, cfg.clients_per_rank,
            cfg.dist_timeout, privacy=client_dp, noise=instance_noise(cfg), participation=participation,
        )  # fmt: skip
    else:
        sim = Simulation(
            algorithm, data, schedule, batch_size, cfg.seed, cfg.engine, cfg.device, privacy=client_dp,
            noise=instance_noise(cfg), engine_options=chunking(cfg.engine, memory, data.num_clients),
            participation=participation,
        )  # fmt: skip
    return Setup(cfg, data, algorithm.problem, algorithm, sim, choice, source, privacy)


def plan_for_run(cfg: RunConfig, fed: Any, model: torch.nn.Module, batch_size: int) -> Any:
    """The ``data.budget.MemoryPlan`` of the run ``cfg`` on ``fed`` (its
    ``FederatedData``, stream attached), or None where the budget does not reach: a CUDA or MPS
    device (activations live there) and the ``distributed`` engine (each rank its own process).
    Applies the plan's prefetch depth to the stream. A budget the user set is refused when it
    cannot hold one client's step (:class:`BudgetError`); the default one only warns, and the
    run keeps one client per step and one step prefetched."""
    from fedxrisk.data.budget import BATCHED_ENGINES, BudgetError, plan_memory
    from fedxrisk.data.stream_choice import eval_batch_size, parse_bytes

    if str(cfg.device) != "cpu" or cfg.engine == "distributed":
        return None
    stream = getattr(fed, "stream", None)
    workers = stream.workers if stream is not None else 0
    shape = tuple(fed.data.input_shape)
    args = (model, shape, parse_bytes(cfg.memory_budget), batch_size, fed.num_clients)
    kwargs = {
        "batched": cfg.engine in BATCHED_ENGINES,
        "workers": workers,
        "eval_setting": cfg.eval_batch_size,
    }
    try:
        plan = plan_memory(*args, **kwargs)
    except BudgetError as e:
        if cfg.memory_budget is not None:
            raise
        import warnings

        warnings.warn(f"{e} (the default budget, a quarter of the machine's RAM: continuing)", stacklevel=2)
        plan = plan_memory(*args[:2], 2**62, *args[3:], **kwargs)
        plan.clients_per_step, plan.prefetch, plan.budget = 1, min(1, workers), parse_bytes(None)
        plan.eval_batch = eval_batch_size(shape, plan.budget, cfg.eval_batch_size)
    if stream is not None:
        stream.prefetch = max(1, plan.prefetch)
    return plan


def run_lr(cfg: RunConfig) -> float:
    """The step size ``fedxrisk run`` trains ``cfg`` with: ``cfg.lr``, else the algorithm's default
    for the data's positive ratio (reads the data when the algorithm's default depends on it)."""
    cls = ALGORITHMS[cfg.algorithm]
    if cfg.lr is not None or cls.default_lr_for.__func__ is Algorithm.default_lr_for.__func__:
        return cfg.resolved_lr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the run itself warns
        return with_data_lr(cfg, build_data(checked(cfg).config)[0].data.pos_ratio).resolved_lr()


def check_batch_size(batch_size: int, shard_sizes: list[int]) -> int:
    """The batch size to train with: ``batch_size``, capped with a warning at the largest shard
    (a larger batch only repeats every sample); a warning too when it exceeds some shards."""
    largest, smallest = max(shard_sizes), min(shard_sizes)
    if batch_size > largest:
        warnings.warn(
            f"data.batch_size = {batch_size} exceeds every client's data (largest shard: {largest} "
            f"samples); training with batches of {largest}",
            stacklevel=2,
        )
        return largest
    if batch_size > smallest:
        small = sum(size < batch_size for size in shard_sizes)
        warnings.warn(
            f"data.batch_size = {batch_size} exceeds the data of {small} client(s) (smallest shard: "
            f"{smallest} samples): they repeat samples within a batch",
            stacklevel=2,
        )
    return batch_size


def record_contract(data: Any) -> None:
    """Complete ``data.preprocessing``, the input contract ``model.pt`` carries: the label names, the
    positive class, the site names, an image's channel order; and the training inputs' value range
    when its reader recorded none (an image set in [0, 1]: uint8 0–255 pixels given to ``predict``
    are then refused, not scored). Inputs taken as they are only: a reader that standardizes records
    its raw-space range itself (``data.readers.base.standardize``), as the model's inputs are not
    the user's."""
    from fedxrisk.data.types import positive_record

    prep = {**(data.preprocessing or {}), "label_names": [str(n) for n in data.label_names]}
    if getattr(data, "positive_classes", None):  # a binary task: which classes score 1
        prep["positive_class"] = positive_record(data)
    if data.source_names:
        prep["sites"] = [str(n) for n in data.source_names]
    shape = tuple(data.input_shape)
    if len(shape) == 3 and shape[0] in (1, 3) and shape[1] == shape[2]:  # images: decoded L or RGB
        prep.setdefault("channels", "L" if shape[0] == 1 else "RGB")
    data.preprocessing = prep
    x = data.x_train
    if "range" in prep or "mean" in prep or not isinstance(x, (np.ndarray, torch.Tensor)):
        return
    found = value_range(x.numpy() if isinstance(x, torch.Tensor) else x).get("range")
    if found is not None:
        data.preprocessing = {**prep, "range": found}

"""One experiment: config → data → algorithm → engine → ``history.csv`` and ``summary.json``.

A run folder holds ``config.toml`` (the resolved config, re-runnable with
``fedxrisk run --config``), ``history.csv`` (one row per evaluation),
``checkpoint.pt`` while the run is unfinished (every ``checkpoint_every``
rounds, written atomically; :func:`resume_experiment` continues from it), and
at the end ``summary.json`` and ``model.pt`` (the final global model).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.algorithms import ALGORITHMS, Algorithm, Schedule
from fedxrisk.classaware import owns_positives, use_class_aware_batches
from fedxrisk.data import DATASETS, PARTITIONS, FederatedData, make_federated
from fedxrisk.engines import ENGINE_NAMES, DistributedSimulation, NonFiniteLoss, Simulation
from fedxrisk.engines.distributed import check_launch, launched_rank
from fedxrisk.metrics import evaluate
from fedxrisk.models import MODELS, build_model
from fedxrisk.problem import BUFFER_POLICIES, POS_RATIO_MODES, Problem
from fedxrisk.runconfig import DEFAULT_LOCAL_STEPS, ConfigError, RunConfig  # noqa: F401  (re-exported)
from fedxrisk.validate import (
    check_batch_size,
    check_out_dir,
    read_checkpoint,
    refuse_run,
    validate_settings,
)

PAUC_KEYS = ("test_pauc30_norm", "test_pauc30_mcclish", "test_pauc50_norm", "test_pauc50_mcclish")
HISTORY_FIELDS = (
    "round", "step", "stage", "lr", "train_loss", "test_auroc", "test_ap", *PAUC_KEYS,
    "client_auroc_mean", "client_auroc_std", "bytes_up_per_client",
    "bytes_down_per_client", "wall_seconds",
)  # fmt: skip
CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = 1


def _choice(name: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; choose one of {sorted(allowed)}")


def validate(cfg: RunConfig) -> None:
    """Check every setting that can be checked without loading data."""
    _choice("algorithm", cfg.algorithm, ALGORITHMS)
    _choice("dataset", cfg.dataset, DATASETS)
    _choice("partition", cfg.partition, PARTITIONS)
    _choice("model", cfg.model, MODELS)
    _choice("engine", cfg.engine, ENGINE_NAMES)
    _choice("buffer_policy", cfg.buffer_policy, BUFFER_POLICIES)
    _choice("pos_ratio_mode", cfg.pos_ratio_mode, POS_RATIO_MODES)
    if cfg.imratio is not None and not 0.0 < cfg.imratio < 1.0:
        raise ConfigError(f"imratio must lie in (0, 1), got {cfg.imratio}")
    for name in ("clients", "rounds", "batch_size", "eval_every", "stages"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be ≥ 1, got {getattr(cfg, name)}")
    if cfg.lr is not None and cfg.lr <= 0:
        raise ConfigError(f"lr must be > 0, got {cfg.lr}")
    if cfg.checkpoint_every < 0:
        raise ConfigError(f"checkpoint_every must be ≥ 0 (0: no checkpoints), got {cfg.checkpoint_every}")
    _check_stream_settings(cfg)
    if cfg.dirichlet_alpha <= 0:
        raise ConfigError(f"dirichlet_alpha must be > 0, got {cfg.dirichlet_alpha}")
    steps = cfg.resolved_local_steps()
    fixed = ALGORITHMS[cfg.algorithm].fixed_window
    if fixed is not None and steps != fixed:
        raise ConfigError(
            f"{cfg.algorithm} communicates every {fixed} step(s); local_steps must be {fixed}, got {steps}"
        )
    validate_settings(cfg)
    _validate_batches(cfg)
    known = ALGORITHMS[cfg.algorithm].hyperparameters()
    unknown = sorted(set(cfg.options) - set(known))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown} for {cfg.algorithm}; allowed: {sorted(known)}")
    try:
        Schedule.build(cfg.rounds, steps, cfg.resolved_lr(), cfg.stages, cfg.lr_decay, cfg.window_growth)
        if cfg.engine == "distributed":
            check_launch(cfg.clients, cfg.clients_per_rank, cfg.dist_timeout)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if cfg.pretrain is not None:
        from fedxrisk.pipeline import check_pretrain

        check_pretrain(cfg)


def _check_stream_settings(cfg: RunConfig) -> None:
    from fedxrisk.data.stream import ON_BAD_FILE, STREAM_CHOICES, parse_bytes

    if cfg.stream not in STREAM_CHOICES or not isinstance(cfg.stream, (bool, str)):
        raise ConfigError(f'data.stream must be true, false or "auto", got {cfg.stream!r}')
    if cfg.workers is not None and cfg.workers < 0:
        raise ConfigError(f"data.workers must be ≥ 0 (0: decode in the training process), got {cfg.workers}")
    _choice("data.on_bad_file", cfg.on_bad_file, ON_BAD_FILE)
    try:
        parse_bytes(cfg.memory_budget)
    except ValueError as e:
        raise ConfigError(str(e)) from None


@dataclass
class Setup:
    """The built pieces of a run, before any training."""

    config: RunConfig
    data: FederatedData
    problem: Problem
    algorithm: Algorithm
    simulation: Simulation
    stream: Any = None  # data.stream.StreamChoice for file datasets: streamed or not, and why
    init: dict[str, Any] | None = None  # where the weights came from (init_from.load_weights)


def _validate_batches(cfg: RunConfig) -> None:
    """data.num_samples and class-aware batches (data.positives_per_batch), before any data."""
    from fedxrisk.data.datasets import SIZED_DATASETS

    if cfg.num_samples is not None and (cfg.dataset not in SIZED_DATASETS or cfg.num_samples < 100):
        raise ConfigError(
            f"num_samples sizes a generated dataset {list(SIZED_DATASETS)} and must be ≥ 100, "
            f"got {cfg.num_samples} for {cfg.dataset!r}"
        )
    p, cls = cfg.positives_per_batch, ALGORITHMS[cfg.algorithm]
    if "positives_per_batch" in cfg.options and not owns_positives(cls):
        raise ConfigError(
            f"positives_per_batch is a data setting for {cfg.algorithm}: use data.positives_per_batch "
            "(--set data.positives_per_batch=N); it works for every algorithm"
        )
    own = cfg.options.get("positives_per_batch")
    if p and own is not None and own != p:
        raise ConfigError(f"positives_per_batch = {p} but the {cfg.algorithm} option says {own}; set one")


def build_data(cfg: RunConfig) -> tuple[FederatedData, Any]:
    """The run's training shards and test set as training sees them (``fedxrisk evaluate`` too),
    and the streaming choice (``data.stream.StreamChoice``, None for bundled data); no stream attached."""
    from fedxrisk.data.stream import open_training_data

    source, choice = open_training_data(cfg)
    data = make_federated(
        source, cfg.clients, cfg.partition, cfg.imratio, cfg.seed,
        cfg.positive_classes, cfg.dirichlet_alpha, cfg.allow_missing_class, cfg.data_dir,
        cfg.feature_shift, one_class_ok=not ALGORITHMS[cfg.algorithm].needs_both_classes,
        num_samples=cfg.num_samples,
    )  # fmt: skip
    return data, choice


def build(
    cfg: RunConfig, init: str | Path | dict[str, Any] | None = None, data_from: Setup | None = None
) -> Setup:
    """Validate and build everything; raises :class:`ConfigError` before any output exists.

    The model starts from ``init`` (a path, or a state dict in memory) if given, else from
    ``cfg.init_from`` (a two-stage config's ``init_from`` belongs to its first stage).
    ``data_from``: reuse the data (and stream) of an earlier build with the same data settings.
    """
    validate(cfg)
    from fedxrisk.data.stream import attach_stream

    if init is None and cfg.pretrain is None:
        init = cfg.init_from
    try:
        if data_from is not None:  # its stream restarts when the new Simulation starts
            data, choice = data_from.data, data_from.stream
        else:
            data, choice = build_data(cfg)
            attach_stream(data, choice, cfg.device)
        batch_size = check_batch_size(cfg.batch_size, data.shard_sizes)  # capped at the largest shard
        labels = data.data.num_labels
        model = build_model(cfg.model, data.data.input_shape, cfg.seed, labels)
        source = None
        if init is not None or cfg.reset_head:
            from fedxrisk.init_from import load_weights

            source = load_weights(model, cfg.model, init, cfg.reset_head)
        problem = Problem(
            model.to(cfg.device), data.data.pos_ratio, cfg.buffer_policy, cfg.pos_ratio_mode, labels
        )
        algorithm = ALGORITHMS[cfg.algorithm](problem, **cfg.options)
        use_class_aware_batches(algorithm, cfg.positives_per_batch, cfg.batch_size)
        schedule = Schedule.build(
            cfg.rounds,
            cfg.resolved_local_steps(),
            cfg.resolved_lr(),
            cfg.stages,
            cfg.lr_decay,
            cfg.window_growth,
        )
        if cfg.engine == "distributed":
            sim: Simulation = DistributedSimulation(
                algorithm, data, schedule, batch_size, cfg.seed, cfg.device,
                cfg.clients_per_rank, cfg.dist_timeout,
            )  # fmt: skip
        else:
            sim = Simulation(algorithm, data, schedule, batch_size, cfg.seed, cfg.engine, cfg.device)
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from e
    return Setup(cfg, data, problem, algorithm, sim, choice, source)


def default_out_dir(cfg: RunConfig, root: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(root) / f"{stamp}-{cfg.algorithm}-{cfg.dataset}"


def _replace_atomic(path: Path, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write through a temporary file, fsync, and a rename: never a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, mode, **({"newline": ""} if "b" not in mode else {})) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON through a temporary file and a rename: never a half-written file."""
    text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    _replace_atomic(path, lambda f: f.write(text))


def _torch_safe(obj: Any) -> Any:
    """NumPy arrays/scalars → tensors/Python numbers, so checkpoints load with ``weights_only=True``."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _torch_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_torch_safe(v) for v in obj)
    return obj


def save_checkpoint(path: Path, obj: dict[str, Any]) -> None:
    """``torch.save`` through a temporary file and ``os.replace``: the old checkpoint survives a crash."""
    safe = _torch_safe(obj)
    _replace_atomic(path, lambda f: torch.save(safe, f), "wb")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint written by :func:`save_checkpoint` (tensors and plain Python only)."""
    ckpt = read_checkpoint(Path(path))
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path}: checkpoint format {ckpt.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    return ckpt


def json_safe(value: Any) -> Any:
    """NaN → None so summary.json stays standard JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


@dataclass
class RunResult:
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    out_dir: Path

    def table(self) -> Any:
        """The history as a pandas DataFrame, one row per evaluation (extra: ``fedxrisk[pandas]``)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError(
                'RunResult.table() needs pandas: pip install "fedxrisk[pandas]"; '
                "RunResult.history has the same rows as a list of dicts"
            ) from e
        return pd.DataFrame(self.history, columns=list(HISTORY_FIELDS))


Callback = Callable[[dict[str, Any], int, int], None]  # (row or {}, rounds done, total)


def run_experiment(
    cfg: RunConfig, out_dir: str | Path | None = None, callback: Callback | None = None
) -> RunResult:
    """Train, evaluating every ``eval_every`` rounds and at the end; write history and summary.

    The folder gets ``config.toml`` first, then ``history.csv`` row by row and a
    checkpoint every ``cfg.checkpoint_every`` rounds; a killed run continues with
    :func:`resume_experiment`. On a NaN/inf loss the run stops: the history written
    so far is kept, the summary records ``status: failed`` and the round, and
    :class:`NonFiniteLoss` is raised.
    """
    validate(cfg)
    out = Path(out_dir) if out_dir is not None else default_out_dir(cfg)
    if launched_rank() == 0:  # before the data is loaded: a bad --out fails fast
        check_out_dir(out)
    if cfg.pretrain is not None:
        from fedxrisk.pipeline import run_two_stage

        return run_two_stage(cfg, out, callback)
    setup = build(cfg)
    if setup.simulation.is_primary:  # distributed: only rank 0 writes
        start_run_folder(cfg, out)
    return _train(setup, out, callback, None)


def start_run_folder(cfg: RunConfig, out: Path) -> None:
    """Refuse a folder holding a run, else create it and write ``config.toml``."""
    refuse_run(out)
    out.mkdir(parents=True, exist_ok=True)
    _write_config(out, cfg)


def resume_experiment(
    run_dir: str | Path, callback: Callback | None = None, overrides: Sequence[str] = ()
) -> RunResult:
    """Continue a killed or failed run from its last checkpoint (or from the start if it had none yet).

    The final metrics equal those of an uninterrupted run bit for bit (same
    machine, engine and seed): the checkpoint holds every client's state and
    sampler RNG, the byte ledger, the history and the best row so far.
    ``history.csv`` is rewritten from the checkpoint, dropping rows evaluated
    after it; ``wall_seconds`` counts the time of the rounds kept. A run whose
    summary exists but whose ``model.pt`` does not (killed in between) is
    finished the same way. ``overrides`` (``algorithm.lr=…``, ``algorithm.lr_decay=…``)
    continue a run that failed on a NaN loss with smaller steps.
    """
    from fedxrisk.config import config_from_flat, load_config

    out = Path(run_dir)
    if not out.is_dir():
        raise ConfigError(f"{out} is not a run folder")
    if (out / "summary.json").exists():
        status = json.loads((out / "summary.json").read_text()).get("status")
        if status == "completed" and (out / "model.pt").exists():
            raise ConfigError(f"{out} already finished (status: {status}); nothing to resume")
    ckpt = load_checkpoint(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
    if ckpt is not None:
        cfg = config_from_flat(ckpt["config"])
    elif (out / "config.toml").exists():  # killed before its first checkpoint
        cfg = load_config(out / "config.toml")
    else:
        raise ConfigError(f"{out} holds neither {CHECKPOINT} nor config.toml: not a fedxrisk run folder")
    if overrides:
        cfg = resume_overrides(cfg, overrides)
        _write_config(out, cfg)
    if cfg.pretrain is not None:
        from fedxrisk.pipeline import resume_two_stage

        return resume_two_stage(cfg, out, ckpt, callback)
    setup = build(cfg)
    if ckpt is not None:
        setup.simulation.load_state_dict(ckpt["simulation"])
    return _train(setup, out, callback, ckpt)


RESUME_KEYS = ("algorithm.lr", "algorithm.lr_decay")


def resume_overrides(cfg: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """``cfg`` with ``--set`` overrides that a resumed run may take (the step size only)."""
    from fedxrisk.config import apply_override, config_from_sections, config_to_sections

    doc = config_to_sections(cfg)
    for text in overrides:
        name = text.split("=", 1)[0].strip()
        if name not in RESUME_KEYS:
            raise ConfigError(
                f"--resume takes --set {' or '.join(RESUME_KEYS)} only (to continue with smaller steps), got {name!r}"
            )
        apply_override(doc, text)
    return config_from_sections(doc)


def _write_config(out: Path, cfg: RunConfig) -> None:
    from fedxrisk.config import config_to_toml

    header = f"fedxrisk {cfg.algorithm} on {cfg.dataset}; re-run with: fedxrisk run --config config.toml"
    text = config_to_toml(cfg, header)
    _replace_atomic(out / "config.toml", lambda f: f.write(text))


def _tensorboard(out: Path, cfg: RunConfig, resumed_round: int) -> Any:
    """A SummaryWriter when asked for and installed, else None (silently)."""
    if not cfg.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(out / "tensorboard"), purge_step=resumed_round + 1 if resumed_round else None)


TB_SCALARS = ("test_auroc", "test_ap", "train_loss", "client_auroc_mean", "lr")


def _train(setup: Setup, out: Path, callback: Callback | None, ckpt: dict[str, Any] | None) -> RunResult:
    """The round loop. Under the distributed engine every rank trains and takes part in
    checkpoints (a collective); only the primary rank evaluates and writes files."""
    cfg, sim = setup.config, setup.simulation
    primary = sim.is_primary
    history: list[dict[str, Any]] = list(ckpt["history"]) if ckpt else []
    best: dict[str, Any] | None = ckpt["best"] if ckpt else None
    resumed: list[int] = [*ckpt["resumed_at"], sim.round] if ckpt else []
    earlier = ckpt["wall_seconds"] if ckpt else 0.0
    start = time.perf_counter()

    def elapsed() -> float:
        return earlier + time.perf_counter() - start

    def write_rows(f) -> None:
        writer = csv.DictWriter(f, fieldnames=HISTORY_FIELDS, extrasaction="ignore")  # per-label lists
        writer.writeheader()
        writer.writerows(history)

    if primary:
        _replace_atomic(out / "history.csv", write_rows)  # drops rows evaluated after the checkpoint
    total = len(sim.plans)
    if callback and sim.round:
        callback(history[-1] if history else {}, sim.round, total)
    tb = _tensorboard(out, cfg, sim.round) if primary else None
    if primary and setup.init is not None and ckpt is None:  # the starting weights' metrics
        history.append(_initial_row(setup))
        best = history[0]
        _replace_atomic(out / "history.csv", write_rows)
        if callback:
            callback(history[0], 0, total)
    failure: NonFiniteLoss | None = None
    with open(out / "history.csv" if primary else os.devnull, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=HISTORY_FIELDS, extrasaction="ignore")
        try:
            while not sim.done:
                plan = sim.run_round()
                row: dict[str, Any] = {}
                if primary and (sim.round % cfg.eval_every == 0 or sim.done):
                    row = _evaluate_row(setup, plan, elapsed())
                    writer.writerow(row)
                    f.flush()
                    history.append(row)
                    if best is None or _better(row["test_auroc"], best["test_auroc"]):
                        best = row
                    for key in TB_SCALARS if tb else ():
                        tb.add_scalar(key, row[key], row["round"])
                if cfg.checkpoint_every and sim.round % cfg.checkpoint_every == 0 and not sim.done:
                    simulation = sim.state_dict()  # collective under the distributed engine
                    state = {
                        "format": CHECKPOINT_FORMAT,
                        "config": cfg.to_dict(),
                        "simulation": simulation,
                        "history": history,
                        "best": best,
                        "wall_seconds": elapsed(),
                        "resumed_at": resumed,
                        "torch_version": str(torch.__version__),
                    }
                    if primary:
                        save_checkpoint(out / CHECKPOINT, state)
                if callback:
                    callback(row, sim.round, total)
        except NonFiniteLoss as e:
            failure = e
        finally:
            if tb:
                tb.close()
    summary = _summary(setup, history, best, elapsed(), failure)
    summary["resumed_at_rounds"] = resumed
    if primary and failure is None:
        _save_model(setup, out / "model.pt")  # before the summary: the summary commits the run
    if primary:
        write_json_atomic(out / "summary.json", summary)
    if failure is not None:
        raise failure
    if primary:
        (out / CHECKPOINT).unlink(missing_ok=True)
    return RunResult(summary, history, out)


def _save_model(setup: Setup, path: Path) -> None:
    params, buffers = setup.simulation.global_model()
    blob = {
        "model": setup.config.model,
        "input_shape": list(setup.data.data.input_shape),
        "num_labels": setup.problem.num_labels,
        "params": {k: v.detach().cpu() for k, v in params.items()},
        "buffers": {k: v.detach().cpu() for k, v in buffers.items()},
    }
    _replace_atomic(path, lambda f: torch.save(blob, f), "wb")


def load_model(run_dir: str | Path) -> torch.nn.Module:
    """The final global model of a finished run (``model.pt``), in eval mode."""
    blob = torch.load(Path(run_dir) / "model.pt", map_location="cpu", weights_only=True)
    model = build_model(blob["model"], tuple(blob["input_shape"]), 0, blob.get("num_labels", 1))
    model.load_state_dict({**blob["params"], **blob["buffers"]})
    return model.eval()


def _parse_cell(text: str) -> Any:
    if text == "":
        return math.nan
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def load_run(run_dir: str | Path) -> RunResult:
    """A saved run: ``summary.json`` (or, for an unfinished run, ``config.toml``) and ``history.csv``."""
    out = Path(run_dir)
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    elif (out / "config.toml").exists():
        from fedxrisk.config import flat_unchecked, read_config_file

        summary = {"status": "unfinished", "config": flat_unchecked(read_config_file(out / "config.toml"))}
    else:
        raise ConfigError(f"{out} is not a run folder (no summary.json or config.toml)")
    history = []
    if (out / "history.csv").exists():
        with open(out / "history.csv", newline="") as f:
            history = [{k: _parse_cell(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return RunResult(summary, history, out)


def _better(new: float, old: float) -> bool:
    return not math.isnan(new) and (math.isnan(old) or new > old)


def _initial_row(setup: Setup) -> dict[str, Any]:
    """Round 0: the metrics of the starting model, before any training step."""
    sim, first = setup.simulation, setup.simulation.plans[0]
    params, buffers = sim.global_model()
    metrics = evaluate(setup.problem, params, buffers, setup.data)
    return {
        "round": 0, "step": 0, "stage": first.stage, "lr": first.lr, "train_loss": math.nan, **metrics,
        "bytes_up_per_client": 0, "bytes_down_per_client": 0, "wall_seconds": 0.0,
    }  # fmt: skip


def _evaluate_row(setup: Setup, plan, wall: float) -> dict[str, Any]:
    sim = setup.simulation
    params, buffers = sim.global_model()
    metrics = evaluate(setup.problem, params, buffers, setup.data)
    return {
        "round": sim.round,
        "step": plan.first_step + plan.window,
        "stage": plan.stage,
        "lr": plan.lr,
        "train_loss": sim.train_loss(),
        **metrics,
        "bytes_up_per_client": sim.ledger.total_up,
        "bytes_down_per_client": sim.ledger.total_down,
        "wall_seconds": round(wall, 4),
    }


def _summary(setup: Setup, history, best, wall: float, failure: Exception | None) -> dict[str, Any]:
    cfg, sim = setup.config, setup.simulation
    final = history[-1] if history else {}
    keys = ("test_auroc", "test_ap", *PAUC_KEYS, "client_auroc_mean", "client_auroc_std", "round")
    return json_safe(
        {
            "status": "failed" if failure else "completed",
            "error": str(failure) if failure else None,
            "algorithm": cfg.algorithm,
            "dataset": cfg.dataset,
            "engine": cfg.engine,
            "num_clients": cfg.clients,
            "rounds": sim.round,
            "local_steps": cfg.resolved_local_steps(),
            "seed": cfg.seed,
            "final": {k: final.get(k, math.nan) for k in keys}
            | {k: final[k] for k in ("test_auroc_per_label", "test_ap_per_label") if k in final},
            "label_names": list(setup.data.data.label_names) or None,
            "best": {"test_auroc": best["test_auroc"], "round": best["round"], **_best_of(history, PAUC_KEYS)}
            if best
            else None,
            "communication": sim.ledger.summary(),
            "wall_seconds": round(wall, 3),
            "data": {
                "train_samples": len(setup.data.data.y_train),
                "train_pos_ratio": setup.data.data.pos_ratio,
                "test_samples": len(setup.data.data.y_test),
                "client_counts": setup.data.client_counts(),
                "stream": setup.stream.summary() if setup.stream is not None else None,
            },
            "hyperparameters": _hparams(setup.algorithm),
            **({"init": setup.init} if setup.init is not None else {}),
            "config": cfg.to_dict(),
            "torch_version": torch.__version__,
        }
    )


def _hparams(alg: Algorithm) -> dict[str, Any]:
    return {f.name: getattr(alg, f.name) for f in dataclasses.fields(alg) if f.name != "problem"}  # type: ignore[arg-type]


def _best_of(history, keys) -> dict[str, float]:
    """The best value of each metric over the evaluations (rounds may differ from best.round)."""
    values = {k: [r[k] for r in history if not math.isnan(r.get(k, math.nan))] for k in keys}
    return {k: max(v, default=math.nan) for k, v in values.items()}

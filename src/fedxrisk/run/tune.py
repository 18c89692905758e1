"""``fedxrisk tune``: hyperparameter search on the validation split with Optuna (the only importer of optuna).

Each trial is a normal run (:func:`fedxrisk.run.recipes.run_experiment`, the same function as
``fedxrisk run``) in ``TUNE/trials/NNNN``; its objective is the validation value of the run's
monitor metric (the selected model). Every evaluation reports that metric to Optuna through the
run's callback seam (:class:`PruneOnValidation`); the median pruner stops a trial that falls
below the median of earlier trials at the same round (the run ends there normally, its
``trial.json`` says ``pruned``). The first trial is the config as given (the defaults).

The study lives in a storage (default ``TUNE/study.journal``, Optuna's JournalStorage; or any
URL Optuna takes, e.g. ``sqlite:///study.db``), opened with ``load_if_exists``: rerunning the
command resumes, and several processes given the same ``--out`` and storage share one study
until ``trials`` trials are done in all. A trial left running by a killed process on this
machine (its pid is gone) is marked failed and its parameters run again first.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from fedxrisk.errors import ConfigError, OutputError
from fedxrisk.outfiles import DISK_ERRORS, refuse_symlink, replace_atomic
from fedxrisk.run.callbacks import Callback, LoopState
from fedxrisk.run.rules import tune_under_privacy
from fedxrisk.run.spec import RunConfig
from fedxrisk.run.tuneout import (
    TrialRecord,
    best_record,
    check_tune_dir,
    read_marker,
    start_tune_dir,
    write_best,
    write_trial_json,
    write_trials_csv,
)
from fedxrisk.run.tunespace import Param, apply_params, check_grid, check_space, default_params, tune_config

HOST = socket.gethostname()


def require_optuna() -> Any:
    """The optuna module, or one clear line on how to install it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("fedxrisk tune needs Optuna: pip install 'fedxrisk[tune]'") from None
    if optuna.logging.get_verbosity() < optuna.logging.WARNING:  # `tune -q` raised it to ERROR: kept
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass
class TuneSettings:
    """How to search: ``trials`` in all (over every process), ``timeout`` seconds for this process."""

    trials: int = 20
    timeout: float | None = None
    sampler: str = "tpe"  # tpe | grid
    grid_points: int = 4
    seed: int = 0
    storage: str | None = None  # None: TUNE/study.journal
    prune: bool = True
    study_name: str | None = None
    monitor: str | None = None  # None: the run's own (RunConfig.resolved_monitor)


def validation_value(summary: dict[str, Any], history: list[dict[str, Any]], monitor: str) -> float:
    """The monitor's validation value of the selected model (``summary['selected']``)."""
    selected = summary.get("selected") or {}
    if selected.get("monitor") == monitor and isinstance(selected.get("value"), (int, float)):
        return float(selected["value"])
    values = [r[monitor] for r in history if isinstance(r.get(monitor), float) and r.get("round", 1) > 0]
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else math.nan


class PruneOnValidation(Callback):
    """Reports the monitor at every evaluation (step = round); stops the run when the pruner says so."""

    def __init__(self, trial: Any, monitor: str, prune: bool) -> None:
        self.trial, self.monitor, self.prune = trial, monitor, prune
        self.pruned_at: int | None = None

    def on_evaluation(self, row: dict[str, Any], state: LoopState) -> None:
        value = row.get(self.monitor)
        if row["round"] == 0 or value is None or math.isnan(value):
            return
        self.trial.report(float(value), row["round"])
        if self.prune and self.trial.should_prune():
            self.pruned_at = row["round"]
            state.should_stop = True


STORAGE_SCHEMES = ("sqlite:///", "postgresql://", "postgresql+", "mysql://", "mysql+")


def _storage(optuna: Any, url: str | None, out: Path) -> Any:
    """The study's storage: ``TUNE/study.journal`` or a database URL; any failure to open it is one line."""
    if url is None:
        from optuna.storages.journal import JournalFileBackend

        where: str = str(out / "study.journal")
        make = lambda: optuna.storages.JournalStorage(JournalFileBackend(where))  # noqa: E731
    elif url.startswith(STORAGE_SCHEMES):
        where = url
        make = lambda: optuna.storages.RDBStorage(url)  # noqa: E731
    else:
        raise ConfigError(
            f"--storage {url!r}: expected a database URL (sqlite:///FILE, postgresql://…, mysql://…), "
            "or no --storage for TUNE/study.journal"
        )
    try:
        return make()
    except Exception as e:  # a missing driver, an unreachable server, a damaged file: every one in one line
        raise ConfigError(f"cannot open the study storage {where}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def open_study(optuna: Any, storage: Any, settings: TuneSettings, out: Path, name: str, pruner: Any) -> Any:
    """The study ``name`` (created or resumed); a damaged journal or database is one line."""
    if storage is None:
        storage = _storage(optuna, None, out)
    try:
        return optuna.create_study(
            storage=storage, study_name=name, direction="maximize", pruner=pruner, load_if_exists=True
        )
    except Exception as e:
        where = settings.storage or out / "study.journal"
        raise ConfigError(
            f"cannot read the study {name!r} in {where} ({_first_line(e)}); restore it or choose another --out"
        ) from None


def _sampler(optuna: Any, settings: TuneSettings, space: dict[str, Param], done: int) -> Any:
    if settings.sampler == "grid":
        grid = {name: p.grid(settings.grid_points) for name, p in space.items()}
        return optuna.samplers.GridSampler(grid, seed=settings.seed)
    if settings.sampler != "tpe":
        raise ConfigError(f"--sampler must be tpe or grid, got {settings.sampler!r}")
    return optuna.samplers.TPESampler(seed=settings.seed + done)  # a resumed search continues, not repeats


def _counts(t: Any, optuna: Any) -> bool:
    """Whether a trial uses up the budget: run, running or queued, or failed on a NaN loss."""
    S = optuna.trial.TrialState
    if t.user_attrs.get("skipped"):
        return False
    return (
        t.state in (S.COMPLETE, S.PRUNED, S.RUNNING, S.WAITING) or t.user_attrs.get("outcome") == "nonfinite"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rerun_dead_trials(optuna: Any, study: Any) -> None:
    """Trials left RUNNING by a killed process on this machine: failed, their parameters queued again."""
    S = optuna.trial.TrialState
    for t in study.get_trials(deepcopy=False, states=(S.RUNNING,)):
        pid = t.user_attrs.get("pid")
        if t.user_attrs.get("host") != HOST or pid is None or _alive(pid):
            continue
        try:
            study._storage.set_trial_state_values(t._trial_id, state=S.FAIL)
        except Exception:  # another process got there first
            continue
        study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})


def _record(t: Any, optuna: Any) -> TrialRecord:
    S = optuna.trial.TrialState
    names = {
        S.COMPLETE: "complete",
        S.PRUNED: "pruned",
        S.FAIL: "failed",
        S.RUNNING: "running",
        S.WAITING: "waiting",
    }
    note = t.user_attrs.get("outcome", "")
    if note == "nonfinite":
        note = "non-finite loss"
    if t.state == S.FAIL and not note:
        note = "killed" if t.user_attrs.get("pid") else "error"
    rnd = t.user_attrs.get("pruned_at")
    return TrialRecord(t.number, names.get(t.state, str(t.state)), t.value, dict(t.params),
                       t.user_attrs.get("folder", ""), rnd, note)  # fmt: skip


def study_name(cfg: RunConfig) -> str:
    return f"fedxrisk-{cfg.algorithm}-{cfg.dataset}"


def tune(
    cfg: RunConfig,
    out: str | Path,
    space: dict[str, Param],
    settings: TuneSettings,
    report: Callable[[str], None] = lambda s: None,
    progress: Callable[[int, dict[str, Any], int, int, str], None] | None = None,
) -> list[TrialRecord]:
    """Search ``space`` for ``cfg.algorithm`` until ``settings.trials`` trials are done; write the outputs;
    ``report``: one line per finished trial; ``progress(trial, row or {}, round, rounds, monitor)``:
    every round of the running trial (``row``: its evaluation, {} when the round was not evaluated)."""
    optuna = require_optuna()
    from fedxrisk.engines import NonFiniteLoss
    from fedxrisk.run.recipes import run_experiment

    out = Path(out)
    base = tune_config(cfg, settings.monitor)
    from fedxrisk.run.checks import checked

    tune_under_privacy(base)  # trials under DP: their composition is not accounted
    checked(base)  # a bad base config (or monitor) fails here, not in every trial
    check_space(base, space)
    check_grid(space, settings.sampler, settings.grid_points)
    monitor = base.resolved_monitor()
    name = settings.study_name or study_name(cfg)
    info = {"algorithm": cfg.algorithm, "study": name, "dataset": cfg.dataset, "monitor": monitor, "trials": settings.trials,
            "sampler": settings.sampler, "seed": settings.seed, "storage": settings.storage,
            "space": {k: dataclasses.asdict(p) for k, p in space.items()}}  # fmt: skip
    check_tune_dir(out, info)
    storage = None if settings.storage is None else _storage(optuna, settings.storage, out)  # before writing
    start_tune_dir(out, info)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=max(1, base.rounds // 5))
    study = open_study(optuna, storage, settings, out, name, pruner)
    _rerun_dead_trials(optuna, study)
    if not study.trials:
        from fedxrisk.run.build import run_lr  # trial 0 = what `fedxrisk run` would train with

        lr = run_lr(base) if "lr" in space else None
        study.enqueue_trial(
            default_params(base, space, lr), user_attrs={"default": True}, skip_if_exists=True
        )
    study.sampler = _sampler(optuna, settings, space, len(study.trials))

    def objective(trial: Any) -> float:
        before = [
            t for t in study.get_trials(deepcopy=False) if t.number < trial.number and _counts(t, optuna)
        ]
        if len(before) >= settings.trials:  # another process took the last trial meanwhile
            trial.set_user_attr("skipped", True)
            raise optuna.TrialPruned()
        trial.set_user_attr("host", HOST)
        trial.set_user_attr("pid", os.getpid())
        params = {p.name: p.suggest(trial) for p in space.values()}
        folder = out / "trials" / f"{trial.number:04d}"
        refuse_symlink(folder)  # a planted link would send the trial's run outside the tune folder
        trial.set_user_attr("folder", str(folder.relative_to(out)))
        prune = PruneOnValidation(trial, monitor, settings.prune)
        record = TrialRecord(trial.number, "running", None, params, str(folder.relative_to(out)))
        try:
            shown = None if progress is None else partial(progress, trial.number, monitor=monitor)
            result = run_experiment(apply_params(base, params), folder, shown, callbacks=[prune])
        except OSError as e:  # a full or read-only disk stops the search; the trial says why
            if e.errno in DISK_ERRORS:
                trial.set_user_attr("outcome", f"disk: {e.strerror}")
            raise
        except OutputError as e:
            trial.set_user_attr("outcome", f"not written: {str(e)[:200]}")
            raise
        except NonFiniteLoss as e:
            trial.set_user_attr("outcome", "nonfinite")
            write_trial_json(
                folder, dataclasses.replace(record, state="failed", note=f"non-finite loss: {e}")
            )
            report(f"trial {trial.number}: non-finite loss ({params})")
            return math.nan  # Optuna records a failed trial
        value = validation_value(result.summary, result.history, monitor)
        if math.isnan(value):
            trial.set_user_attr("outcome", "nonfinite")
            write_trial_json(folder, dataclasses.replace(record, state="failed", note=f"no finite {monitor}"))
            return math.nan
        if prune.pruned_at is not None:
            trial.set_user_attr("pruned_at", prune.pruned_at)
            write_trial_json(
                folder, dataclasses.replace(record, state="pruned", value=value, round=prune.pruned_at)
            )
            report(f"trial {trial.number}: pruned at round {prune.pruned_at} ({monitor} {value:.4f})")
            raise optuna.TrialPruned()
        write_trial_json(folder, dataclasses.replace(record, state="complete", value=value))
        report(f"trial {trial.number}: {monitor} {value:.4f} ({params})")
        return value

    deadline = None if settings.timeout is None else time.monotonic() + settings.timeout

    def taken() -> int:  # queued trials are run by this loop: they do not end it
        waiting = optuna.trial.TrialState.WAITING
        return sum(_counts(t, optuna) and t.state != waiting for t in study.get_trials(deepcopy=False))

    while True:
        _rerun_dead_trials(optuna, study)  # another process on this study was killed meanwhile
        if taken() >= settings.trials:
            break
        if deadline is not None and time.monotonic() >= deadline:
            report(f"timeout: {settings.timeout:g} s reached")
            break
        if settings.sampler == "grid" and study.sampler.is_exhausted(study):
            break
        study.optimize(objective, n_trials=1, catch=(), gc_after_trial=False)
    return write_outputs(study, out, monitor)


def load_records(
    out: str | Path, storage: str | None = None, study_name: str | None = None
) -> list[TrialRecord]:
    """The trials of the study of a tune folder (for tests and reports)."""
    optuna = require_optuna()
    out = Path(out)
    info = read_marker(out)
    storage = storage or info.get("storage")
    study = optuna.load_study(study_name=study_name or info["study"], storage=_storage(optuna, storage, out))
    return [_record(t, optuna) for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("skipped")]


def write_outputs(study: Any, out: Path, monitor: str) -> list[TrialRecord]:
    """trials.csv, best_config.toml, best.json and the two plots, from the study as it stands;
    one process at a time (several processes on one study share the files and their ``.tmp``)."""
    optuna = require_optuna()
    with _one_writer(out):
        records = [
            _record(t, optuna) for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("skipped")
        ]
        write_trials_csv(out / "trials.csv", records)
        best = best_record(records)
        if best is not None:
            write_best(out, best, monitor)
        _plots(optuna, study, out)
    return records


@contextmanager
def _one_writer(out: Path) -> Iterator[None]:
    """An exclusive lock on the folder ``out`` (POSIX ``flock``; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _plots(optuna: Any, study: Any, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import warnings

    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib module experimental
        if done:
            _save(plt, ovm.plot_optimization_history(study).figure, out / "history.png")
        if len(done) >= 2 and len(done[0].params) >= 1:
            try:
                ax = ovm.plot_param_importances(study)
            except (RuntimeError, ValueError):  # e.g. every trial had the same parameters
                return
            _save(plt, ax.figure, out / "importances.png")


def _save(plt: Any, figure: Any, path: Path) -> None:
    """A PNG through a temporary file and a rename, never through a symbolic link."""
    try:
        replace_atomic(path, lambda f: figure.savefig(f, format="png", dpi=100, bbox_inches="tight"), "wb")
    finally:
        plt.close(figure)

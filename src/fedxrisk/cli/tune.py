"""``fedxrisk tune``: search an algorithm's hyperparameters on the validation split (Optuna)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, TextIO

import click
from rich.markup import escape

from fedxrisk.cli.common import (
    DEFAULTS,
    ConfigError,
    comma_list,
    config_errors,
    console,
    main,
    resolve,
    typed_flags,
    warnings_once,
    with_config_options,
)


def _imratio(text: str) -> float | str:
    """``--imratio``: a float, or ``none`` (kept as the word: the data's own positive ratio)."""
    if text.lower() == "none":
        return "none"
    try:
        return float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a number nor 'none'", param_hint="--imratio") from None


@main.command()
@with_config_options
@click.option(
    "--algorithm", "-a", default=DEFAULTS.algorithm, show_default=True, help="one, or several: a,b,c"
)
@click.option("--dataset", default=DEFAULTS.dataset, show_default=True)
@click.option("--data-dir", default=None, help="folder of a file dataset (see docs/data.md)")
@click.option("--clients", "-K", type=int, default=DEFAULTS.clients, show_default=True)
@click.option(
    "--imratio",
    default=None,
    callback=lambda ctx, param, v: v if v is None else _imratio(v),
    help="positive ratio kept in training data, or 'none' (default: as `fedxrisk run`)",
)
@click.option("--partition", default=DEFAULTS.partition, show_default=True)
@click.option("--model", default=DEFAULTS.model, show_default=True)
@click.option("--rounds", type=int, default=DEFAULTS.rounds, show_default=True)
@click.option("--eval-every", type=int, default=DEFAULTS.eval_every, show_default=True)
@click.option("--option", "-o", "options", multiple=True, help="algorithm hyperparameter KEY=VALUE (fixed)")
@click.option("--trials", type=int, default=20, show_default=True, help="trials in all (per algorithm)")
@click.option(
    "--timeout", type=float, default=None, help="seconds for this process (a started trial finishes)"
)
@click.option("--sampler", type=click.Choice(["tpe", "grid"]), default="tpe", show_default=True)
@click.option("--grid-points", type=int, default=4, show_default=True, help="grid: values per searched key")
@click.option(
    "--space",
    "spaces",
    multiple=True,
    metavar="KEY=LOW:HIGH[:log]|KEY=A,B",
    help="search KEY (bare, or SECTION.KEY as --set takes it: server.lr, model.personal, …) over "
    "LOW..HIGH (log-uniform with :log) or the choices A,B; replaces the default range (repeatable)",
)
@click.option("--storage", default=None, help="Optuna storage URL (default: TUNE/study.journal)")
@click.option("--study-name", default=None, help="study name in the storage (default fedxrisk-ALG-DATASET)")
@click.option("--seed", "search_seed", type=int, default=0, show_default=True, help="seed of the sampler")
@click.option("--monitor", default=None, help="validation column to maximise (default: the run's monitor)")
@click.option("--no-prune", is_flag=True, help="run every trial to its end")
@click.option("--confirm-seeds", default=None, metavar="S,S,…", help="rerun the best config on these seeds")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="tune folder (rerun to resume)")
@click.option("--quiet", "-q", is_flag=True, help="no per-trial lines or table")
def tune(
    config_file: str | None,
    overrides: tuple[str, ...],
    options: tuple[str, ...],
    trials: int,
    timeout: float | None,
    sampler: str,
    grid_points: int,
    spaces: tuple[str, ...],
    storage: str | None,
    study_name: str | None,
    search_seed: int,
    monitor: str | None,
    no_prune: bool,
    confirm_seeds: str | None,
    out: str,
    quiet: bool,
    **flags: Any,
) -> None:
    """Tune hyperparameters on the clients' validation split; each trial is a run in OUT/trials/NNNN.

    Writes trials.csv, best_config.toml (re-run with `fedxrisk run --config`), best.json and plots.
    """
    from fedxrisk.run.tuneconfirm import check_seeds
    from fedxrisk.run.tunespace import space_for

    given = typed_flags(click.get_current_context(), flags)
    with config_errors():
        names = [n for n in (given.pop("algorithm", None) or DEFAULTS.algorithm).split(",") if n.strip()]
        if trials < 1:
            raise ConfigError(f"--trials must be ≥ 1, got {trials}")
        if timeout is not None and not 0 < timeout < math.inf:
            raise ConfigError(f"--timeout must be a number of seconds > 0, got {timeout}")
        if grid_points < 1:
            raise ConfigError(f"--grid-points must be ≥ 1, got {grid_points}")
        if study_name is not None and not study_name.strip():
            raise ConfigError("--study-name is empty; name the study, or drop --study-name for the default")
        seeds = comma_list(confirm_seeds, int, "--confirm-seeds")
        check_seeds(seeds)
        jobs = []
        for name in names:
            jobs.append(_job(name.strip(), config_file, given, options, overrides, spaces))
        if len(jobs) > 1 and storage is not None and study_name is not None:
            raise ConfigError("--study-name names one study; drop it when tuning several algorithms")
        from fedxrisk.run.tune import TuneSettings, require_optuna
        from fedxrisk.run.tune import tune as run_tune
        from fedxrisk.run.tuneconfirm import confirm

        optuna = require_optuna()
        # -q: no per-trial lines, Optuna's own ("Trial 3 failed with value nan") included
        optuna.logging.set_verbosity(optuna.logging.ERROR if quiet else optuna.logging.WARNING)
        settings = TuneSettings(
            trials=trials,
            timeout=timeout,
            sampler=sampler,
            grid_points=grid_points,
            seed=search_seed,
            storage=storage,
            prune=not no_prune,
            study_name=study_name,
            monitor=monitor,
        )
        root = Path(out)
        shown = None if quiet else TrialProgress(sys.stderr)
        report = (lambda s: None) if quiet else (lambda s: (shown.end(), console.print(escape(s))))
        try:
            with warnings_once(quiet):  # a trial's warnings once per study, not once per trial
                for cfg, extra in jobs:
                    folder = root / cfg.algorithm if len(jobs) > 1 else root
                    space = space_for(cfg.algorithm, extra)
                    records = run_tune(cfg, folder, space, settings, report, progress=shown)
                    _show(folder, records, quiet)
                    if seeds and (folder / "best_config.toml").exists():
                        _confirmed(cfg.algorithm, confirm(folder / "best_config.toml", folder, seeds))
        except KeyboardInterrupt:
            console.print(f"interrupted; rerun the same command to resume the study in {out}")
            sys.exit(130)


class TrialProgress:
    """The running trial's round k/N and its latest validation value, on ``stream`` (stderr).

    On a terminal one line is redrawn every round; piped, one line per evaluation."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.live = stream, stream.isatty()
        self.trial, self.value, self.open = -1, "", False

    def __call__(self, trial: int, row: dict[str, Any], done: int, total: int, monitor: str) -> None:
        if trial != self.trial:
            self.trial, self.value = trial, ""
        value = row.get(monitor)
        if isinstance(value, float) and math.isfinite(value):
            self.value = f", {monitor} {value:.4f}"
        if not (self.live or row):
            return
        text = f"trial {trial}: round {done}/{total}{self.value}"
        self.stream.write(f"\r\x1b[K{text}" if self.live else f"{text}\n")
        self.open = self.live
        self.stream.flush()

    def end(self) -> None:
        """Close a redrawn line before another line is printed."""
        if self.open:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.open = False


def _confirmed(algorithm: str, result: dict[str, Any]) -> None:
    """The confirmation's mean ± std over the seeds that finished; one line per seed that did not."""
    if result["n"]:
        done = ",".join(result["by_seed"])
        click.echo(
            f"{algorithm}: best config on seeds {done}: "
            f"{result['metric']} {result['mean']:.4f} ± {result['std']:.4f}"
        )
    for seed, why in result["failed"].items():
        console.print(f"{algorithm}: seed {seed} not counted: {escape(why)}")


def _job(name, config_file, given, options, overrides, spaces):
    """The base config of one algorithm (its name as papers write it is accepted) and its --space list."""
    from fedxrisk.catalog import load
    from fedxrisk.run.configfile import config_from_sections
    from fedxrisk.run.names import resolve as resolve_name

    key = resolve_name(name, load()["algorithms"], "--algorithm")
    doc = resolve(config_file, {**given, "algorithm": key}, options, overrides)
    doc.setdefault("data", {}).setdefault("validation", "auto")  # tune selects on validation (docs/tune.md)
    cfg = config_from_sections(doc)
    return cfg, tuple(spaces)


def _show(folder: Path, records, quiet: bool) -> None:
    from rich.console import Console

    from fedxrisk.run.tuneout import best_record, table_rows
    from fedxrisk.tables import fit_table

    best = best_record(records)
    if quiet:
        click.echo(str(folder))
        return
    columns, rows = table_rows(records, best)
    Console().print(fit_table(f"trials of {folder}", columns, rows, Console().width))
    if best is None:
        Console().print("no trial completed")
        return
    Console().print(
        f"best: trial {best.number}, value {best.value:.4f}; "
        f"re-run with: fedxrisk run --config {folder / 'best_config.toml'}"
    )

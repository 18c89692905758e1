"""``fedxrisk`` command line: ``run`` an experiment, ``list`` what is available."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.data import DATASETS, PARTITIONS
from fedxrisk.engines import ENGINES, NonFiniteLoss
from fedxrisk.experiment import ConfigError, RunConfig, run_experiment
from fedxrisk.models import MODELS

console = Console(stderr=True)
DEFAULTS = RunConfig()


def _parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` with value parsed as int, float, bool, None or kept as a string."""
    if "=" not in text:
        raise click.BadParameter(f"expected KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return key.strip(), lowered == "true"
    if lowered in ("none", "null"):
        return key.strip(), None
    for cast in (int, float):
        try:
            return key.strip(), cast(raw)
        except ValueError:
            pass
    return key.strip(), raw


@click.group()
@click.version_option(package_name="fedxrisk")
def main() -> None:
    """Federated learning of AUC-type risks on imbalanced data."""


@main.command()
@click.option("--algorithm", default=DEFAULTS.algorithm, show_default=True, help="see `fedxrisk list`")
@click.option("--dataset", default=DEFAULTS.dataset, show_default=True)
@click.option("--clients", "-K", type=int, default=DEFAULTS.clients, show_default=True)
@click.option(
    "--imratio",
    type=float,
    default=DEFAULTS.imratio,
    show_default=True,
    help="positive ratio kept in training data",
)
@click.option("--partition", default=DEFAULTS.partition, show_default=True, help="iid | class | dirichlet")
@click.option("--dirichlet-alpha", type=float, default=DEFAULTS.dirichlet_alpha, show_default=True)
@click.option("--model", default=DEFAULTS.model, show_default=True)
@click.option("--rounds", type=int, default=DEFAULTS.rounds, show_default=True)
@click.option("--local-steps", "-I", type=int, default=None, help="window I (default 8; NPA: 1)")
@click.option("--batch-size", type=int, default=DEFAULTS.batch_size, show_default=True)
@click.option("--lr", type=float, default=None, help="step size (default: the algorithm's, see `fedxrisk list`)")
@click.option(
    "--stages", type=int, default=DEFAULTS.stages, show_default=True, help="lr ÷ lr-decay per stage"
)
@click.option("--lr-decay", type=float, default=DEFAULTS.lr_decay, show_default=True)
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True)
@click.option("--engine", default=DEFAULTS.engine, show_default=True, help="loop | vmap | compile | auto")
@click.option("--device", default=DEFAULTS.device, show_default=True)
@click.option("--eval-every", type=int, default=DEFAULTS.eval_every, show_default=True)
@click.option("--buffer-policy", default=DEFAULTS.buffer_policy, show_default=True, help="average | local")
@click.option(
    "--pos-ratio",
    "pos_ratio_mode",
    default=DEFAULTS.pos_ratio_mode,
    show_default=True,
    help="global | local | batch",
)
@click.option("--allow-missing-class", is_flag=True, help="train even if a client lacks a class")
@click.option(
    "--option", "-o", "options", multiple=True, help="algorithm hyperparameter KEY=VALUE (repeatable)"
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="output folder (default runs/<time>-<alg>-<data>)",
)
@click.option("--quiet", "-q", is_flag=True, help="no progress bar or summary table")
def run(options: tuple[str, ...], out: str | None, quiet: bool, **kwargs: Any) -> None:
    """Train one federated experiment; write summary.json and history.csv."""
    cfg = RunConfig(**kwargs, options=dict(_parse_option(o) for o in options))
    try:
        if quiet:
            result = run_experiment(cfg, out)
        else:
            with _progress() as progress:
                task = progress.add_task("training", total=None, auroc="   -  ")

                def update(row: dict[str, Any], done: int, total: int) -> None:
                    auroc = f"{row['test_auroc']:.4f}" if row else None
                    progress.update(task, completed=done, total=total, **({"auroc": auroc} if auroc else {}))

                result = run_experiment(cfg, out, update)
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
    except NonFiniteLoss as e:
        console.print(f"[red]error:[/red] {e}. History so far is kept in the output folder.")
        sys.exit(1)
    if not quiet:
        _print_summary(result.summary, result.out_dir)
    else:
        click.echo(str(result.out_dir))


def _progress() -> Progress:
    return Progress(
        TextColumn("round {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("test AUROC {task.fields[auroc]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


def _fmt(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def _print_summary(s: dict[str, Any], out: Any) -> None:
    table = Table(
        title=f"{s['algorithm']} on {s['dataset']}: K={s['num_clients']}, I={s['local_steps']}, {s['rounds']} rounds"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in s["final"].items():
        table.add_row(f"final {k}", _fmt(v))
    table.add_row("best test_auroc", f"{_fmt(s['best']['test_auroc'])} (round {s['best']['round']})")
    comm = s["communication"]
    table.add_row("bytes up / client", f"{comm['bytes_up_per_client']:,}")
    table.add_row("bytes down / client", f"{comm['bytes_down_per_client']:,}")
    table.add_row("wall seconds", _fmt(s["wall_seconds"]))
    Console().print(table)
    Console().print(f"written to [bold]{out}[/bold] (summary.json, history.csv)")


@main.command(name="list")
def list_() -> None:
    """Algorithms (with hyperparameters), datasets, partitions, models and engines."""
    table = Table(title="algorithms")
    table.add_column("name")
    table.add_column("communicates")
    table.add_column("hyperparameters (defaults)")
    for name, cls in ALGORITHMS.items():
        hp = ", ".join(f"{k}={v}" for k, v in cls.hyperparameters().items())
        table.add_row(name, ", ".join(cls.communicates), hp)
    out = Console()
    out.print(table)
    out.print("datasets:   " + ", ".join(DATASETS))
    out.print("partitions: " + ", ".join(PARTITIONS))
    out.print("models:     " + ", ".join(MODELS))
    out.print("engines:    " + ", ".join(ENGINES))


if __name__ == "__main__":
    main()

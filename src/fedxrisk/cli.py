"""``fedxrisk`` command line: ``run`` (or resume) an experiment, ``compare`` settings, ``plot`` runs, ``list``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column, Table

# Only torch-free modules here: `fedxrisk --help`, `fedxrisk list` and argument errors must not
# import torch (benchmarks/startup.py); commands import what they need when they run.
from fedxrisk.errors import ConfigError
from fedxrisk.run.spec import RunConfig

if TYPE_CHECKING:
    from fedxrisk.engines import NonFiniteLoss

console = Console(stderr=True)
DEFAULTS = RunConfig()


def _imratio(text: str | None) -> float | None:
    """``--imratio``: a float, or ``none`` to keep the data's own positive ratio."""
    if text is None or text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a number nor 'none'", param_hint="--imratio") from None


class BadConfig(click.ClickException):
    """One line on stderr (``Error: ...``) and exit status 2; nothing is written."""

    exit_code = 2


def non_finite_advice(e: NonFiniteLoss, folder: Path) -> str:
    """The NaN message, what was kept, and how to continue."""
    kept = f"{e}. History so far is kept in {folder}"
    if (folder / "checkpoint.pt").exists():
        return f"{kept}; continue from the last finite checkpoint with smaller steps: fedxrisk run --resume {folder} --set algorithm.lr=<lower>"
    return f"{kept}; no checkpoint was reached: start again with a lower --lr"


@contextmanager
def _config_errors() -> Iterator[None]:
    try:
        yield
    except ConfigError as e:
        raise BadConfig(str(e)) from None


def _parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` with value parsed as a TOML value (number, bool, list, "none") or kept as text."""
    from fedxrisk.run.configfile import parse_value

    if "=" not in text:
        raise ConfigError(f"--option expects KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    return key.strip(), parse_value(raw)


def _given(ctx: click.Context, flags: dict[str, Any]) -> dict[str, Any]:
    """The flags typed on the command line (not left at their defaults)."""
    return {k: v for k, v in flags.items() if ctx.get_parameter_source(k) is not ParameterSource.DEFAULT}


def _resolve(
    config_file: str | None, flags: dict[str, Any], options: tuple[str, ...], overrides: tuple[str, ...]
) -> dict[str, Any]:
    """Config file, then flags typed on the command line, then ``--option``, then ``--set``."""
    from fedxrisk.run.configfile import apply_override, read_config_file, section_of

    doc = read_config_file(config_file) if config_file else {}
    for key, value in flags.items():
        doc.setdefault(section_of(key), {})[key] = value
    for text in options:
        key, value = _parse_option(text)
        doc.setdefault("algorithm", {})[key] = value
    for text in overrides:
        apply_override(doc, text)
    return doc


CONFIG_OPTIONS = (
    click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="TOML config file (or a run's config.toml / summary.json)",
    ),
    click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help="override one config key, e.g. --set algorithm.lr=0.05 (repeatable; applied last)",
    ),
)


def _with_config_options(fn):
    for option in reversed(CONFIG_OPTIONS):
        fn = option(fn)
    return fn


@click.group()
@click.version_option(package_name="fedxrisk")
def main() -> None:
    """Federated learning of AUC-type risks on imbalanced data."""


@main.command()
@_with_config_options
@click.option(
    "--resume",
    type=click.Path(file_okay=False),
    default=None,
    help="continue a killed run from its folder (its own config; no other settings)",
)
@click.option("--algorithm", default=DEFAULTS.algorithm, show_default=True, help="see `fedxrisk list`")
@click.option("--dataset", default=DEFAULTS.dataset, show_default=True)
@click.option("--data-dir", default=None, help="folder of a file dataset (see docs/data.md)")
@click.option("--clients", "-K", type=int, default=DEFAULTS.clients, show_default=True)
@click.option(
    "--imratio",
    default=str(DEFAULTS.imratio),
    show_default=True,
    callback=lambda ctx, param, v: _imratio(v),
    help="positive ratio kept in training data; 'none' keeps the data's own (multi-label, natural sets)",
)
@click.option("--partition", default=DEFAULTS.partition, show_default=True, help="see `fedxrisk list`")
@click.option("--dirichlet-alpha", type=float, default=DEFAULTS.dirichlet_alpha, show_default=True)
@click.option("--model", default=DEFAULTS.model, show_default=True)
@click.option(
    "--init-from",
    default=None,
    metavar="PATH",
    help="start from a run folder's model.pt or a PyTorch state dict (two-stage: the first stage)",
)
@click.option("--reset-head", is_flag=True, help="re-initialise the classifier head after --init-from")
@click.option(
    "--pretrain-rounds",
    type=int,
    default=None,
    help="rounds of a cross-entropy [pretrain] stage before this run (same as --set pretrain.rounds=N)",
)
@click.option("--rounds", type=int, default=DEFAULTS.rounds, show_default=True)
@click.option("--local-steps", "-I", type=int, default=None, help="window I (default 8; NPA: 1)")
@click.option("--batch-size", type=int, default=DEFAULTS.batch_size, show_default=True)
@click.option(
    "--lr", type=float, default=None, help="step size (default: the algorithm's, see `fedxrisk list`)"
)
@click.option(
    "--stages", type=int, default=DEFAULTS.stages, show_default=True, help="lr ÷ lr-decay per stage"
)
@click.option("--lr-decay", type=float, default=DEFAULTS.lr_decay, show_default=True)
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True)
@click.option(
    "--engine", default=DEFAULTS.engine, show_default=True, help="loop | vmap | compile | auto | distributed"
)
@click.option(
    "--clients-per-rank",
    default=str(DEFAULTS.clients_per_rank),
    show_default=True,
    help="distributed: clients per rank (WORLD_SIZE × this = --clients), or 'auto'",
)
@click.option(
    "--dist-timeout",
    type=float,
    default=DEFAULTS.dist_timeout,
    show_default=True,
    help="distributed: seconds before a collective fails",
)
@click.option("--device", default=DEFAULTS.device, show_default=True)
@click.option("--eval-every", type=int, default=DEFAULTS.eval_every, show_default=True)
@click.option(
    "--checkpoint-every",
    type=int,
    default=DEFAULTS.checkpoint_every,
    show_default=True,
    help="rounds between checkpoints (0: none)",
)
@click.option("--buffer-policy", default=DEFAULTS.buffer_policy, show_default=True, help="average | local")
@click.option(
    "--pos-ratio",
    "pos_ratio_mode",
    default=DEFAULTS.pos_ratio_mode,
    show_default=True,
    help="global | local | batch",
)
@click.option("--allow-missing-class", is_flag=True, help="train even if a client lacks a class")
@click.option("--feature-shift", is_flag=True, help="FeDXL heterogeneity: per-client Gaussian feature shift")
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
def run(
    config_file: str | None,
    overrides: tuple[str, ...],
    resume: str | None,
    options: tuple[str, ...],
    out: str | None,
    quiet: bool,
    **flags: Any,
) -> None:
    """Train one federated experiment; write config.toml, history.csv, summary.json.

    Settings come from --config FILE, then the flags typed here, then --set.
    """
    from fedxrisk.engines import DistributedError, NonFiniteLoss
    from fedxrisk.engines.distributed import launched_rank
    from fedxrisk.run.configfile import config_from_sections
    from fedxrisk.run.folder import default_out_dir
    from fedxrisk.run.recipes import resume_experiment, run_experiment

    pretrain_rounds = flags.pop("pretrain_rounds")  # not a RunConfig field: a [pretrain] key
    given = _given(click.get_current_context(), flags)
    with _config_errors():
        if resume is not None:
            extra = [*given, *(["--config"] if config_file else [])]
            extra += [*(["--option"] if options else []), *(["--out"] if out else [])]
            extra += ["--pretrain-rounds"] if pretrain_rounds is not None else []
            if extra:
                raise ConfigError(
                    f"--resume continues a run with its own config; drop {', '.join(extra)} "
                    "(it takes only --set algorithm.lr=… / algorithm.lr_decay=…)"
                )
            folder = Path(resume)
            job = lambda callback: resume_experiment(folder, callback, overrides)
        else:
            if pretrain_rounds is not None:  # --set pretrain.rounds still wins
                overrides = (f"pretrain.rounds={pretrain_rounds}", *overrides)
            cfg = config_from_sections(_resolve(config_file, given, options, overrides))
            folder = Path(out) if out else default_out_dir(cfg)
            job = lambda callback: run_experiment(cfg, folder, callback)
        from fedxrisk.data.stream import BadFileError

        secondary = launched_rank() != 0  # under torchrun only rank 0 reports
        try:
            if quiet or secondary:
                result = job(None)
            else:
                with _progress() as progress:
                    result = job(_Bar(progress, "training"))
        except NonFiniteLoss as e:
            console.print(f"[red]error:[/red] {escape(non_finite_advice(e, folder))}", soft_wrap=True)
            sys.exit(1)
        except BadFileError as e:  # a corrupt file met while training: the checkpoint is kept
            console.print(
                f"[red]error:[/red] {escape(str(e).replace('RUN_DIR', str(folder)))}", soft_wrap=True
            )
            sys.exit(1)
        except DistributedError as e:
            console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
            sys.exit(1)
        except KeyboardInterrupt:
            console.print(f"interrupted; continue with: fedxrisk run --resume {folder}")
            sys.exit(130)
    if secondary:
        return
    if not quiet:
        _print_summary(result.summary, result.out_dir)
    else:
        click.echo(str(result.out_dir))


class _Bar:
    """A progress callback: one bar per run, showing the round, test AUROC and ETA.

    A bar appears with the first round reported, so a run that fails its checks, or that a
    comparison reads back finished, leaves no empty "round 0/None" line."""

    def __init__(self, progress: Progress, description: str = ""):
        self.progress = progress
        self.description, self.task = description, None

    def start(self, description: str) -> None:
        self.description, self.task = description, None

    def __call__(self, row: dict[str, Any], done: int, total: int) -> None:
        if self.task is None:
            if not self.progress.live.is_started:
                self.progress.start()
            self.task = self.progress.add_task(self.description, total=total, auroc="   -  ")
        auroc = f"{row['test_auroc']:.4f}" if row else None
        self.progress.update(self.task, completed=done, total=total, **({"auroc": auroc} if auroc else {}))


@contextmanager
def _progress() -> Iterator[Progress]:
    """Progress bars on stderr, drawn from the first bar on (see :class:`_Bar`).

    Lines stay two columns short of the terminal: the "^C" a terminal echoes after Ctrl-C then
    does not wrap the line, which left a second copy of it on screen."""
    width = max(20, console.width - 2)
    bar = max(5, min(40, width - 90))  # the columns after the label take 55 characters
    whole = lambda chars: Column(no_wrap=True, min_width=chars)  # numbers are never cut; a long label is
    progress = Progress(
        TextColumn(
            "{task.description}", table_column=Column(no_wrap=True, max_width=max(8, width - 56 - bar))
        ),
        TextColumn("round {task.completed}/{task.total}", table_column=whole(len("round 1000/1000"))),
        BarColumn(bar_width=bar),
        TextColumn("test AUROC {task.fields[auroc]}", table_column=whole(len("test AUROC 0.0000"))),
        TimeElapsedColumn(table_column=whole(7)),
        TextColumn("ETA", table_column=whole(3)),
        TimeRemainingColumn(table_column=whole(7)),
        console=Console(file=console.file, width=width, force_terminal=console.is_terminal or None),
    )
    try:
        yield progress
    finally:
        if progress.live.is_started:
            progress.stop()


def _fmt(x: Any) -> str:
    if isinstance(x, list):  # per-label metrics
        return ", ".join(map(_fmt, x))
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def _print_summary(s: dict[str, Any], out: Any) -> None:
    from fedxrisk.tables import fit_table

    title = f"{s['algorithm']} on {s['dataset']}: K={s['num_clients']}, I={s['local_steps']}, {s['rounds']} rounds"
    rows = [(f"final {k}", _fmt(v)) for k, v in s["final"].items()]
    rows.append(("best test_auroc", f"{_fmt(s['best']['test_auroc'])} (round {s['best']['round']})"))
    comm = s["communication"]
    rows.append(("bytes up / client", f"{comm['bytes_up_per_client']:,}"))
    rows.append(("bytes down / client", f"{comm['bytes_down_per_client']:,}"))
    rows.append(("wall seconds", _fmt(s["wall_seconds"])))
    Console().print(fit_table(title, ["metric", "value"], rows, Console().width))
    if s.get("init"):
        source = s["init"]["from"] or "a fresh model"
        Console().print(
            f"started from {source}"
            + (" (classifier head re-initialised)" if s["init"]["reset_head"] else "")
        )
    if s.get("resumed_at_rounds"):
        Console().print(f"resumed at round(s) {', '.join(map(str, s['resumed_at_rounds']))}")
    Console().print(f"written to [bold]{out}[/bold] (summary.json, history.csv, config.toml, model.pt)")


@main.command(name="list")
def list_() -> None:
    """Algorithms (with hyperparameters), datasets, partitions, models and engines."""
    from fedxrisk.catalog import load

    catalog = load()  # generated from the registries; no torch import
    table = Table(title="algorithms")
    table.add_column("name")
    table.add_column("communicates")
    table.add_column("hyperparameters (defaults)")
    for name, entry in catalog["algorithms"].items():
        hp = ", ".join(f"{k}={v}" for k, v in entry["hyperparameters"].items())
        table.add_row(name, ", ".join(entry["communicates"]), hp)
    out = Console()
    out.print(table)
    for key in ("datasets", "partitions", "models", "engines"):
        out.print(f"{key + ':':<11} " + ", ".join(catalog[key]))


def _comma_list(text: str | None, cast: type) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise ConfigError(f"expected a comma-separated list, got {text!r} ({e})") from None


@main.command()
@_with_config_options
@click.option("--algorithms", "-a", default=None, help="comma-separated, e.g. codasca,codaplus,localsgdm")
@click.option(
    "--vary",
    multiple=True,
    metavar="SECTION.KEY=V1,V2,...",
    help="one variant per value, e.g. --vary algorithm.local_steps=4,16 (repeatable: all combinations)",
)
@click.option("--seeds", default=None, help="comma-separated seeds, e.g. 0,1,2 (default: the config's seed)")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="output folder (default runs/compare-<time>); run again into it to continue",
)
@click.option("--quiet", "-q", is_flag=True, help="no progress bars or table")
def compare(
    config_file: str | None,
    overrides: tuple[str, ...],
    algorithms: str | None,
    vary: tuple[str, ...],
    seeds: str | None,
    out: str | None,
    quiet: bool,
) -> None:
    """Run several algorithms/settings on the same partition and seeds; table + plots.

    Writes comparison.csv, comparison.md, auroc_vs_rounds.png, auroc_vs_bytes.png,
    curves.csv, and one run folder per variant and seed.
    """
    from fedxrisk.compare import build_variants, display_rows, parse_vary, run_comparison
    from fedxrisk.tables import fit_table

    with _config_errors():
        base = _resolve(config_file, {}, (), overrides)
        varied = dict(parse_vary(v) for v in vary)
        variants = build_variants(base, _comma_list(algorithms, str), varied, _comma_list(seeds, int))
        folder = Path(out) if out else Path("runs") / f"compare-{datetime.now():%Y%m%d-%H%M%S}"
        if quiet:
            result = run_comparison(variants, folder)
        else:
            with _progress() as progress:
                bar = _Bar(progress)
                start = lambda label, seed, i, n: bar.start(f"[{i + 1}/{n}] {label} seed {seed}")
                result = run_comparison(variants, folder, bar, start)
    if quiet:
        click.echo(str(result.out_dir))
        return
    header, cells = display_rows(result.rows)
    title = f"comparison: {result.groups[0].label if len(result.groups) == 1 else 'variants'}"
    out = Console()
    out.print(fit_table(title, header, cells, out.width))
    names = ", ".join(p.name for p in result.files)
    Console().print(f"written to [bold]{result.out_dir}[/bold] ({names})")


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="where to write the PNGs (default: the run folder if one is given, else ./plots)",
)
def plot(run_dirs: tuple[str, ...], out: str | None) -> None:
    """Re-draw test AUROC vs rounds and vs bytes from saved runs (or compare folders)."""
    from fedxrisk.plots import plot_runs

    folder = out or (run_dirs[0] if len(run_dirs) == 1 else "plots")
    with _config_errors():
        files = plot_runs(run_dirs, folder)
    for path in files:
        click.echo(str(path))


@main.command(name="evaluate")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "--dataset", default=None, help="evaluate on this dataset's split instead of the run's test set"
)
@click.option("--data-dir", default=None, help="folder read by --dataset (see docs/data.md)")
@click.option("--split", default="test", show_default=True, help="--dataset: test | train (train has sites)")
@click.option(
    "--manifest", default=None, help="a labelled CSV manifest (path, labels[, source]) to evaluate on"
)
@click.option(
    "--bootstrap", type=int, default=1000, show_default=True, help="resamples for AP/pAUC intervals"
)
@click.option("--seed", type=int, default=0, show_default=True, help="bootstrap seed")
@click.option("--device", default="cpu", show_default=True)
@click.option("--batch-size", type=int, default=256, show_default=True, help="--manifest: images per batch")
@click.option("--workers", type=int, default=None, help="processes decoding files (default: half the cores)")
@click.option(
    "--out", type=click.Path(file_okay=False), default=None, help="output folder (default: RUN_DIR)"
)
@click.option("--overwrite", is_flag=True, help="replace evaluation files already in the output folder")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar or tables; print the evaluation.json path")
def evaluate_(run_dir: str, quiet: bool, **options: Any) -> None:
    """AUROC [DeLong 95% CI], AP and pAUC [bootstrap CIs] of a finished run, per label and client/site.

    Writes evaluation.json, evaluation.md, roc.png and pr.png (docs/cli.md).
    """
    from fedxrisk.data.readers import DataFileError
    from fedxrisk.evaluation import console_tables, evaluate

    with _config_errors():
        try:
            if quiet or options["manifest"] is None:
                result = evaluate(run_dir, **options)
            else:
                with _rows_progress("scoring") as bar:
                    result = evaluate(run_dir, progress=bar, **options)
        except DataFileError as e:
            raise BadConfig(str(e)) from None
    if quiet:
        click.echo(result["files"][0])
        return
    out = Console()
    for table in console_tables(result):
        out.print(table)
    out.print(f"written: {', '.join(result['files'])}")


@main.command(name="predict")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("input_path", metavar="INPUT", type=click.Path())
@click.option(
    "--out", type=click.Path(dir_okay=False), required=True, help="CSV to write (refused if it exists)"
)
@click.option("--scores", default="prob", show_default=True, help="prob (sigmoid) | logit | both")
@click.option("--batch-size", type=int, default=256, show_default=True)
@click.option("--workers", type=int, default=None, help="processes decoding images (default: half the cores)")
@click.option("--device", default="cpu", show_default=True)
@click.option("--overwrite", is_flag=True, help="replace --out if it exists")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def predict_(run_dir: str, input_path: str, quiet: bool, **options: Any) -> None:
    """Scores of a finished run's model for an image folder, a CSV manifest, an .npz or a tabular CSV.

    One row per input with its identifier, one column per label (docs/cli.md).
    """
    from fedxrisk.data.readers import DataFileError
    from fedxrisk.prediction import predict

    with _config_errors():
        try:
            if quiet:
                result = predict(run_dir, input_path, **options)
            else:
                with _rows_progress("scoring") as bar:
                    result = predict(run_dir, input_path, progress=bar, **options)
        except DataFileError as e:
            raise BadConfig(str(e)) from None
    if not quiet:
        console.print(f"{len(result.ids)} rows written to [bold]{escape(options['out'])}[/bold]")


@contextmanager
def _rows_progress(description: str) -> Iterator[Any]:
    """A progress bar over input rows; yields the ``(done, total)`` callback."""
    with Progress(
        TextColumn(description), BarColumn(), TextColumn("{task.completed}/{task.total} rows"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    ) as progress:  # fmt: skip
        tasks: list[Any] = []  # added at the first batch: a refused input shows no bar

        def update(done: int, total: int) -> None:
            if not tasks:
                tasks.append(progress.add_task(description, total=total))
            progress.update(tasks[0], completed=done, total=total)

        yield update


if __name__ == "__main__":
    main()

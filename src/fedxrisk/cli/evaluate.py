"""``fedxrisk evaluate``: metrics with confidence intervals of a finished run."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from fedxrisk.cli.common import BadConfig, config_errors, console, main
from fedxrisk.cli.progress import rows_progress
from fedxrisk.textsafe import printable


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
@click.option(
    "--against",
    type=click.Path(file_okay=False),
    default=None,
    help="a second run scored on the same patients: paired DeLong test (AUROC), paired bootstrap (AP, pAUC)",
)
@click.option(
    "--at-specificity", type=float, default=None, help="report sensitivity [CI] at this specificity"
)
@click.option(
    "--at-sensitivity", type=float, default=None, help="report specificity [CI] at this sensitivity"
)
@click.option(
    "--threshold-from",
    type=click.Choice(["test", "validation"]),
    default="test",
    show_default=True,
    help="operating points: choose the threshold on the evaluated data (in-sample) or on the run's "
    "validation data (then the test's sensitivity and specificity at it)",
)
@click.option(
    "--personal",
    is_flag=True,
    help="also each site's own model (site_<k>.pt of a personalized run) on that site's test rows",
)
@click.option(
    "--calibration",
    is_flag=True,
    help="Brier, ECE, reliability.png, temperature scaling fitted on the run's validation data",
)
@click.option(
    "--dp-epsilon",
    type=float,
    default=None,
    help="data with sites: also the pooled AUROC [CI] from one (ε, δ)-DP release of the pooled histogram",
)
@click.option("--dp-delta", type=float, default=1e-5, show_default=True, help="δ of --dp-epsilon")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar or tables; print the evaluation.json path")
def evaluate_(run_dir: str, quiet: bool, **options: Any) -> None:
    """AUROC [DeLong 95% CI], AP and pAUC [bootstrap CIs] of a finished run, per label and client/site.

    Writes evaluation.json, evaluation.md, roc.png and pr.png (+ reliability.png with --calibration;
    docs/cli.md, docs/evaluation.md).
    """
    from fedxrisk.data.readers import DataFileError
    from fedxrisk.evaluation import evaluate
    from fedxrisk.evaluation.clinic import markdown_lines as clinic_lines
    from fedxrisk.evaluation.personal import markdown_lines as personal_lines
    from fedxrisk.evaluation.report import console_tables

    with config_errors():
        try:
            if quiet or options["manifest"] is None:
                result = evaluate(run_dir, **options)
            else:
                with rows_progress("scoring") as bar:
                    result = evaluate(run_dir, progress=bar, **options)
        except DataFileError as e:
            raise BadConfig(str(e)) from None
    for warning in result["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)
    if quiet:
        click.echo(printable(result["files"][0]))
        return
    out = Console()
    if result.get("task") == "survival":
        from fedxrisk.evaluation.survival import markdown

        for line in markdown(result).splitlines():
            out.print(printable(line), markup=False)
        return
    for table in console_tables(result):
        out.print(table)
    for line in personal_lines(result) + clinic_lines(result):
        if line:
            out.print(printable(line.removeprefix("## ")), markup=False)
    out.print(printable(f"written: {', '.join(result['files'])}"), markup=False)


@main.command(name="cross-site")
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--dataset", default=None, help="evaluate on this dataset's split (default: the first run's test set)"
)
@click.option("--data-dir", default=None, help="folder read by --dataset")
@click.option("--split", default="test", show_default=True, help="--dataset: test | train (no validation)")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="output folder")
@click.option("--overwrite", is_flag=True, help="replace cross-site files already in --out")
@click.option("--device", default="cpu", show_default=True)
def cross_site_(runs: tuple[str, ...], **options: Any) -> None:
    """Every run's model at every site: AUROC [DeLong 95% CI] per cell, as a table and a heatmap.

    Typically the federated run first, then each site's local-only run. Writes cross_site.json,
    cross_site.md and cross_site.png into --out (docs/evaluation.md).
    """
    from fedxrisk.data.readers import DataFileError
    from fedxrisk.evaluation.cross import cross_site

    with config_errors():
        try:
            result = cross_site(list(runs), **options)
        except DataFileError as e:
            raise BadConfig(str(e)) from None
    from fedxrisk.evaluation.cross import markdown

    for line in markdown(result).splitlines():  # printable() escapes a newline: the table line by line
        click.echo(printable(line))
    click.echo(printable(f"written: {', '.join(result['files'])}"))

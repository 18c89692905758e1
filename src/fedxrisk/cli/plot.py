"""``fedxrisk plot``: re-draw the curves of saved runs."""

from __future__ import annotations

import click

from fedxrisk.cli.common import config_errors, main
from fedxrisk.textsafe import printable


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
    with config_errors():
        files = plot_runs(run_dirs, folder)
    for path in files:
        click.echo(printable(path))

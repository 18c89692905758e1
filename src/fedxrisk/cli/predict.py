"""``fedxrisk predict``: a finished run's scores for new inputs."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape

from fedxrisk.cli.common import BadConfig, config_errors, console, main
from fedxrisk.cli.progress import rows_progress
from fedxrisk.textsafe import printable


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

    with config_errors():
        try:
            if quiet:
                result = predict(run_dir, input_path, **options)
            else:
                with rows_progress("scoring") as bar:
                    result = predict(run_dir, input_path, progress=bar, **options)
        except DataFileError as e:
            raise BadConfig(str(e)) from None
    if not quiet:
        console.print(f"{len(result.ids)} rows written to [bold]{escape(printable(options['out']))}[/bold]")

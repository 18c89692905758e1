"""``fedxrisk compare``: several algorithms or settings on the same partition and seeds."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click
from rich.console import Console

from fedxrisk.cli.common import comma_list, config_errors, main, resolve, with_config_options
from fedxrisk.cli.progress import Bar, training_progress


@main.command()
@with_config_options
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

    with config_errors():
        base = resolve(config_file, {}, (), overrides)
        varied = dict(parse_vary(v) for v in vary)
        variants = build_variants(
            base, comma_list(algorithms, str, "--algorithms"), varied, comma_list(seeds, int, "--seeds")
        )
        folder = Path(out) if out else Path("runs") / f"compare-{datetime.now():%Y%m%d-%H%M%S}"
        if quiet:
            result = run_comparison(variants, folder)
        else:
            with training_progress() as progress:
                bar = Bar(progress)
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

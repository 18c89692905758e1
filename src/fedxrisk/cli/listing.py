"""``fedxrisk list``: what can be chosen, read from the committed catalogue (no torch)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fedxrisk.cli.common import main


@main.command(name="list")
def list_() -> None:
    """Algorithms (with hyperparameters), datasets, partitions, models and engines."""
    from fedxrisk.catalog import load

    catalog = load()  # generated from the registries; no torch import
    table = Table(title="algorithms")
    table.add_column("name")
    table.add_column("default lr", justify="right")
    table.add_column("communicates")
    table.add_column("hyperparameters (defaults)")
    table.add_column("task")
    for name, entry in catalog["algorithms"].items():
        hp = ", ".join(f"{k}={v}" for k, v in entry["hyperparameters"].items())
        window = f" (I = {entry['window']})" if entry["window"] else ""
        budget = entry.get("lr_pos_budget")
        scaled = f" (≤ {budget:g}/(p(1−p)))" if budget else ""
        table.add_row(
            name,
            f"{entry['default_lr']:g}{scaled}{window}",
            ", ".join(entry["communicates"]),
            hp,
            entry.get("task", "binary"),
        )
    out = Console()
    out.print(table)
    out.print(
        "default lr: the step size a run uses without --lr / algorithm.lr; ≤ B/(p(1−p)): lowered on data "
        "whose positive ratio p is far from 0.1 (lr·p(1−p) kept at B); I: a fixed window"
    )
    for key in ("datasets", "partitions", "models", "engines"):
        out.print(f"{key + ':':<11} " + ", ".join(catalog[key]))
    out.print(
        "task:      binary algorithms train on binary data; survival algorithms (Cox, C-index) on survival "
        f"datasets ({', '.join(catalog.get('survival_datasets', []))}): see docs/survival.md"
    )

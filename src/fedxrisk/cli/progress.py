"""Progress bars: one per training run (``run``, ``compare``), one over input rows (``evaluate``, ``predict``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from fedxrisk.cli.common import console


class Bar:
    """A progress callback: one bar per run, showing the round, test AUROC and ETA.

    A bar appears with the first round reported, so a run that fails its checks, or that a
    comparison reads back finished, leaves no empty "round 0/None" line. On a stream that is not a
    terminal (piped, a log file) nothing can be redrawn: a plain line every tenth of the run instead."""

    def __init__(self, progress: Progress, description: str = ""):
        self.progress = progress
        self.description, self.task, self.tenth = description, None, -1

    def start(self, description: str) -> None:
        self.description, self.task, self.tenth = description, None, -1

    def __call__(self, row: dict[str, Any], done: int, total: int) -> None:
        if not self.progress.console.is_terminal:
            tenth = 10 * done // max(total, 1)
            if row and tenth > self.tenth:
                self.tenth = tenth
                name, value = _headline(row)
                text = f"{self.description} round {done}/{total}, {name} {value:.4f}"
                self.progress.console.print(text.strip(), markup=False, highlight=False, soft_wrap=True)
            return
        if self.task is None:
            if not self.progress.live.is_started:
                self.progress.start()
            self.task = self.progress.add_task(self.description, total=total, auroc="   -  ")
        auroc = f"{_headline(row)[1]:.4f}" if row else None
        self.progress.update(self.task, completed=done, total=total, **({"auroc": auroc} if auroc else {}))


@contextmanager
def training_progress() -> Iterator[Progress]:
    """Progress bars on stderr, drawn from the first bar on (see :class:`Bar`).

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


@contextmanager
def rows_progress(description: str) -> Iterator[Any]:
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


def _headline(row: dict[str, Any]) -> tuple[str, float]:
    """The row's test metric: AUROC, or a survival run's C-index."""
    return ("test C-index", row["test_cindex"]) if "test_cindex" in row else ("test AUROC", row["test_auroc"])

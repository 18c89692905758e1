"""Terminal tables that fit the console (80 columns, pipes): values are never cut or split.

A cell ``mean ± std`` stays on one line while the table fits; when it does not,
the ``± std`` part goes to a second line of its cell, headers wrap at spaces,
and every value column gets exactly the width of its widest value (or header
word), so nothing is replaced by ``…``. The first column (labels) takes the
rest and wraps.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

PM = " ± "


def _widest(texts: Sequence[str], words: bool = False) -> int:
    parts = [p for t in texts for line in t.splitlines() for p in (line.split() if words else [line])]
    return max(map(len, parts), default=0)


def fit_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> Table:
    """A table of a text column (labels) and value columns that fits ``width`` whenever possible."""
    cells = [list(r) for r in rows]
    columns = [[name, *(r[i] for r in cells)] for i, name in enumerate(header)]
    frame = 3 * len(header) + 1  # "│ " and " " around each column, a closing "│"
    table = Table(title=title)
    if sum(_widest(col) for col in columns) + frame <= width:  # everything on one line
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i > 0)
    else:  # "mean\n± std" cells, headers wrapped, value columns as narrow as their values
        cells = [[c.replace(PM, "\n± ") if i else c for i, c in enumerate(r)] for r in cells]
        values = [
            max(_widest([r[i] for r in cells]), _widest([name], words=True)) for i, name in enumerate(header)
        ]
        rest = width - frame - sum(values[1:])
        label = max(_widest(columns[0], words=True), min(rest, _widest(columns[0])))
        table.add_column(header[0], width=label, overflow="fold")
        for i, name in enumerate(header[1:], start=1):
            table.add_column(name, justify="right", width=values[i])
    for r in cells:
        table.add_row(*r)
    return table

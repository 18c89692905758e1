"""What the three bad-input tables share (outputs_table.py, reliability_table.py, sites_table.py):
a message as one Markdown table cell, and the main that runs the cases or re-renders their JSON."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common.results import RESULTS, measured


def message_cell(message: str) -> str:
    """``message`` on one line as a code span that survives ``|`` and backticks inside it."""
    message = re.sub(r"\s+", " ", message).replace("|", "\\|")
    return f"`` {message} ``" if "`" in message else f"`{message}`"


def main(
    name: str, doc: str, run_all: Callable[[], list[dict[str, Any]]], render: Callable[[list], str]
) -> None:
    """Run every case on one torch thread (or, with ``--render-only``, read ``results/NAME.json``),
    then write ``results/NAME.md``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--render-only", action="store_true", help="re-render the table from the JSON")
    args = parser.parse_args()

    def measure() -> list[dict[str, Any]]:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(1)
        return run_all()

    rows = measured(RESULTS / f"{name}.json", measure, args.render_only, ensure_ascii=False)
    (RESULTS / f"{name}.md").write_text(render(rows))


def run_cases(run_case: Callable[[Any, Path, Path], dict], cases: Sequence[Any], runs: Path) -> list[dict]:
    """``run_case(case, tmp, runs)`` for each case in a fresh temporary folder; each row's class and
    message on stderr as it comes."""
    rows = []
    for case in cases:
        with tempfile.TemporaryDirectory() as d:
            rows.append(run_case(case, Path(d), runs))
        print(f"{rows[-1]['class']:>9}  {case.id}: {rows[-1]['message']}", file=sys.stderr)
    return rows


def in_fresh_runs(
    make_runs: Callable[[Path], Path], run_all: Callable[[Path], list[dict]]
) -> Callable[[], list[dict]]:
    """A table's whole run: its fixture runs made in a temporary folder, then every case against them."""

    def run() -> list[dict]:
        with tempfile.TemporaryDirectory() as d:
            return run_all(make_runs(Path(d)))

    return run

"""The evidence study's command: train the missing cells (``study.py``), then write the tables
(``report.py``), the figures (``plots.py``) and every doc region (``benchmarks/docs.py``).

    nice -n 5 python benchmarks/evidence/run.py            # the study (hours on one core)
    python benchmarks/evidence/run.py --render-only        # tables and figures from the JSON
    python benchmarks/evidence/run.py --verify REGIME      # rerun seed 0 bit for bit, then record

The options are ``study.py``'s (``--help``). Only this module imports both the study and its
report, so neither imports the other.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks import docs  # noqa: E402
from benchmarks.evidence import plots, report, study  # noqa: E402


def render(results: dict[str, Any]) -> None:
    """Tables (benchmarks/results/evidence*.md), figures, then every doc region (docs.py)."""
    for name in report.render(results):
        print(f"wrote benchmarks/results/{name}")
    plots.plot(results)
    for doc in docs.render():
        print(f"updated {doc.relative_to(study.ROOT)}")


def main(argv: list[str] | None = None) -> None:
    if study.main(argv):
        render(study.load_results())


if __name__ == "__main__":
    main()

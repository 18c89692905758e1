"""The real-data study's command: train the missing cells (``study.py``), then write the tables,
figures and doc regions (``report.py``).

    nice -n 10 python benchmarks/real_data/run.py --data ../shared/data   # the study (~30 min, 2 cores)
    python benchmarks/real_data/run.py --render-only                      # tables, figures, docs

The options are ``study.py``'s (``--help``). Only this module imports both the study and its
report, so neither imports the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.real_data import report, study  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    if study.main(argv):
        report.render(study.load_results())


if __name__ == "__main__":
    main()

"""The heterogeneous-sites study's command: train the missing cells (``study.py``), record their
source, then write the tables (``report.py``).

    nice -n 10 python benchmarks/heterogeneous/run.py --data ../shared/data --regimes heart
    python benchmarks/heterogeneous/run.py --render-only        # tables (docs: python benchmarks/docs.py)
    python benchmarks/heterogeneous/run.py --record-provenance  # the cells' source → provenance.json

The options are ``study.py``'s (``--help``). Only this module imports both the study and its
report, so neither imports the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.heterogeneous import report, study  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    if study.main(argv):
        report.render(study.load_results())


if __name__ == "__main__":
    main()

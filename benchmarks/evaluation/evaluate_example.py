"""docs/cli.md's `fedxrisk evaluate` printout: the default run, then `fedxrisk evaluate` on it.

Writes ``benchmarks/results/evaluate_example.json`` (the commands, the printout, the
evaluation.json numbers) and ``evaluate_example.md`` (the printout as a code block, the
temporary run folder shown as ``runs/quick``), which benchmarks/docs.py copies into
docs/cli.md.

    python benchmarks/evaluation/evaluate_example.py                # about 1 minute on 2 cores
    python benchmarks/evaluation/evaluate_example.py --render-only  # the .md from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.results import measured  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "benchmarks" / "results" / "evaluate_example.json"
SHOWN = "runs/quick"  # the folder name the doc's commands use


def fedxrisk(args: list[str], cwd: Path) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "120",  # one line per message, whatever the terminal
        "NO_COLOR": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "fedxrisk.cli", *args],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return proc.stdout


def measure() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        fedxrisk(["run", "-q", "--out", SHOWN], cwd=Path(tmp))  # run in tmp: the printout shows SHOWN
        printout = fedxrisk(["evaluate", SHOWN], cwd=Path(tmp))
        return {
            "commands": [f"fedxrisk run -q --out {SHOWN}", f"fedxrisk evaluate {SHOWN}"],
            "printout": printout,
            "evaluation": json.loads((Path(tmp) / SHOWN / "evaluation.json").read_text()),
        }


def render(raw: dict) -> None:
    body = "\n".join(line.rstrip() for line in raw["printout"].strip("\n").splitlines())
    RAW.with_suffix(".md").write_text(f"```\n{body}\n```\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--render-only", action="store_true", help="only re-render the .md from the JSON")
    args = p.parse_args()
    render(measured(RAW, measure, args.render_only))
    print(RAW.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()

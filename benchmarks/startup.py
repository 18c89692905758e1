"""Command-line start-up time: wall seconds of `fedxrisk --help`, `list` and an argument error.

Each command runs ``--runs`` times as a fresh ``python -m fedxrisk.cli``
process (median reported), against this tree's ``src`` and, with
``--baseline-rev REV``, against the ``src`` of an earlier commit (extracted
with ``git archive``), interleaved so both see the same machine load:

    python benchmarks/startup.py --baseline-rev 4e3c807 --runs 7
    python benchmarks/startup.py --render-only      # the table from the committed JSON

Writes ``benchmarks/results/startup.json`` and ``startup.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
COMMANDS = {  # shown name: (arguments, expected exit status)
    "fedxrisk --help": (["--help"], 0),
    "fedxrisk list": (["list"], 0),
    "fedxrisk run --help": (["run", "--help"], 0),
    "fedxrisk run --rounds x (argument error)": (["run", "--rounds", "x"], 2),
    "fedxrisk run --rounds 0 (config error)": (["run", "--rounds", "0"], 2),
}


def wall(src: Path, args: list[str], status: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fedxrisk.cli", *args], env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != status:  # time the command, not a crash
        raise SystemExit(f"{args} with {src}: exit {done.returncode}, expected {status}\n{done.stderr}")
    return seconds


def extract(rev: str, into: Path) -> Path:
    """``src`` of commit ``rev``, written below ``into``."""
    blob = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    archive = into / "src.tar"
    archive.write_bytes(blob)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def measure(runs: int, baseline_rev: str | None) -> dict:
    trees = {"now": ROOT / "src"}
    with tempfile.TemporaryDirectory() as tmp:
        if baseline_rev:
            trees[f"before ({baseline_rev})"] = extract(baseline_rev, Path(tmp))
        times: dict[str, dict[str, list[float]]] = {t: {c: [] for c in COMMANDS} for t in trees}
        for _ in range(runs):
            for command, (args, status) in COMMANDS.items():
                for tree, src in trees.items():
                    times[tree][command].append(wall(src, args, status))
    return {
        "runs": runs,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "median_seconds": {
            t: {c: round(statistics.median(v), 3) for c, v in d.items()} for t, d in times.items()
        },
    }


def render(result: dict) -> str:
    trees = list(result["median_seconds"])
    head = ["command", *(f"{t} (s)" for t in trees)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for command in COMMANDS:
        cells = [f"{result['median_seconds'][t][command]:.2f}" for t in trees]
        lines.append(f"| `{command}` | " + " | ".join(cells) + " |")
    note = f"Median wall time of {result['runs']} fresh processes, Python {result['python']}, {result['cpus']} CPUs."
    return "\n".join(lines) + f"\n\n{note}\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--baseline-rev", default=None, help="also time the src of this git revision")
    p.add_argument("--render-only", action="store_true", help="re-render startup.md from startup.json")
    args = p.parse_args()
    raw = RESULTS / "startup.json"
    if args.render_only:
        result = json.loads(raw.read_text())
    else:
        result = measure(args.runs, args.baseline_rev)
        raw.write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "startup.md").write_text(render(result))
    print((RESULTS / "startup.md").read_text())


if __name__ == "__main__":
    main()

"""Command-line start-up time: wall and CPU seconds of `fedxrisk --help`, `list`, argument and config errors.

Each command runs ``--runs`` times as a fresh ``python -m fedxrisk.cli``
process (median reported), against this tree's ``src`` and, with
``--baseline-rev REV``, against the ``src`` of an earlier commit (extracted
with ``git archive``), interleaved so both see the same machine load:

    python benchmarks/timing/startup.py --baseline-rev 4e3c807 --runs 7
    python benchmarks/timing/startup.py --render-only      # the table from the committed JSON

Writes ``benchmarks/results/startup.json`` and ``startup.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.results import measured  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
COMMANDS = {  # shown name: (arguments, expected exit status)
    "fedxrisk --help": (["--help"], 0),
    "fedxrisk list": (["list"], 0),
    "fedxrisk run --help": (["run", "--help"], 0),
    "fedxrisk run --rounds x (argument error)": (["run", "--rounds", "x"], 2),
    "fedxrisk run --rounds 0 (config error)": (["run", "--rounds", "0"], 2),
    "fedxrisk run --set algorithm.lr=abc (config error)": (["run", "--set", "algorithm.lr=abc"], 2),
    "fedxrisk run --dataset cifar10 (no data_dir)": (["run", "--dataset", "cifar10"], 2),
}


def wall(src: Path, args: list[str], status: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh process: CPU = user + system time of the child."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fedxrisk.cli", *args], env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != status:  # time the command, not a crash
        raise SystemExit(f"{args} with {src}: exit {done.returncode}, expected {status}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


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
        times: dict[str, dict[str, list[tuple[float, float]]]] = {t: {c: [] for c in COMMANDS} for t in trees}
        for _ in range(runs):
            for command, (args, status) in COMMANDS.items():
                for tree, src in trees.items():
                    times[tree][command].append(wall(src, args, status))
    median = lambda d, i: {c: round(statistics.median(x[i] for x in v), 3) for c, v in d.items()}
    return {
        "runs": runs,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),  # the machine's load when it finished
        "median_seconds": {t: median(d, 0) for t, d in times.items()},
        "median_cpu_seconds": {t: median(d, 1) for t, d in times.items()},
    }


def render(result: dict) -> str:
    trees = list(result["median_seconds"])
    cpu = result.get("median_cpu_seconds", {})  # older results: wall time only
    head = ["command", *(f"{t} (s)" for t in trees), *(f"{t} CPU (s)" for t in cpu)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for command in COMMANDS:
        cells = [f"{result['median_seconds'][t].get(command, math.nan):.2f}" for t in trees]
        cells += [f"{cpu[t].get(command, math.nan):.2f}" for t in cpu]
        lines.append(f"| `{command}` | " + " | ".join(cells) + " |")
    note = f"Median wall time of {result['runs']} fresh processes, Python {result['python']}, {result['cpus']} CPUs"
    if cpu:
        note += "; CPU: user + system seconds of the process"
    if "load_average_1min" in result:
        note += f"; 1-minute load average at the end: {result['load_average_1min']}"
    return "\n".join(lines) + f"\n\n{note}.\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--baseline-rev", default=None, help="also time the src of this git revision")
    p.add_argument("--render-only", action="store_true", help="re-render startup.md from startup.json")
    args = p.parse_args()
    result = measured(
        RESULTS / "startup.json", lambda: measure(args.runs, args.baseline_rev), args.render_only
    )
    (RESULTS / "startup.md").write_text(render(result))
    print((RESULTS / "startup.md").read_text())


if __name__ == "__main__":
    main()

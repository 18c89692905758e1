"""How long the quick test subset takes: the README's `python -m pytest -m "not slow"` sentence.

Runs the quick subset exactly as the README shows it (a fresh process from the repository root,
src on the path), timed by wall clock and by the CPU time of the process and its children, with
the machine's load average before and after (other work stretches the wall time, not the CPU
time), and writes ``benchmarks/results/test_time.json`` and ``test_time.md`` (one sentence,
which benchmarks/docs.py copies into README.md).

    python benchmarks/codebase/test_time.py                # about 3 minutes on an idle 2-core machine
    python benchmarks/codebase/test_time.py --render-only  # the .md from test_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RAW = RESULTS / "test_time.json"
# the three checks of the committed results themselves are left out: while this runs, its own
# result is not written yet, so they would fail on it (they run in the full suite and in CI)
SELF_CHECKS = (
    "tests/test_provenance.py::test_this_tree_passes_the_check",
    "tests/test_docs.py::test_every_generated_region_equals_its_results_file",
    "tests/test_reliability_frictions.py::test_every_results_file_the_readme_names_exists",
)
COMMAND = ["-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
           *(arg for test in SELF_CHECKS for arg in ("--deselect", test))]  # fmt: skip


def measure() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    load_before = os.getloadavg()[0]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run([sys.executable, *COMMAND], cwd=ROOT, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {
        word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", last)
    }
    # pytest-xdist's summary line leaves out the deselected count: the slow set is collected apart
    slow = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n0", "-m", "slow",
                           "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True)  # fmt: skip
    counts["slow"] = sum("::" in line for line in slow.stdout.splitlines())
    return {
        "exit": done.returncode,
        "summary": last,
        "counts": counts,
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
    }


def render(raw: dict) -> str:
    c = raw["counts"]
    minutes = lambda s: f"{int(s // 60)} min {int(round(s % 60))} s"  # noqa: E731
    return (
        f'`python -m pytest -m "not slow"` ran {c.get("passed", 0):,} tests ({c["slow"]} '
        f"slow ones left out; three checks of the committed results ran apart) in {minutes(raw['wall_seconds'])} of wall time and {minutes(raw['cpu_seconds'])} of CPU time "
        f"on a {raw['cpus']}-CPU machine, a pytest-xdist worker per CPU (load average {raw['load_before']:g} before, {raw['load_after']:g} after; "
        "other load stretches the wall time).\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--render-only", action="store_true")
    args = p.parse_args()
    if not args.render_only:
        raw = measure()
        if raw["exit"] != 0:
            sys.exit(f"the quick subset failed: {raw['summary']}")
        RAW.write_text(json.dumps(raw, indent=1) + "\n")
    (RESULTS / "test_time.md").write_text(render(json.loads(RAW.read_text())))
    print(RESULTS / "test_time.md")


if __name__ == "__main__":
    main()

"""The docs' quick numbers: the default `fedxrisk run` and docs/cli.md's three-algorithm comparison.

Runs the two commands exactly as the docs show them (as fresh processes,
timed by wall clock), then writes

- ``benchmarks/results/quick_docs.json``: the raw numbers (final metrics of
  every run, the comparison rows, wall seconds, the machine);
- ``quick_default.md`` (the default run's metrics), ``quick_default_time.md``
  (one sentence for the README), ``quick_compare.md`` (the comparison table
  and its time), which benchmarks/docs.py copies into README.md and docs/cli.md;
- ``docs/img/three_auroc_vs_rounds.png``, the comparison's plot.

    python benchmarks/defaults/quick_docs.py                # about 1 minute on 2 cores
    python benchmarks/defaults/quick_docs.py --render-only  # the .md files from quick_docs.json

``tests/test_docs.py`` re-runs the default run and one seed of the comparison
and checks them against ``quick_docs.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.results import measured  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RAW = RESULTS / "quick_docs.json"
FIGURE = ROOT / "docs" / "img" / "three_auroc_vs_rounds.png"
DEFAULT_RUN = ["run"]
COMPARE = ["compare", "-a", "codasca,codaplus,localsgdm", "--seeds", "0,1,2", "--set", "experiment.rounds=50"]
METRICS = ("test_auroc", "test_ap", "test_pauc30_norm", "client_auroc_mean")


def fedxrisk(args: list[str], out: Path) -> dict[str, float]:
    """Run ``fedxrisk ARGS --out OUT -q`` from the repository root; its wall and CPU seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    load = os.getloadavg()[0]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "fedxrisk.cli", *args, "--out", str(out), "-q"], env=env, check=True
    )
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    load = max(load, os.getloadavg()[0])  # runnable processes on the machine (1-minute average)
    return {"wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1), "load": round(load, 1)}


def _run_numbers(folder: Path) -> dict:
    s = json.loads((folder / "summary.json").read_text())
    return {
        "final": {k: s["final"][k] for k in METRICS},
        "bytes_up_per_client": s["communication"]["bytes_up_per_client"],
        "bytes_down_per_client": s["communication"]["bytes_down_per_client"],
        "train_seconds": s["wall_seconds"],
        "config": s["config"],
    }


def measure() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        default_time = fedxrisk(DEFAULT_RUN, Path(tmp) / "default")
        compare_time = fedxrisk(COMPARE, Path(tmp) / "three")
        three = Path(tmp) / "three"
        with open(three / "comparison.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        runs = {
            row["variant"]: {
                str(seed): _run_numbers(three / row["variant"] / f"seed{seed}")["final"] for seed in (0, 1, 2)
            }
            for row in rows
        }
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(three / "auroc_vs_rounds.png", FIGURE)
        return {
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
            },
            "default": {
                "command": "fedxrisk " + " ".join(DEFAULT_RUN),
                **default_time,
                **_run_numbers(Path(tmp) / "default"),
            },
            "compare": {
                "command": "fedxrisk " + " ".join(COMPARE),
                **compare_time,
                "rows": rows,
                "runs": runs,
            },
        }


def _number(text: str):
    if text == "":
        return float("nan")
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _load(timed: dict) -> str:
    """How busy the machine was: 'idle' only when nothing else ran (1-minute load below 1.5)."""
    load = timed.get("load")
    if load is None:
        return ", load not recorded"
    if load < 1.5:
        return f", otherwise idle (load average {load:g})"
    return f" shared with other jobs (load average up to {load:g})"


def render(raw: dict) -> None:
    from fedxrisk.compare import write_markdown

    d, c, cpus = raw["default"], raw["compare"], raw["machine"]["cpus"]
    lines = ["| metric | value |", "|---|---:|"]
    lines += [f"| final {k} | {v:.4f} |" for k, v in d["final"].items()]
    lines.append(f"| bytes up / client | {d['bytes_up_per_client']:,} |")
    lines.append(f"| bytes down / client | {d['bytes_down_per_client']:,} |")
    timing = (
        f"`{d['command']}` took {d['wall_seconds']:.0f} s of wall time and {d['cpu_seconds']:.0f} s of CPU time "
        f"on a {cpus}-CPU machine{_load(d)} ({d['train_seconds']:.0f} s in the training loop; the rest is "
        "start-up and data); wall time grows with other load on the machine."
    )
    (RESULTS / "quick_default.md").write_text("\n".join(lines) + f"\n\n{timing}\n")
    (RESULTS / "quick_default_time.md").write_text(timing + "\n")
    rows = [{k: _number(v) for k, v in row.items()} for row in c["rows"]]
    with tempfile.TemporaryDirectory() as tmp:
        table = write_markdown(rows, Path(tmp) / "comparison.md").read_text()
    n = sum(int(r["seeds"]) for r in rows)
    note = (
        f"The {n} runs took {c['wall_seconds']:.0f} s of wall time and {c['cpu_seconds']:.0f} s of CPU time "
        f"on a {cpus}-CPU machine{_load(c)} (`{c['command']}`)."
    )
    (RESULTS / "quick_compare.md").write_text(table + f"\n{note}\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--render-only", action="store_true", help="only re-render the .md files from quick_docs.json"
    )
    args = p.parse_args()
    render(measured(RAW, measure, args.render_only))
    for name in ("quick_default.md", "quick_compare.md"):
        print((RESULTS / name).read_text())


if __name__ == "__main__":
    main()

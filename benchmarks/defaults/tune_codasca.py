"""``fedxrisk tune -a codasca --trials 20`` on the default dataset: its cost, and whether the best
config beats the default config (trial 0, enqueued first) on validation AUROC.

    PYTHONPATH=src python benchmarks/defaults/tune_codasca.py [--trials 20] [--keep DIR]

Runs the command as a subprocess (wall time; CPU time of the child processes; the 1-minute load
average of the shared machine before and after) and writes ``benchmarks/results/tune_codasca.{json,md}``
(a generated region of docs/tune.md), the md including the command's own terminal output.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "tune_codasca"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--keep", default=None, help="keep the tune folder here")
    p.add_argument("--confirm-seeds", default="0,1,2")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    folder = Path(args.keep) if args.keep else tmp / "tune"
    argv = ["tune", "-a", "codasca", "--trials", str(args.trials), "--confirm-seeds", args.confirm_seeds,
            "--out", "TUNE"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "fedxrisk", *argv[:-1], str(folder)], env=env, text=True,
                         capture_output=True)  # fmt: skip
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"tune failed ({run.returncode}):\n{run.stderr[-3000:]}")
    with open(folder / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    default = next(r for r in rows if r["number"] == "0")
    best = json.loads((folder / "best.json").read_text())
    confirm = json.loads((folder / "confirm.json").read_text())
    states = {s: sum(r["state"] == s for r in rows) for s in ("complete", "pruned", "failed")}
    result = {
        "command": "fedxrisk " + " ".join(argv),
        "trials": args.trials,
        "states": states,
        "wall_seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "load_average": [load_before, os.getloadavg()[0]],
        "cores": os.cpu_count(),
        "default_value": float(default["value"]) if default["value"] else None,
        "best": best,
        "confirm": confirm,
        "stdout": run.stdout,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    OUT.with_suffix(".md").write_text(render(result))
    print(OUT.with_suffix(".md").read_text())
    if not args.keep:
        shutil.rmtree(tmp)


def render(r: dict) -> str:
    d, b = r["default_value"], r["best"]
    if d is None:
        verdict = "the default config (trial 0) did not complete"
    elif b["number"] == 0 or b["value"] == d:
        verdict = f"the best config **equals** the default config (trial {b['number']}, {r['best']['monitor']} {d:.4f})"
    else:
        verdict = (f"the best config (trial {b['number']}) **beats** the default: {b['monitor']} "
                   f"{b['value']:.4f} vs {d:.4f} (+{b['value'] - d:.4f})")  # fmt: skip
    c = r["confirm"]
    out = [
        f"`{r['command']}` (digits, CODASCA, 100 rounds per trial): {r['states']['complete']} complete, "
        f"{r['states']['pruned']} pruned, {r['states']['failed']} failed; **{r['wall_seconds'] / 60:.1f} min wall, "
        f"{r['cpu_seconds'] / 60:.1f} min CPU** on a shared {r['cores']}-core machine (1-min load average "
        f"{r['load_average'][0]:.1f} before, {r['load_average'][1]:.1f} after; the confirmation runs included).",
        "",
        f"Result: {verdict}. Best config on seeds {', '.join(c['by_seed'])}: test AUROC "
        f"{c['mean']:.4f} ± {c['std']:.4f}.",
        "",
        "Its terminal output:",
        "",
        "```",
        r["stdout"].rstrip(),
        "```",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()

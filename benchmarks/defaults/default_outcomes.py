"""Every algorithm's default config on every bundled dataset and the real datasets the project reads:
does it finish without NaN? (issue 22 item 5)

Each cell is one run with the algorithm's defaults (step size, window, hyperparameters), the
default model (MLP), ``--rounds`` rounds (default 20, evaluated every 10), seed 0, a 20 %
validation split when the runs support one: the final test AUROC (and validation AUROC), or
``NaN@r`` when the loss became non-finite at round r, ``diverged`` when the final training loss
exceeds 1e6 in size. Real data (``--data``, or the environment
variable ``FEDXRISK_DATA``, holding ``heart-disease/``, ``medmnist/``, ``adbench/``; see
/work/shared/data/README.md) are skipped with a note when absent.

    PYTHONPATH=src python benchmarks/defaults/default_outcomes.py --data ../shared/data --jobs 2

Writes ``benchmarks/results/default_outcomes.{json,md}`` (a generated region of docs/tune.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BLOWUP = 1e6  # |final training loss| above this: diverged (finite, not yet NaN)
OUT = ROOT / "benchmarks" / "results" / "default_outcomes"
BUNDLED = {  # name -> RunConfig changes
    "digits": {"dataset": "digits"},
    "breast_cancer": {"dataset": "breast_cancer"},
    "synthetic": {"dataset": "synthetic"},
    "mnist1d": {"dataset": "mnist1d"},
}
REAL = {  # name -> (file or folder under DATA, RunConfig changes)
    "heart (4 hospitals)": ("heart-disease", {"dataset": "heart_disease", "partition": "source", "clients": 4,
                                              "imratio": None, "allow_missing_class": True}),
    "breastmnist": ("medmnist/breastmnist.npz", {"dataset": "medmnist", "positive_classes": [0], "imratio": None,
                                                 "clients": 4, "partition": "iid"}),
    "campaign": ("adbench/5_campaign.npz", {"dataset": "npz", "imratio": None, "clients": 8, "partition": "iid"}),
}  # fmt: skip


def one(algorithm: str, changes: dict[str, Any], rounds: int) -> dict[str, Any]:
    """One default-config run; its final test (and validation) AUROC, or where it became non-finite."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from fedxrisk.engines import NonFiniteLoss
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.spec import RunConfig

    extra = {"validation": 0.2} if "validation" in RunConfig.__dataclass_fields__ else {}
    cfg = RunConfig(algorithm=algorithm, rounds=rounds, eval_every=10, checkpoint_every=0, tensorboard=False,
                    **extra, **changes)  # fmt: skip
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = run_experiment(cfg, Path(tmp) / "run")
        except NonFiniteLoss as e:
            return {"test_auroc": math.nan, "val_auroc": math.nan, "nonfinite_round": getattr(e, "round", None),
                    "error": str(e), "seconds": time.perf_counter() - start}  # fmt: skip
    final = result.history[-1]
    return {"test_auroc": final["test_auroc"], "val_auroc": final.get("val_auroc", math.nan),
            "train_loss": final["train_loss"],
            "nonfinite_round": None, "lr": result.summary["config"]["lr"], "seconds": time.perf_counter() - start}  # fmt: skip


def cell(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return "–"
    if r["nonfinite_round"] is not None or math.isnan(r["test_auroc"]):
        return f"**NaN**@{r['nonfinite_round']}" if r["nonfinite_round"] is not None else "**NaN**"
    if abs(r.get("train_loss", 0.0)) > BLOWUP:
        return f"**diverged** ({r['test_auroc']:.3f})"
    val = "" if math.isnan(r["val_auroc"]) else f" / {r['val_auroc']:.3f}"
    return f"{r['test_auroc']:.3f}{val}"


def _lr_note(r: dict[str, Any], default: float) -> str:
    """The step size the run used when the data lowered the default (``default_lr_for``)."""
    lr = r.get("lr")
    return "" if lr is None or math.isclose(lr, default, rel_tol=1e-9) else f" (lr {lr:.3g})"


def render(results: dict[str, Any]) -> str:
    from fedxrisk.catalog import load

    datasets = results["datasets"]
    has_val = any(not math.isnan(r.get("val_auroc", math.nan)) for row in results["cells"].values() for r in row.values()
                  if not r.get("skipped"))  # fmt: skip
    what = "final test AUROC / validation AUROC" if has_val else "final test AUROC"
    lines = [
        f"Default config of each algorithm, {results['rounds']} rounds, default model (MLP), seed 0; cell: {what}; "
        f"**NaN**@r: non-finite loss at round r; **diverged**: |final training loss| > 1e6 (its test AUROC). {results['runs']} runs, {results['wall_seconds']:.0f} s wall "
        f"({results['jobs']} processes). `{results['command']}`",
        "",
        "| algorithm | lr | " + " | ".join(datasets) + " |",
        "|---|---|" + "---|" * len(datasets),
    ]
    for alg, row in results["cells"].items():
        default = load()["algorithms"][alg]["default_lr"]
        cells = [cell(row[d]) + _lr_note(row[d], default) for d in datasets]
        lines.append(f"| {alg} | {default:g} | " + " | ".join(cells) + " |")
    nan = sum(
        cell(r).startswith(("**NaN", "**div")) for row in results["cells"].values() for r in row.values()
    )
    lines += ["", f"NaN or diverged cells: {nan}."]
    lines += [f"Skipped: {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("FEDXRISK_DATA"), help="folder of the real data")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--algorithms", default=None, help="comma list (default: all registered)")
    p.add_argument("--datasets", default=None, help="comma list of column names (default: all)")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--update", action="store_true", help="rerun only the given cells; keep the others")
    args = p.parse_args()
    if args.render_only:
        OUT.with_suffix(".md").write_text(render(json.loads(OUT.with_suffix(".json").read_text())))
        return
    from fedxrisk.catalog import load

    algorithms = args.algorithms.split(",") if args.algorithms else list(load()["algorithms"])
    columns: dict[str, dict[str, Any]] = dict(BUNDLED)
    notes = []
    for name, (rel, changes) in REAL.items():
        path = Path(args.data) / rel if args.data else None
        if path is None or not path.exists():
            notes.append(f"{name}: {rel} not found (give --data or FEDXRISK_DATA)")
            continue
        columns[name] = {**changes, "data_dir": str(path)}
    if args.datasets:
        columns = {k: v for k, v in columns.items() if k in args.datasets.split(",")}
    start = time.perf_counter()
    jobs = {(a, d): (a, c, args.rounds) for a in algorithms for d, c in columns.items()}
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {key: pool.submit(one, *job) for key, job in jobs.items()}
        cells = {a: {d: futures[(a, d)].result() for d in columns} for a in algorithms}
    for a, row in cells.items():
        print(a, " ".join(cell(r) for r in row.values()), flush=True)
    command = "python benchmarks/defaults/default_outcomes.py --data ../shared/data" + (
        f" --jobs {args.jobs}" if args.jobs > 1 else ""
    )
    wall = time.perf_counter() - start
    if args.update:  # the other cells from the last full run
        old = json.loads(OUT.with_suffix(".json").read_text())
        for a, row in cells.items():
            old["cells"].setdefault(a, {}).update(row)
        cells, columns = old["cells"], dict.fromkeys(old["datasets"])
        notes, wall = old["notes"], old["wall_seconds"] + wall
        jobs = {(a, d): None for a in cells for d in columns}
    results = {"rounds": args.rounds, "datasets": list(columns), "cells": cells, "notes": notes,
               "runs": len(jobs), "jobs": args.jobs, "wall_seconds": wall,
               "load_average": os.getloadavg()[0], "command": command}  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    OUT.with_suffix(".md").write_text(render(results))
    print(OUT.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()

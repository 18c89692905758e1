"""Do the AUC methods converge at their defaults on heterogeneous sites? (issue 33, default stability)

Every AUC method × every split × seeds, each run at the method's defaults (step size, window,
rounds, stages, batch size, hyperparameters; the default MLP): the heart hospitals
(``partition = source``, 4 sites) and the ADBench tabular sets split by ``dirichlet``
with α = 0.5 over 16 clients and α = 0.1 over 4 (with 8 or 16 clients nearly every α = 0.1 draw
leaves a client empty; over 4, some clients are all positive) and by the stratified ``class``
split over 16, at their natural prevalence (``imratio = none``,
``allow_missing_class``). A cell counts NaN runs (non-finite loss or model), the final test
AUROC (mean ± sd over the seeds that ran) and the splits that are invalid for that seed (a
Dirichlet draw leaving a client without data is refused by fedxrisk before training).
The data (``/work/shared/data``, see its README) are read from ``--data``.

    PYTHONPATH=src python benchmarks/provenance.py run stability -- \
        python benchmarks/heterogeneous/stability.py --data /work/shared/data

Runs one process (one thread), appending every finished run to ``stability.json`` (``--resume``
skips the runs already there); writes ``benchmarks/results/stability.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.*` imports
OUT = ROOT / "benchmarks" / "results" / "stability"
METHODS = (
    "codasca", "codaplus", "coda", "npa", "localsgdam", "localscgdam",
    "fedxl1", "fedxl2", "localpair", "fcsg", "fcsg_m", "acc_fcsg_m", "local_scgd", "local_scgdm",
)  # fmt: skip
TABULAR = {"campaign": "adbench/5_campaign.npz", "mammography": "adbench/23_mammography.npz",
           "donors": "adbench/11_donors.npz"}  # fmt: skip
SKEW = {"dir0.5": {"partition": "dirichlet", "dirichlet_alpha": 0.5, "clients": 16},
        "dir0.1": {"partition": "dirichlet", "dirichlet_alpha": 0.1, "clients": 4},  # 8 or 16: a client empty
        "class": {"partition": "class", "clients": 16}}  # fmt: skip


def columns(data: Path, datasets: list[str], splits: list[str]) -> dict[str, dict[str, Any]]:
    """Column name → RunConfig changes (natural prevalence, clients allowed one class)."""
    out: dict[str, dict[str, Any]] = {}
    if "heart" in datasets:
        out["heart source"] = {"dataset": "heart_disease", "data_dir": str(data / "heart-disease"),
                               "partition": "source", "clients": 4}  # fmt: skip
    for name, rel in TABULAR.items():
        if name in datasets:
            for split, changes in SKEW.items():
                if split not in splits:
                    continue
                name_k = f"{name} {split} K={changes['clients']}"
                out[name_k] = {"dataset": "npz", "data_dir": str(data / rel), **changes}
    return out


def one(algorithm: str, changes: dict[str, Any], seed: int) -> dict[str, Any]:
    """One run at the defaults (``changes`` may set ``lr``): final test AUROC, or the round where it
    became non-finite."""
    from fedxrisk.engines import NonFiniteLoss
    from fedxrisk.errors import ConfigError
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.spec import RunConfig

    base = RunConfig()
    cfg = RunConfig(algorithm=algorithm, seed=seed, imratio=None, allow_missing_class=True,
                    eval_every=base.rounds, checkpoint_every=0, tensorboard=False, **changes)  # fmt: skip
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = run_experiment(cfg, Path(tmp) / "run")
        except NonFiniteLoss as e:
            return {
                "outcome": "nan",
                "round": getattr(e, "round", None),
                "seconds": time.perf_counter() - start,
            }
        except ConfigError as e:
            if "with no samples" not in str(e):  # only a refused split is a cell's "invalid" seed
                raise
            return {"outcome": "invalid", "error": str(e)}
    final = result.history[-1]
    return {"outcome": "ok", "test_auroc": final["test_auroc"], "train_loss": final["train_loss"],
            "lr": result.summary["config"]["lr"], "seconds": time.perf_counter() - start}  # fmt: skip


def summarize(runs: list[dict[str, Any]]) -> str:
    ok = [r["test_auroc"] for r in runs if r["outcome"] == "ok"]
    nan = sum(r["outcome"] == "nan" for r in runs)
    invalid = sum(r["outcome"] == "invalid" for r in runs)
    if not ok and not nan:
        return f"– ({invalid} invalid)" if invalid else "–"
    sd = f" ± {statistics.stdev(ok):.3f}" if len(ok) > 1 else ""
    text = f"{statistics.mean(ok):.3f}{sd} (n={len(ok)}, min {min(ok):.3f})" if ok else "–"
    text += f", **{nan} NaN**" if nan else ""
    return text + (f" ({invalid} invalid)" if invalid else "")


def render(results: dict[str, Any]) -> str:
    cols = results["columns"]
    cells = results["cells"]
    lines = [
        f"Every AUC method at its defaults (default MLP, {results['rounds']} rounds), seeds {results['seeds']}; "
        "cell: final test AUROC mean ± sd over the n runs that finished and their minimum, **k NaN**: runs with a non-finite "
        "loss or model, (k invalid): seeds whose split fedxrisk refuses (a client without data). "
        f"{sum(len(v) for row in cells.values() for v in row.values())} runs, {results['cpu_seconds'] / 60:.0f} CPU-minutes (one process). "
        f"`{results['command']}`",
        "",
        "| method | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for method, row in cells.items():
        lines.append(f"| {method} | " + " | ".join(summarize(row.get(c, [])) for c in cols) + " |")
    nan = sum(r["outcome"] == "nan" for row in cells.values() for runs in row.values() for r in runs)
    weak = sorted({f"{m} ({c})" for m, row in cells.items() for c, runs in row.items()
                   for r in runs if r["outcome"] == "ok" and r["test_auroc"] < 0.6})  # fmt: skip
    lines += [
        "",
        f"NaN runs: {nan}. Finished but below 0.6 test AUROC in some seed: {', '.join(weak) or 'none'}.",
    ]
    # seeds every method ran (none yet right after the range ends, which run first)
    short = {c: min((len(row.get(c, [])) for row in cells.values()), default=0) for c in cols}
    short = {c: n for c, n in short.items() if n < len(results["seeds"])}
    if short:
        lines.append("Not every seed ran (the study was stopped; `--resume` continues it): "
                     + ", ".join(f"{c}: {n} of {len(results['seeds'])} seeds for every method" for c, n in short.items()) + ".")  # fmt: skip
    lines += [f"Note: {n}" for n in results["notes"]]
    from benchmarks.heterogeneous import stability_ranges

    lines += stability_ranges.render_ranges(results)
    if results.get("ranges"):
        lines.append(f"\n{results.get('ranges_cpu_seconds', 0) / 60:.0f} CPU-minutes for the range ends.")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("FEDXRISK_DATA", "../shared/data"))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument(
        "--datasets", default="heart,campaign,mammography,donors", help="of heart,campaign,mammography,donors"
    )
    p.add_argument("--splits", default="dir0.5,dir0.1,class", help="of the tabular sets: dir0.5,dir0.1,class")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--resume", action="store_true", help="keep the runs stability.json already holds")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--verify", action="store_true",
                   help="first rerun seed 0 of every method on two columns; stop unless bit for bit equal")  # fmt: skip
    p.add_argument("--ranges", action="store_true", help="then the ends of the default tune lr ranges")
    args = p.parse_args()
    path = OUT.with_suffix(".json")
    if args.render_only:
        OUT.with_suffix(".md").write_text(render(json.loads(path.read_text())))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from fedxrisk.run.spec import RunConfig

    cols = columns(Path(args.data), args.datasets.split(","), args.splits.split(","))
    methods = args.methods.split(",")
    old = json.loads(path.read_text()) if args.resume and path.exists() else {"cells": {}, "cpu_seconds": 0.0}
    results = {"rounds": RunConfig().rounds, "seeds": list(range(args.seeds)), "columns": list(cols),
               "cells": old["cells"], "cpu_seconds": old["cpu_seconds"], "command": " ".join(["python", *sys.argv]),
               "notes": [] if "donors" in args.datasets or any("donors" in c for c in old.get("columns", [])) else
               ["donors (619k rows) left out to keep the study under ~40 CPU-minutes"],
               "ranges": old.get("ranges", {}), "ranges_cpu_seconds": old.get("ranges_cpu_seconds", 0.0)}  # fmt: skip
    results["columns"] = [*old.get("columns", []), *(c for c in cols if c not in old.get("columns", []))]
    results["first_command"] = old.get("first_command", old.get("command", results["command"]))
    if results["first_command"] != results["command"]:
        results["notes"].append(f"resumed from runs made by `{results['first_command']}`")
    save = lambda: path.write_text(json.dumps(results, indent=1, default=str) + "\n")  # noqa: E731
    if args.verify:
        from benchmarks.heterogeneous import stability_ranges

        differ = stability_ranges.verify(results, cols, one)
        if differ:
            sys.exit(
                f"stability --verify: {len(differ)} stored cells differ on this source: {differ}; rerun without --resume"
            )
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        results["notes"].append(f"seed 0 of every method on {', '.join(stability_ranges.VERIFY_COLUMNS)} "
                                f"reran bit for bit at {commit.stdout.strip()} (--verify)")  # fmt: skip
    if args.ranges:  # first: cheaper than the table's missing cells
        from benchmarks.heterogeneous import stability_ranges

        start = time.process_time()
        auc = [m for m in methods if m in METHODS]
        stability_ranges.run_ranges(results, auc, cols, one, save)
        results["ranges_cpu_seconds"] = results.get("ranges_cpu_seconds", 0.0) + time.process_time() - start
        save()
        OUT.with_suffix(".md").write_text(render(results))
    for seed in range(args.seeds):  # seed-major: a stopped study still covers every cell
        for method, (col, changes) in itertools.product(methods, cols.items()):
            runs = results["cells"].setdefault(method, {}).setdefault(col, [])
            if any(r["seed"] == seed for r in runs):
                continue
            start = time.process_time()
            r = one(method, changes, seed)
            results["cpu_seconds"] += time.process_time() - start
            runs.append({"seed": seed, **r})
            print(method, col, seed, r.get("outcome"), r.get("test_auroc", r.get("round")), flush=True)
            results["runs"] = sum(len(v) for row in results["cells"].values() for v in row.values())
            results["load_average"] = os.getloadavg()[0]
            save()
            OUT.with_suffix(".md").write_text(render(results))
    nan = [m for m, row in results["cells"].items() for v in row.values() for r in v if r["outcome"] == "nan"]
    print(OUT.with_suffix(".md").read_text())
    if nan:
        print(f"{len(nan)} NaN runs ({', '.join(sorted(set(nan)))})", file=sys.stderr)


if __name__ == "__main__":
    main()

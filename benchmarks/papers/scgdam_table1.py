"""LocalSCGDAM paper, Table 1 protocol at CPU scale (docs/scgdam.md).

K = 4 clients (i.i.d. split of the imbalanced training set), batch 32 per client,
communication period p ∈ {4, 8, 16}, the same number T of local steps for every
p (so T/p rounds), the same schedule for every method (η ÷ 3 at half time).

Tuning, equal for every method: 6 step sizes × 2 tuning seeds (100, 101), chosen
by the mean AUROC on a held-out 20 % of the (imbalanced) training set at p = 8
(a diverged run counts as AUROC 0); the grid is the same *effective* step
{0.1, 0.3, 1, 3, 10, 30} for every method (for heavy-ball momentum 0.9 that is
lr = step/10; for LocalSCGDAM γ_x = γ_y = step/η at η = 0.1, since its momenta
are moving averages; plain lr for CoDA, SCAFFOLD, FedProx). Then every method runs
with its chosen step on each p and seed; the table gives the final test AUROC
(balanced test set, never used for tuning), mean ± std over seeds.

    nice -n 10 python benchmarks/papers/scgdam_table1.py --out benchmarks/results/scgdam_table1.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import make_federated
from fedxrisk.data.validation import hold_out
from fedxrisk.engines import NonFiniteLoss, Simulation
from fedxrisk.metrics import evaluate
from fedxrisk.models import build_model
from fedxrisk.problem import Problem

METHODS = ["localscgdam", "localsgdam", "coda", "localsgdm", "localsgdm_rl", "scaffold", "fedprox"]
EFFECTIVE_STEPS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
SCGDAM_ETA = 0.1
TUNE_SEEDS = (100, 101)
TUNE_P = 8


def grid(method: str) -> list[tuple[float, dict]]:
    """(lr, options) for each of the effective step sizes of ``method``."""
    out = []
    for step in EFFECTIVE_STEPS:
        if method == "localscgdam":
            out.append((SCGDAM_ETA, {"gamma_x": step / SCGDAM_ETA, "gamma_y": step / SCGDAM_ETA}))
        elif method in ("localsgdam", "localsgdm", "localsgdm_rl"):  # heavy ball, momentum 0.9
            out.append((step * (1 - 0.9), {}))
        else:  # plain steps: coda, scaffold, fedprox
            out.append((step, {}))
    return out


def run(method, dataset, imratio, p, seed, lr, options, steps, validation=False) -> float:
    # allow_missing_class: at imratio 0.01 a client may hold no positive (only its loss terms count)
    data = make_federated(dataset, 4, "iid", imratio, seed, allow_missing_class=True)
    if validation:
        data = hold_out(data, seed)
    net = build_model("mlp", data.data.input_shape, seed)
    problem = Problem(net, data.data.pos_ratio)
    alg = ALGORITHMS[method](problem, **options)
    schedule = Schedule.build(steps // p, p, lr, stages=2, lr_decay=3.0)
    sim = Simulation(alg, data, schedule, batch_size=32, seed=seed, engine="vmap")
    try:
        while not sim.done:
            sim.run_round()
    except NonFiniteLoss:
        return math.nan
    params, buffers = sim.global_model()
    return evaluate(problem, params, buffers, data)["test_auroc"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["digits", "mnist1d"])
    ap.add_argument("--imratios", nargs="+", type=float, default=[0.1])
    ap.add_argument("--periods", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--steps", type=int, default=256, help="local steps per run (all p)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/scgdam_table1.json"))
    ap.add_argument(
        "--update", action="store_true", help="rerun only these settings inside an existing --out"
    )
    ap.add_argument("--ablation", action="store_true", help="LocalSCGDAM variants at the tuned step, p = 8")
    ap.add_argument("--render-only", action="store_true", help="write the .md tables from --out, run nothing")
    args = ap.parse_args()
    if args.render_only:
        render(json.loads(args.out.read_text()), args.out)
        if ablation_path(args.out).exists():
            render_ablation(ablation_path(args.out))
        return None
    torch.set_num_threads(1)
    if args.ablation:
        return ablation(args)
    call = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results = {"args": call, "tuning": {}, "runs": []}
    if args.update and args.out.exists():
        results = json.loads(args.out.read_text())
        redo = {(d, i, m) for d in args.datasets for i in args.imratios for m in args.methods}
        results["runs"] = [
            r for r in results["runs"] if (r["dataset"], r["imratio"], r["method"]) not in redo
        ]
        results.setdefault("updates", []).append(call)
    start = time.perf_counter()
    for dataset in args.datasets:
        for imratio in args.imratios:
            for method in args.methods:
                scores = [
                    float(
                        np.mean(
                            np.nan_to_num(
                                [
                                    run(
                                        method,
                                        dataset,
                                        imratio,
                                        TUNE_P,
                                        s,
                                        lr,
                                        opts,
                                        args.steps,
                                        validation=True,
                                    )
                                    for s in TUNE_SEEDS
                                ],
                                nan=0.0,
                            )
                        )
                    )
                    for lr, opts in grid(method)
                ]
                best = int(np.argmax(scores))
                lr, opts = grid(method)[best]
                key = f"{dataset}/{imratio}/{method}"
                results["tuning"][key] = {
                    "val_auroc": scores,
                    "chosen": EFFECTIVE_STEPS[best],
                    "lr": lr,
                    "options": opts,
                }
                print(
                    f"[{time.perf_counter() - start:6.0f}s] tune {key}: {np.round(scores, 4).tolist()} → {EFFECTIVE_STEPS[best]}",
                    flush=True,
                )
                for p in args.periods:
                    aucs = [run(method, dataset, imratio, p, s, lr, opts, args.steps) for s in args.seeds]
                    results["runs"].append(
                        dict(dataset=dataset, imratio=imratio, method=method, p=p, test_auroc=aucs)
                    )
                    print(
                        f"[{time.perf_counter() - start:6.0f}s]   p={p:2d}: {np.nanmean(aucs):.4f} ± {np.nanstd(aucs):.4f}",
                        flush=True,
                    )
    results["wall_seconds"] = results.get("wall_seconds", 0) + round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    render(results, args.out)


def render(results: dict, raw: Path) -> None:
    """``<raw>.md``: imratio 0.1 (the paper's Table 1); ``<raw>_imratios.md``: the other ratios."""
    main_rows = [r for r in results["runs"] if r["imratio"] == 0.1]
    others = [r for r in results["runs"] if r["imratio"] != 0.1]
    for path, runs in (
        (raw.with_suffix(".md"), main_rows),
        (raw.with_name(raw.stem + "_imratios.md"), others),
    ):
        if runs:
            path.write_text(table({**results, "runs": runs}) + "\n")
            print(path.read_text())
    tuning = raw.with_name(raw.stem + "_tuning.md")
    tuning.write_text(tuning_table(results) + "\n")
    print(tuning.read_text())


def tuning_table(results: dict) -> str:
    """Markdown: the validation AUROC of every grid step, per (dataset, imratio, method)."""
    steps = " / ".join(f"{s:g}" for s in EFFECTIVE_STEPS)
    lines = [f"| setting | method | val AUROC for effective step {steps} | chosen |", "|---|---|---|---|"]
    for key, t in results["tuning"].items():
        dataset, imratio, method = key.split("/")
        scores = " / ".join(f"{v:.3f}" for v in t["val_auroc"])
        lines.append(f"| {dataset} {imratio} | {method} | {scores} | {t['chosen']} |")
    return "\n".join(lines)


ABLATIONS = {
    "exact HVP, rho=0.1 (default)": {},
    "first_order (Jacobian = I)": {"first_order": True},
    "rho=0.01": {"rho": 0.01},
    "rho=1.0": {"rho": 1.0},
    "alpha_h=1 (h rate 0.1)": {"alpha_h": 1.0},
}


def ablation(args) -> None:
    """LocalSCGDAM variants with the step chosen in --out's tuning (p = 8); not used for tuning.

    Raw AUROCs go to ``<out>_ablation.json``, the table to ``<out>_ablation.md``.
    """
    results = json.loads(args.out.read_text())
    start = time.perf_counter()
    rows = []
    for dataset in args.datasets:
        tuned = results["tuning"][f"{dataset}/{args.imratios[0]}/localscgdam"]
        for name, extra in ABLATIONS.items():
            aucs = [
                run(
                    "localscgdam",
                    dataset,
                    args.imratios[0],
                    8,
                    s,
                    tuned["lr"],
                    {**tuned["options"], **extra},
                    args.steps,
                )
                for s in args.seeds
            ]
            rows.append(dict(dataset=dataset, imratio=args.imratios[0], variant=name, test_auroc=aucs))
            print(f"{dataset} {name}: {np.nanmean(aucs):.3f} ± {np.nanstd(aucs):.3f}", flush=True)
    call = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    raw = ablation_path(args.out)
    raw.write_text(
        json.dumps(
            {"args": call, "rows": rows, "wall_seconds": round(time.perf_counter() - start, 1)}, indent=2
        )
        + "\n"
    )
    render_ablation(raw)


def ablation_path(out: Path) -> Path:
    return out.with_name(out.stem + "_ablation.json")


def render_ablation(raw: Path) -> None:
    """``<raw>.md`` from the ablation's raw AUROCs."""
    lines = ["| dataset | variant | test AUROC, p = 8 |", "|---|---|---|"]
    for r in json.loads(raw.read_text())["rows"]:
        a = np.asarray(r["test_auroc"], dtype=float)
        lines.append(f"| {r['dataset']} | {r['variant']} | {np.nanmean(a):.3f} ± {np.nanstd(a):.3f} |")
    raw.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(raw.with_suffix(".md").read_text())


def table(results: dict) -> str:
    """Markdown: one row per (dataset, imratio, method), one column per p."""
    periods = sorted({r["p"] for r in results["runs"]})
    lines = ["| dataset | imratio | method | step | " + " | ".join(f"p = {p}" for p in periods) + " |"]
    lines.append("|" + "---|" * (4 + len(periods)))
    rows: dict[tuple, dict[int, list[float]]] = {}
    for r in results["runs"]:
        rows.setdefault((r["dataset"], r["imratio"], r["method"]), {})[r["p"]] = r["test_auroc"]
    order = {m: i for i, m in enumerate(METHODS)}
    for (dataset, imratio, method), by_p in sorted(
        rows.items(), key=lambda kv: (kv[0][:2], order.get(kv[0][2], 99))
    ):
        step = results["tuning"][f"{dataset}/{imratio}/{method}"]["chosen"]
        cells = []
        for p in periods:
            a = np.asarray(by_p[p], dtype=float)
            fails = int(np.isnan(a).sum())
            cell = f"{np.nanmean(a):.3f} ± {np.nanstd(a):.3f}" if fails < len(a) else "diverged"
            cells.append(cell + (f" ({fails} NaN)" if 0 < fails < len(a) else ""))
        lines.append(f"| {dataset} | {imratio} | {method} | {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""FeDXL benchmark at CPU scale: AUROC and partial AUROC versus communication.

Groups (FeDXL paper §5, ALGORITHMS.md §2.7):

- AUROC:  FeDXL1, Local Pair (pairwise loss), CE FedAvg (localsgdm), CODASCA, centralized FeDXL1;
- pAUC:   FeDXL2, Local Pair (KL-DRO loss), CE FedAvg, centralized FeDXL2.

Protocols: ``class`` (class-heterogeneous: positive and negative classes split
over clients) and ``shift`` (FeDXL's: i.i.d. labels plus a per-client Gaussian
feature shift N((k − K/2)·0.01, 0.2²)). Grid K × I, several seeds; every run
takes the same number of local steps. "Centralized" is the same algorithm with
K = 1, a batch K times larger (the samples all clients see per step) and I = 1
(pools refreshed every step).

Learning rates are selected per method and dataset on a validation split (20 %
of every client's training shard, ``fedxrisk.data.validation.hold_out``; the
test set is never seen) on one cell (protocol class, K = 16, I = 8, tuning seeds
100 and 101) from the same grid for every method: the best mean final validation AUROC
(AUROC group) or pAUC(FPR ≤ 0.3) (FeDXL2, Local Pair-pAUC); CE FedAvg takes its
AUROC choice in both groups.

Bytes are per client, up + down, split into model tensors (w, m, buffers,
control variates, a, b, α, …) and scores (FeDXL's pooled scores and u).

Writes ``benchmarks/results/fedxl_<dataset>.json`` (raw rows and the tuning) and
``fedxl_<dataset>.md`` (the tables in docs/fedxl.md); ``--render-only`` rebuilds
the .md from the .json without running anything.

    PYTHONPATH=src nice -n 10 python benchmarks/papers/fedxl_bench.py --jobs 2
    PYTHONPATH=src nice -n 10 python benchmarks/papers/fedxl_bench.py --dataset synthetic --jobs 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from fedxrisk.algorithms.fedxl import SCORE_KEYS

B, B1 = 32, 16  # batch size; FeDXL's positives per batch (the rest negatives)
FEDXL = {"positives_per_batch": B1, "passive_samples": 16, "tau": 2}
METHODS: dict[str, dict[str, Any]] = {
    "FeDXL1": {"algorithm": "fedxl1", "options": FEDXL, "tune_on": "test_auroc"},
    "LocalPair": {"algorithm": "localpair", "options": {"positives_per_batch": B1}, "tune_on": "test_auroc"},
    "CE FedAvg": {"algorithm": "localsgdm", "options": {}, "tune_on": "test_auroc"},
    "CODASCA": {"algorithm": "codasca", "options": {}, "tune_on": "test_auroc"},
    "FeDXL2": {"algorithm": "fedxl2", "options": FEDXL, "tune_on": "test_pauc30_norm"},
    "LocalPair-pAUC": {
        "algorithm": "localpair",
        "options": {"positives_per_batch": B1, "objective": "pauc", "beta": 0.1},
        "tune_on": "test_pauc30_norm",
    },
}
LR_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)  # the same for every method
TUNE_CELL = ("class", 16, 8)  # protocol, K, I
TUNE_SEEDS = (100, 101)  # split, model and sampling seeds used only for tuning
CENTRAL = {"Centralized FeDXL1": "FeDXL1", "Centralized FeDXL2": "FeDXL2"}
GROUPS = {
    "AUROC": ["FeDXL1", "LocalPair", "CE FedAvg", "CODASCA", "Centralized FeDXL1"],
    "pAUC": ["FeDXL2", "LocalPair-pAUC", "CE FedAvg", "Centralized FeDXL2"],
}
METRICS = ("test_auroc", "test_pauc30_norm", "test_pauc30_mcclish", "test_pauc50_norm", "test_pauc50_mcclish")


def _config(method: str, protocol: str, k: int, window: int, seed: int, lr: float, args) -> dict[str, Any]:
    central = method in CENTRAL
    spec = METHODS[CENTRAL.get(method, method)]
    options = dict(spec["options"])
    if central and "positives_per_batch" in options:
        options["positives_per_batch"] *= k
        options["passive_samples"] *= k
    return dict(
        algorithm=spec["algorithm"],
        dataset=args.dataset,
        clients=1 if central else k,
        imratio=args.imratio,
        partition="class" if protocol == "class" and not central else "iid",
        feature_shift=protocol == "shift",
        rounds=args.steps if central else args.steps // window,
        local_steps=1 if central else window,
        batch_size=B * k if central else B,
        lr=lr,
        seed=seed,
        options=options,
    )


def _run(job: tuple[str, str, int, int, int, dict[str, Any], bool]) -> dict[str, Any]:
    """One run; with ``validation`` the metrics are on the held-out part of the clients' shards."""
    import torch

    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.data import make_federated
    from fedxrisk.data.validation import hold_out
    from fedxrisk.engines import NonFiniteLoss, Simulation
    from fedxrisk.metrics import evaluate
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem

    torch.set_num_threads(1)
    method, protocol, k, window, seed, cfg, validation = job
    start = time.perf_counter()
    data = make_federated(
        cfg["dataset"],
        cfg["clients"],
        cfg["partition"],
        cfg["imratio"],
        seed,
        feature_shift=cfg["feature_shift"],
    )
    if validation:
        data = hold_out(data, seed)
    problem = Problem(build_model("mlp", data.data.input_shape, seed), data.data.pos_ratio)
    alg = ALGORITHMS[cfg["algorithm"]](problem, **cfg["options"])
    schedule = Schedule.build(cfg["rounds"], cfg["local_steps"], cfg["lr"], stages=2)
    sim = Simulation(alg, data, schedule, cfg["batch_size"], seed, "vmap")
    try:
        while not sim.done:
            sim.run_round()
        metrics = evaluate(problem, *sim.global_model(), data)
    except NonFiniteLoss:
        metrics = {m: math.nan for m in METRICS}
    by = sim.ledger.summary()["by_variable"]
    scores = sum(v["up"] + v["down"] for name, v in by.items() if name in SCORE_KEYS)
    models = sum(v["up"] + v["down"] for name, v in by.items() if name not in SCORE_KEYS)
    return {
        "method": method, "protocol": protocol, "K": k, "I": window, "seed": seed, "lr": cfg["lr"],
        **{m: metrics[m] for m in METRICS},
        "model_bytes": models, "score_bytes": scores, "seconds": time.perf_counter() - start,
    }  # fmt: skip


def _tuning_jobs(args) -> list[tuple]:
    protocol, k, window = TUNE_CELL
    return [
        (m, protocol, k, window, seed, _config(m, protocol, k, window, seed, lr, args), True)
        for m in METHODS
        for lr in LR_GRID
        for seed in TUNE_SEEDS
    ]


def _validation(tuning: list[dict[str, Any]], method: str, lr: float) -> float:
    """Mean over the tuning seeds of the method's selection metric; NaN if any run diverged."""
    key = METHODS[method]["tune_on"]
    return statistics.mean(r[key] for r in tuning if r["method"] == method and r["lr"] == lr)


def select(tuning: list[dict[str, Any]]) -> dict[str, float]:
    """Each method's lr: the best mean final validation metric (its ``tune_on``); NaN (diverged) loses."""
    best = {}
    for method in METHODS:
        scored = [(_validation(tuning, method, lr), lr) for lr in LR_GRID]
        best[method] = max(scored, key=lambda t: -math.inf if math.isnan(t[0]) else t[0])[1]
    return best


def _jobs(args, lrs: dict[str, float]) -> list[tuple]:
    jobs = []
    methods = list(dict.fromkeys(GROUPS["AUROC"] + GROUPS["pAUC"]))
    for protocol, seed in itertools.product(args.protocols, range(args.seeds)):
        for method in methods:
            lr = lrs[CENTRAL.get(method, method)]
            if method in CENTRAL:  # does not depend on I; K only sets its batch (use the largest K)
                k = max(args.clients)
                jobs.append(
                    (method, protocol, k, 1, seed, _config(method, protocol, k, 1, seed, lr, args), False)
                )
                continue
            for k, window in itertools.product(args.clients, args.windows):
                cfg = _config(method, protocol, k, window, seed, lr, args)
                jobs.append((method, protocol, k, window, seed, cfg, False))
    return jobs


def _map(jobs: list[tuple], workers: int, label: str) -> list[dict[str, Any]]:
    rows = []
    with ProcessPoolExecutor(workers) as pool:
        for i, row in enumerate(pool.map(_run, jobs), 1):
            rows.append(row)
            print(f"[{label} {i}/{len(jobs)}] {row['method']:<20} {row['protocol']:<5} K={row['K']:<2} "
                  f"I={row['I']:<2} seed={row['seed']} lr={row['lr']} auroc={row['test_auroc']:.3f} "
                  f"pauc30={row['test_pauc30_norm']:.3f} ({row['seconds']:.1f}s)", flush=True)  # fmt: skip
    return rows


def _fmt(values: list[float]) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def tuning_table(tuning: list[dict[str, Any]], lrs: dict[str, float]) -> str:
    """Validation metric per method and lr (the chosen lr in bold)."""
    head = ["method", "selected on", *(f"lr {lr:g}" for lr in LR_GRID)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, spec in METHODS.items():
        cells = []
        for lr in LR_GRID:
            value = _validation(tuning, method, lr)
            text = "diverged" if math.isnan(value) else f"{value:.3f}"
            cells.append(f"**{text}**" if lr == lrs[method] else text)
        name = "pAUC₃₀ (norm)" if spec["tune_on"] == "test_pauc30_norm" else "AUROC"
        out.append("| " + " | ".join([method, name, *cells]) + " |")
    return "\n".join(out)


def table(rows: list[dict[str, Any]], args: dict[str, Any]) -> str:
    """Markdown tables, one per group × protocol: mean ± std over seeds."""
    out = []
    for group, protocol in itertools.product(GROUPS, args["protocols"]):
        metrics = (
            ("test_auroc",) if group == "AUROC" else ("test_pauc30_norm", "test_pauc30_mcclish", "test_auroc")
        )
        out.append(f"\n**{group}, protocol `{protocol}`** ({args['dataset']}, imratio {args['imratio']}, "
                   f"{args['steps']} local steps, {args['seeds']} seeds)\n")  # fmt: skip
        head = ["method", "K", "I", "lr", *metrics, "model MB/client", "score MB/client"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for method in GROUPS[group]:
            cells = sorted(
                {(r["K"], r["I"]) for r in rows if r["method"] == method and r["protocol"] == protocol}
            )
            for k, window in cells:
                sel = [
                    r
                    for r in rows
                    if (r["method"], r["protocol"], r["K"], r["I"]) == (method, protocol, k, window)
                ]
                central = method in CENTRAL
                mb = (
                    ["–", "–"]
                    if central
                    else [f"{sel[0]['model_bytes'] / 1e6:.2f}", f"{sel[0]['score_bytes'] / 1e6:.3f}"]
                )
                kk, ii = ("1", "1") if central else (str(k), str(window))
                values = [_fmt([r[m] for r in sel]) for m in metrics]
                out.append("| " + " | ".join([method, kk, ii, f"{sel[0]['lr']:g}", *values, *mb]) + " |")
    return "\n".join(out)


def render(results: dict[str, Any]) -> str:
    args = results["args"]
    lrs = results["lrs"]
    text = [
        f"Learning rates ({args['dataset']}), selected on the validation split (cell class, K = 16, I = 8, "
        f"mean over seeds {TUNE_SEEDS[0]} and {TUNE_SEEDS[1]}); final validation metric per lr:\n",
        tuning_table(results["tuning"], lrs),
        table(results["rows"], args),
    ]
    return "\n".join(text) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--imratio", type=float, default=0.1)
    p.add_argument("--protocols", nargs="+", default=["class", "shift"], choices=["class", "shift"])
    p.add_argument("--clients", nargs="+", type=int, default=[4, 16])
    p.add_argument("--windows", nargs="+", type=int, default=[8, 32])
    p.add_argument("--steps", type=int, default=128, help="local steps per client in every run")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument(
        "--out", default=None, help="raw results (default benchmarks/results/fedxl_<dataset>.json)"
    )
    p.add_argument("--render-only", action="store_true", help="rebuild the .md from the .json; run nothing")
    args = p.parse_args()
    out = Path(args.out or f"benchmarks/results/fedxl_{args.dataset}.json")
    if not args.render_only:
        start = time.perf_counter()
        tuning = _map(_tuning_jobs(args), args.jobs, "tune")
        lrs = select(tuning)
        print("selected learning rates:", lrs, flush=True)
        jobs = _jobs(args, lrs)
        rows = _map(jobs, args.jobs, "run")
        call = {k: v for k, v in vars(args).items() if k not in ("render_only", "jobs", "out")}
        wall = time.perf_counter() - start
        results = {"args": call, "tuning": tuning, "lrs": lrs, "rows": rows, "seconds": wall}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"{len(tuning) + len(jobs)} runs in {wall:.0f} s")
    results = json.loads(out.read_text())
    text = render(results)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

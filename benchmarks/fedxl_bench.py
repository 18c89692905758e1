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

Bytes are per client, up + down, split into model tensors (w, m, buffers,
control variates, a, b, α, …) and scores (FeDXL's gathered scores and u).

    PYTHONPATH=src nice -n 10 python benchmarks/fedxl_bench.py --jobs 2 --out benchmarks/results/fedxl_digits.json
    PYTHONPATH=src nice -n 10 python benchmarks/fedxl_bench.py --dataset synthetic --jobs 2 \
        --out benchmarks/results/fedxl_synthetic.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from fedxrisk.algorithms.fedxl import SCORE_KEYS

B, B1 = 32, 16  # batch size; FeDXL's positives per batch (the rest negatives)
FEDXL = {"positives_per_batch": B1, "passive_samples": 16, "tau": 2}
# lr: the best of {0.3, 1, 3} (and 0.5/1.5/2 where those were close) for each method on one
# cell (protocol class, K = 16, I = 8, seed 0); see docs/fedxl.md
METHODS: dict[str, dict[str, Any]] = {
    "FeDXL1": {"algorithm": "fedxl1", "options": FEDXL, "lr": 1.0},
    "LocalPair": {"algorithm": "localpair", "options": {"positives_per_batch": B1}, "lr": 2.0},
    "CE FedAvg": {"algorithm": "localsgdm", "options": {}, "lr": 0.3},
    "CODASCA": {"algorithm": "codasca", "options": {}, "lr": 3.0},
    "FeDXL2": {"algorithm": "fedxl2", "options": FEDXL, "lr": 0.5},
    "LocalPair-pAUC": {
        "algorithm": "localpair",
        "options": {"positives_per_batch": B1, "objective": "pauc", "beta": 0.1},
        "lr": 1.5,
    },
}
CENTRAL = {"Centralized FeDXL1": "FeDXL1", "Centralized FeDXL2": "FeDXL2"}
GROUPS = {
    "AUROC": ["FeDXL1", "LocalPair", "CE FedAvg", "CODASCA", "Centralized FeDXL1"],
    "pAUC": ["FeDXL2", "LocalPair-pAUC", "CE FedAvg", "Centralized FeDXL2"],
}
METRICS = ("test_auroc", "test_pauc30_norm", "test_pauc30_mcclish", "test_pauc50_norm", "test_pauc50_mcclish")


def _config(method: str, protocol: str, k: int, window: int, seed: int, args) -> dict[str, Any]:
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
        model="mlp",
        rounds=args.steps if central else args.steps // window,
        local_steps=1 if central else window,
        batch_size=B * k if central else B,
        lr=spec["lr"],
        stages=2,
        seed=seed,
        engine="vmap",
        eval_every=10**6,  # evaluate once, at the end
        options=options,
    )


def _run(job: tuple[str, str, int, int, int, dict[str, Any]]) -> dict[str, Any]:
    import torch

    from fedxrisk.experiment import RunConfig, run_experiment

    torch.set_num_threads(1)
    method, protocol, k, window, seed, cfg = job
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summary = run_experiment(RunConfig(**cfg), Path(tmp) / "run").summary
    by = summary["communication"]["by_variable"]
    scores = sum(v["up"] + v["down"] for name, v in by.items() if name in SCORE_KEYS)
    models = sum(v["up"] + v["down"] for name, v in by.items() if name not in SCORE_KEYS)
    return {
        "method": method, "protocol": protocol, "K": k, "I": window, "seed": seed,
        **{m: summary["final"][m] for m in METRICS},
        "model_bytes": models, "score_bytes": scores, "seconds": time.perf_counter() - start,
    }  # fmt: skip


def _jobs(args) -> list[tuple]:
    jobs = []
    methods = list(dict.fromkeys(GROUPS["AUROC"] + GROUPS["pAUC"]))
    for protocol, seed in itertools.product(args.protocols, range(args.seeds)):
        for method in methods:
            if method in CENTRAL:  # does not depend on I; K only sets its batch (use the largest K)
                k = max(args.clients)
                jobs.append((method, protocol, k, 1, seed, _config(method, protocol, k, 1, seed, args)))
                continue
            for k, window in itertools.product(args.clients, args.windows):
                jobs.append(
                    (method, protocol, k, window, seed, _config(method, protocol, k, window, seed, args))
                )
    return jobs


def _fmt(values: list[float]) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def table(rows: list[dict[str, Any]], args) -> str:
    """Markdown tables, one per group × protocol: mean ± std over seeds."""
    out = []
    for group, protocol in itertools.product(GROUPS, args.protocols):
        metrics = (
            ("test_auroc",) if group == "AUROC" else ("test_pauc30_norm", "test_pauc30_mcclish", "test_auroc")
        )
        out.append(f"\n**{group}, protocol `{protocol}`** ({args.dataset}, imratio {args.imratio}, "
                   f"{args.steps} local steps, {args.seeds} seeds)\n")  # fmt: skip
        head = ["method", "K", "I", *metrics, "model MB/client", "score MB/client"]
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
                out.append(
                    "| "
                    + " | ".join([method, kk, ii, *(_fmt([r[m] for r in sel]) for m in metrics), *mb])
                    + " |"
                )
    return "\n".join(out)


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
    p.add_argument("--out", default=None, help="write the raw rows as JSON here")
    args = p.parse_args()
    jobs = _jobs(args)
    start = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, row in enumerate(pool.map(_run, jobs), 1):
            rows.append(row)
            print(f"[{i}/{len(jobs)}] {row['method']:<20} {row['protocol']:<5} K={row['K']:<2} I={row['I']:<2} "
                  f"seed={row['seed']} auroc={row['test_auroc']:.3f} pauc30={row['test_pauc30_norm']:.3f} "
                  f"({row['seconds']:.1f}s)", flush=True)  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    print(table(rows, args))
    print(f"\n{len(jobs)} runs in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

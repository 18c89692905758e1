"""Core benchmark (issue 2): test AUROC and bytes versus the communication window I.

Protocol: digits, second half of the classes positive, imratio 0.1, K = 8
class-heterogeneous clients (the papers' "IH" split: with 5 positive and 5
negative classes, each client holds one of each), batch 32, the same total
number of local steps T for every I (rounds = T / I), 3 stages with the step
size divided by 3. NPA communicates every step with a batch of 32·I (the same
samples per client and the same number of communications as the others at I).

Tuning budget, equal for every method: the learning rate is chosen from
LR_GRID at I = 8 on seed 0 by final test AUROC, then fixed for all I and seeds.

    python benchmarks/coda_windows.py                        # T = 512 steps, seeds 0 1
    python benchmarks/coda_windows.py --steps 128 --seeds 0  # smoke test
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

from fedxrisk.experiment import RunConfig, run_experiment

METHODS = {
    "localsgdm": ("localsgdm", {}),
    "coda": ("coda", {}),
    "codaplus": ("codaplus", {}),
    "codasca": ("codasca", {}),
    "codaplus (code form)": ("codaplus", {"form": "code"}),
    "codasca (code form)": ("codasca", {"form": "code"}),
    "npa": ("npa", {}),
}
WINDOWS = (1, 8, 32, 128)
LR_GRID = (0.3, 1.0, 3.0, 10.0)
OUT = Path(__file__).parent / "results"


def config(method: str, window: int, lr: float, seed: int, steps: int) -> RunConfig:
    algorithm, options = METHODS[method]
    npa = algorithm == "npa"
    rounds = steps // window
    return RunConfig(
        algorithm=algorithm, dataset="digits", clients=8, imratio=0.1, partition="class",
        rounds=rounds, local_steps=1 if npa else window, batch_size=32 * window if npa else 32,
        lr=lr, stages=3, seed=seed, engine="vmap", eval_every=max(1, rounds // 16), options=options,
    )  # fmt: skip


def run(cfg: RunConfig, scratch: Path) -> dict:
    name = f"{cfg.algorithm}-{cfg.local_steps}-{cfg.batch_size}-{cfg.lr}-{cfg.seed}-{len(list(scratch.iterdir()))}"
    return run_experiment(cfg, scratch / name).summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=512, help="local steps T per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--scratch", default="/tmp/fedxrisk-bench")
    args = parser.parse_args()
    steps, seeds = args.steps, args.seeds
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    start = time.time()

    chosen = {}
    for method in METHODS:
        scores = {
            lr: run(config(method, 8, lr, 0, steps), scratch)["final"]["test_auroc"] or 0.0 for lr in LR_GRID
        }
        chosen[method] = max(scores, key=scores.get)
        print(f"{method}: lr grid {scores} -> {chosen[method]}", flush=True)

    rows = []
    for method in METHODS:
        for window in WINDOWS:
            runs = [run(config(method, window, chosen[method], s, steps), scratch) for s in seeds]
            final = [r["final"]["test_auroc"] for r in runs]
            best = [r["best"]["test_auroc"] for r in runs]
            row = {
                "method": method, "I": window, "lr": chosen[method], "rounds": runs[0]["rounds"],
                "final_auroc_mean": statistics.mean(final),
                "final_auroc_std": statistics.pstdev(final),
                "best_auroc_mean": statistics.mean(best),
                "bytes_per_client": runs[0]["communication"]["bytes_up_per_client"]
                + runs[0]["communication"]["bytes_down_per_client"],
            }  # fmt: skip
            rows.append(row)
            print(row, flush=True)

    OUT.mkdir(exist_ok=True)
    suffix = f"-T{steps}"
    with open(OUT / f"coda_windows{suffix}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"T = {steps} local steps, seeds {seeds}, wall {time.time() - start:.0f} s",
        "",
        "| method | lr | I | rounds | final AUROC (mean ± std) | best AUROC | bytes up+down / client |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['lr']} | {r['I']} | {r['rounds']} | {r['final_auroc_mean']:.4f} ± "
            f"{r['final_auroc_std']:.4f} | {r['best_auroc_mean']:.4f} | {r['bytes_per_client']:,} |"
        )
    (OUT / f"coda_windows{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

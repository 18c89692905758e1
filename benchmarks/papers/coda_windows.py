"""Core benchmark (issue 2): test AUROC and bytes versus the communication window I.

Protocol: digits, second half of the classes positive, imratio 0.1, K = 8
class-heterogeneous clients (the papers' "IH" split: with 5 positive and 5
negative classes, each client holds one of each), batch 32, the same total
number of local steps T for every I (rounds = T / I), 3 stages with the step
size divided by 3. NPA communicates every step with a batch of 32·I (the same
samples per client and the same number of communications as the others at I).

Tuning budget, equal for every method: the learning rate is chosen from LR_GRID
at I = 8 by the mean final AUROC on a validation split (20 % of every client's
training shard, :func:`fedxrisk.data.validation.hold_out`) over the tuning seeds,
never on the test set; it is then fixed for all I and seeds.

    python benchmarks/papers/coda_windows.py                   # T = 512 steps, seeds 0 1, tuning seed 100
    python benchmarks/papers/coda_windows.py --render-only     # table from the committed CSVs
    python benchmarks/papers/coda_windows.py --update --methods npa   # rerun some methods only
    python benchmarks/papers/coda_windows.py --steps 128 --seeds 0 --tuning-seeds 100  # smoke test

Writes benchmarks/results/coda_windows{,_tuning}.csv and coda_windows.md.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from pathlib import Path

import torch

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import make_federated
from fedxrisk.data.validation import hold_out
from fedxrisk.engines import NonFiniteLoss, Simulation
from fedxrisk.metrics import evaluate
from fedxrisk.models import build_model
from fedxrisk.problem import Problem

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
TUNE_WINDOW = 8
OUT = Path(__file__).resolve().parents[1] / "results"


def run(method: str, window: int, lr: float, seed: int, steps: int, validation: bool = False) -> dict:
    """One run: final AUROC (validation or test) and bytes up + down per client."""
    algorithm, options = METHODS[method]
    npa = algorithm == "npa"
    data = make_federated("digits", 8, "class", 0.1, seed)
    if validation:
        data = hold_out(data, seed)
    problem = Problem(build_model("mlp", data.data.input_shape, seed), data.data.pos_ratio)
    alg = ALGORITHMS[algorithm](problem, **options)
    schedule = Schedule.build(steps // window, 1 if npa else window, lr, stages=3)
    sim = Simulation(alg, data, schedule, 32 * window if npa else 32, seed, "vmap")
    try:
        while not sim.done:
            sim.run_round()
        auroc = evaluate(problem, *sim.global_model(), data)["test_auroc"]
    except NonFiniteLoss:
        auroc = math.nan
    ledger = sim.ledger.summary()
    return {
        "auroc": auroc,
        "rounds": sim.round,
        "bytes": ledger["bytes_up_per_client"] + ledger["bytes_down_per_client"],
    }


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def render() -> str:
    """The Markdown table from the committed CSVs (methods in METHODS order)."""
    order = {m: i for i, m in enumerate(METHODS)}
    rows = sorted(_read(OUT / "coda_windows.csv"), key=lambda r: (order[r["method"]], int(r["I"])))
    tuning = _read(OUT / "coda_windows_tuning.csv")
    val = {(t["method"], t["lr"]): float(t["val_auroc"]) for t in tuning}
    lines = [
        f"T = {rows[0]['steps']} local steps, test seeds {rows[0]['seeds']}; lr chosen at I = {TUNE_WINDOW} "
        f"by validation AUROC (tuning seeds {tuning[0]['tuning_seeds']}, grid {list(LR_GRID)}).",
        "",
        "| method | lr | val AUROC (I = 8) | I | rounds | final test AUROC (mean ± std) | bytes up+down / client |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {float(r['lr']):g} | {val[(r['method'], r['lr'])]:.4f} | {r['I']} | {r['rounds']} | "
            f"{float(r['final_auroc_mean']):.4f} ± {float(r['final_auroc_std']):.4f} | {int(r['bytes_per_client']):,} |"
        )
    text = "\n".join(lines) + "\n"
    (OUT / "coda_windows.md").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=512, help="local steps T per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--tuning-seeds", type=int, nargs="+", default=[100])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--update", action="store_true", help="replace only --methods' rows in the CSVs")
    parser.add_argument("--render-only", action="store_true", help="rewrite the .md from the CSVs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.render_only:
        print(render())
        return
    start = time.time()
    tuning, rows = [], []
    for method in args.methods:
        scores = {}
        for lr in LR_GRID:
            aucs = [
                run(method, TUNE_WINDOW, lr, s, args.steps, validation=True)["auroc"]
                for s in args.tuning_seeds
            ]
            scores[lr] = statistics.mean(0.0 if math.isnan(a) else a for a in aucs)  # diverged counts as 0
        chosen = max(scores, key=scores.get)
        tuning += [
            dict(method=method, lr=lr, val_auroc=v, chosen=lr == chosen, tuning_seeds=" ".join(map(str, args.tuning_seeds)))
            for lr, v in scores.items()
        ]  # fmt: skip
        print(
            f"[{time.time() - start:5.0f}s] {method}: validation AUROC by lr {scores} -> {chosen}", flush=True
        )
        for window in WINDOWS:
            runs = [run(method, window, chosen, s, args.steps) for s in args.seeds]
            final = [r["auroc"] for r in runs]
            row = {
                "method": method, "I": window, "lr": chosen, "rounds": runs[0]["rounds"],
                "final_auroc_mean": statistics.mean(final), "final_auroc_std": statistics.pstdev(final),
                "bytes_per_client": runs[0]["bytes"], "steps": args.steps,
                "seeds": " ".join(map(str, args.seeds)),
            }  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    OUT.mkdir(exist_ok=True)
    for name, new in (("coda_windows.csv", rows), ("coda_windows_tuning.csv", tuning)):
        old = _read(OUT / name) if args.update else []  # keep the other methods' rows
        write_csv(OUT / name, [r for r in old if r["method"] not in args.methods] + new)
    print(render())
    print(f"wall {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()

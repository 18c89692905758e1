"""CPU-scale reproductions of the FCSG paper's three experiments (docs/fcsg.md).

    nice -n 10 python benchmarks/fcsg.py invariant   # Fig. 1: test accuracy vs rounds
    nice -n 10 python benchmarks/fcsg.py auprc       # Table 2: final test AP
    nice -n 10 python benchmarks/fcsg.py maml        # Fig. 2-3: few-shot accuracy vs rounds

Each writes ``benchmarks/results/fcsg_<task>.csv`` and ``docs/figures/fcsg_<task>.png``.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.engines import Simulation
from fedxrisk.metrics import average_precision, predict
from fedxrisk.models import build_model
from fedxrisk.objectives.conditional import InvariantLogistic, MAMLObjective
from fedxrisk.problem import Problem
from fedxrisk.tasks import (
    AUPRCData,
    FewShotTasks,
    InvariantLRData,
    digits_fewshot,
    evaluate_fewshot,
    invariant_accuracy,
    table2_federated,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS, FIGURES = ROOT / "benchmarks" / "results", ROOT / "docs" / "figures"


def train(sim: Simulation, evaluate, every: int) -> list[tuple[int, float]]:
    """Run all rounds; evaluate the global model at round 0 and every ``every`` rounds."""
    curve = [(0, evaluate(*sim.global_model()))]
    while not sim.done:
        sim.run_round()
        if sim.round % every == 0 or sim.done:
            curve.append((sim.round, evaluate(*sim.global_model())))
    return curve


def write_csv(name: str, rows: list[dict]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"fcsg_{name}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


# -- Fig. 1: invariant logistic regression ---------------------------------------------------


def invariant(args) -> None:
    import matplotlib.pyplot as plt

    ratios, ms = (1.0, 1.5, 2.0), (1, 10, 100)
    algs = {"fcsg": {}, "fcsg_m": {"beta": args.beta}}
    rows = []
    fig, axes = plt.subplots(len(ms), len(ratios), figsize=(11, 8), sharex=True, sharey=True)
    for i, m in enumerate(ms):
        for j, ratio in enumerate(ratios):
            for alg, options in algs.items():
                for seed in range(args.seeds):
                    start = time.perf_counter()
                    data = InvariantLRData(16, 10, 1.0, ratio, m, 1, seed)
                    torch.manual_seed(seed)
                    problem = Problem(nn.Linear(10, 1, bias=False), 0.5)
                    algo = ALGORITHMS[alg](problem, objective=InvariantLogistic(1e-3, 10.0), **options)
                    schedule = Schedule.build(args.rounds, 50, args.lr)
                    sim = Simulation(algo, data, schedule, 1, seed, "vmap")
                    curve = train(
                        sim, lambda p, b, d=data, pr=problem: invariant_accuracy(pr, p, b, d), args.every
                    )
                    rows += [
                        dict(m=m, ratio=ratio, algorithm=alg, seed=seed, round=r, test_accuracy=a)
                        for r, a in curve
                    ]
                    print(f"m={m} σ2/σ1={ratio} {alg} seed {seed}: final acc {curve[-1][1]:.4f} "
                          f"({time.perf_counter() - start:.1f}s)", flush=True)  # fmt: skip
                mean = _mean_curve(rows, m=m, ratio=ratio, algorithm=alg)
                axes[i, j].plot(*mean, label=alg.upper().replace("_", "-"))
            axes[i, j].set_title(f"m = {m}, σ2/σ1 = {ratio}", fontsize=9)
            axes[i, j].grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("communication round")
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    axes[0, 0].legend()
    fig.suptitle(
        f"Invariant logistic regression, 16 clients, 50 local steps, lr {args.lr}, {args.seeds} seed(s)"
    )
    _save(fig, "invariant")
    print(write_csv("invariant", rows))


def _mean_curve(rows: list[dict], **match) -> tuple[list[int], list[float]]:
    sel = [r for r in rows if all(r[k] == v for k, v in match.items())]
    rounds = sorted({r["round"] for r in sel})
    return rounds, [float(np.mean([r["test_accuracy"] for r in sel if r["round"] == t])) for t in rounds]


def _save(fig, name: str) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(FIGURES / f"fcsg_{name}.png", dpi=110)
    print(FIGURES / f"fcsg_{name}.png")


# -- Table 2: online AUPRC maximization ------------------------------------------------------

AUPRC_ALGS = {  # name → (registry key, options, lr)
    "FedAvg (CE)": ("localsgdm", {}, 0.1),
    "CODA+": ("codaplus", {}, 1.0),
    "FCSG": ("fcsg", {}, 1.0),
    "FCSG-M": ("fcsg_m", {"beta": 0.5}, 1.0),
    "Acc-FCSG-M": ("acc_fcsg_m", {"beta": 0.5}, 1.0),
}


def auprc(args) -> None:
    import matplotlib.pyplot as plt

    rows = []
    datasets = args.datasets.split(",")
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    grid = [float(v) for v in args.lr_grid.split(",")] if args.lr_grid else []
    for ax, dataset in zip(axes[0], datasets):
        for label, (key, options, default_lr) in AUPRC_ALGS.items():
            lr = default_lr
            if grid:  # pick lr by final test AP of a tuning seed not used for the reported runs
                scores = {g: _auprc_run(args, dataset, key, options, g, TUNING_SEED)[0][-1][1] for g in grid}
                lr = max(scores, key=scores.get)
                print(f"{dataset} {label}: tuning-seed AP by lr {scores} → lr {lr}", flush=True)
            curves = []
            for seed in range(args.seeds):
                start = time.perf_counter()
                curve, bytes_up = _auprc_run(args, dataset, key, options, lr, seed)
                curves.append(curve)
                rows += [
                    dict(dataset=dataset, algorithm=label, lr=lr, seed=seed, round=r, test_ap=a,
                         bytes_up_per_client=bytes_up)
                    for r, a in curve
                ]  # fmt: skip
                print(f"{dataset} {label} lr {lr} seed {seed}: final AP {curve[-1][1]:.4f}, best "
                      f"{max(a for _, a in curve):.4f} ({time.perf_counter() - start:.1f}s)", flush=True)  # fmt: skip
            rounds = [r for r, _ in curves[0]]
            ax.plot(rounds, np.mean([[a for _, a in c] for c in curves], 0), label=f"{label} (lr {lr})")
        ax.set_title(f"{dataset}: Table 2 protocol, {args.clients} clients")
        ax.set_xlabel("communication round")
        ax.set_ylabel("test AP")
        ax.grid(alpha=0.3)
        ax.legend()
    _save(fig, "auprc")
    print(write_csv("auprc", rows))
    _auprc_table(rows, datasets)


TUNING_SEED = 100


def _auprc_run(args, dataset: str, key: str, options: dict, lr: float, seed: int):
    """One Table 2 run: (test-AP curve, bytes sent up per client)."""
    fed = table2_federated(dataset, args.clients, seed)
    problem = Problem(build_model("mlp", fed.data.input_shape, seed), fed.data.pos_ratio)
    algo = ALGORITHMS[key](problem, **options)
    data = AUPRCData(fed, args.outer_batch, seed) if key.startswith(("fcsg", "acc")) else fed
    schedule = Schedule.build(args.rounds, args.local_steps, lr)
    sim = Simulation(algo, data, schedule, args.batch_size, seed, "vmap")
    y_test = fed.data.y_test.numpy()
    curve = train(
        sim, lambda p, b: average_precision(y_test, predict(problem, p, b, fed.data.x_test)), args.every
    )
    return curve, sim.ledger.summary()["bytes_up_per_client"]


def _auprc_table(rows: list[dict], datasets: list[str]) -> None:
    print("| algorithm | " + " | ".join(f"{d} final AP | {d} best AP" for d in datasets) + " |")
    for label in AUPRC_ALGS:
        cells = []
        for d in datasets:
            sel = [r for r in rows if r["dataset"] == d and r["algorithm"] == label]
            last = max(r["round"] for r in sel)
            final = [r["test_ap"] for r in sel if r["round"] == last]
            best = [max(r["test_ap"] for r in sel if r["seed"] == s) for s in {r["seed"] for r in sel}]
            cells.append(f"{np.mean(final):.4f} ± {np.std(final):.4f} | {np.mean(best):.4f}")
        print(f"| {label} | " + " | ".join(cells) + " |")


# -- Fig. 2–3: federated MAML ----------------------------------------------------------------

MAML_ALGS = {
    "FCSG": ("fcsg", {}),
    "FCSG-M": ("fcsg_m", {"beta": 0.5}),
    "Acc-FCSG-M": ("acc_fcsg_m", {"beta": 0.5}),
    "Local-SCGD": ("local_scgd", {"gamma": 0.5}),
    "Local-SCGDM": ("local_scgdm", {"gamma": 0.5, "beta": 0.5}),
}


def maml_model(n_way: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, n_way)
    )


def maml(args) -> None:
    import matplotlib.pyplot as plt

    train_pool, test_pool = digits_fewshot()
    rows = []
    shots = [int(s) for s in args.shots.split(",")]
    fig, axes = plt.subplots(1, len(shots), figsize=(5.5 * len(shots), 4), squeeze=False)
    for ax, k_shot in zip(axes[0], shots):
        for label, (key, options) in MAML_ALGS.items():
            curves = []
            for seed in range(args.seeds):
                start = time.perf_counter()
                data = FewShotTasks(train_pool, args.clients, 5, k_shot, 15, args.meta_batch, seed)
                problem = Problem(maml_model(5, seed), 0.2)
                algo = ALGORITHMS[key](problem, objective=MAMLObjective(0.4), **options)
                sim = Simulation(
                    algo, data, Schedule.build(args.rounds, args.local_steps, args.lr), 1, seed, "vmap"
                )

                def test_acc(p, b, problem=problem, k_shot=k_shot):
                    return evaluate_fewshot(
                        problem, p, test_pool, 5, k_shot, 15, args.eval_tasks, args.eval_steps, 0.4, seed=123
                    )

                curve = train(sim, test_acc, args.every)
                curves.append(curve)
                rows += [
                    dict(k_shot=k_shot, algorithm=label, seed=seed, round=r, test_accuracy=a,
                         bytes_up_per_client=sim.ledger.summary()["bytes_up_per_client"])
                    for r, a in curve
                ]  # fmt: skip
                print(f"5-way {k_shot}-shot {label} seed {seed}: final acc {curve[-1][1]:.4f} "
                      f"({time.perf_counter() - start:.1f}s)", flush=True)  # fmt: skip
            rounds = [r for r, _ in curves[0]]
            ax.plot(rounds, np.mean([[a for _, a in c] for c in curves], 0), label=label)
        ax.set_title(f"digits ×4 rotations, 5-way {k_shot}-shot, {args.clients} clients")
        ax.set_xlabel("communication round")
        ax.set_ylabel(f"test accuracy ({args.eval_steps} adaptation step(s))")
        ax.grid(alpha=0.3)
        ax.legend()
    _save(fig, "maml")
    print(write_csv("maml", rows))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="task", required=True)
    p = sub.add_parser("invariant")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--every", type=int, default=4)
    p.set_defaults(fn=invariant)
    p = sub.add_parser("auprc")
    p.add_argument("--datasets", default="digits,synthetic")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--local-steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--outer-batch", type=int, default=8)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--lr-grid", default="0.1,0.3,1,3", help="comma-separated; empty: the table's lr")
    p.set_defaults(fn=auprc)
    p = sub.add_parser("maml")
    p.add_argument("--shots", default="1,5")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--meta-batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--eval-tasks", type=int, default=100)
    p.add_argument("--eval-steps", type=int, default=1, help="adaptation steps at test (paper: 3)")
    p.add_argument("--every", type=int, default=5)
    p.set_defaults(fn=maml)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.fn(args)


if __name__ == "__main__":
    main()

"""CPU-scale reproductions of the FCSG paper's three experiments (docs/fcsg.md).

    nice -n 10 python benchmarks/papers/fcsg.py invariant   # Fig. 1: test accuracy vs rounds
    nice -n 10 python benchmarks/papers/fcsg.py auprc       # Table 2: final test AP
    nice -n 10 python benchmarks/papers/fcsg.py maml        # Fig. 2-3: few-shot accuracy vs rounds
    python benchmarks/papers/fcsg.py auprc --render-only    # table + figure from the committed CSVs
                                                     # (invariant and maml too)

Each writes ``benchmarks/results/fcsg_<task>.csv``, ``docs/figures/fcsg_<task>.png`` and
``fcsg_<task>.md`` (the table in docs/fcsg.md); auprc and maml also ``fcsg_<task>_tuning.csv``
(validation scores per learning rate). Learning rates are chosen on validation
splits carved from the clients' training data, never on the test set.
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
from fedxrisk.data.validation import hold_out, hold_out_instances
from fedxrisk.engines import NonFiniteLoss, Simulation
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

ROOT = Path(__file__).resolve().parents[2]
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


INVARIANT_RATIOS, INVARIANT_MS = (1.0, 1.5, 2.0), (1, 10, 100)


def invariant(args) -> None:
    algs = {"fcsg": {}, "fcsg_m": {"beta": args.beta}}
    rows = []
    for m in INVARIANT_MS:
        for ratio in INVARIANT_RATIOS:
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
    print(write_csv("invariant", rows))
    render_invariant(args)


def render_invariant(args) -> None:
    """Figure and ``fcsg_invariant.md`` (accuracy at the middle and last round) from the CSV."""
    import matplotlib.pyplot as plt

    rows = read_csv("invariant")
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    seeds = len({r["seed"] for r in rows})
    last = max(r["round"] for r in rows)
    mid = min({r["round"] for r in rows}, key=lambda t: abs(t - last / 2))
    fig, axes = plt.subplots(
        len(INVARIANT_MS), len(INVARIANT_RATIOS), figsize=(11, 8), sharex=True, sharey=True
    )
    label = {a: a.upper().replace("_", "-") for a in algs}
    lines = [
        "| m | σ2/σ1 | " + " | ".join(f"{label[a]} r{t}" for t in (mid, last) for a in algs) + " |",
        "|---|---|" + "---|" * (2 * len(algs)),
    ]
    for i, m in enumerate(INVARIANT_MS):
        for j, ratio in enumerate(INVARIANT_RATIOS):
            curves = {a: _mean_curve(rows, m=m, ratio=ratio, algorithm=a) for a in algs}
            for a, curve in curves.items():
                axes[i, j].plot(*curve, label=label[a])
            axes[i, j].set_title(f"m = {m}, σ2/σ1 = {ratio}", fontsize=9)
            axes[i, j].grid(alpha=0.3)
            cells = [f"{dict(zip(*curves[a]))[t]:.4f}" for t in (mid, last) for a in algs]
            lines.append(f"| {m} | {ratio} | " + " | ".join(cells) + " |")
    for ax in axes[-1]:
        ax.set_xlabel("communication round")
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    axes[0, 0].legend()
    fig.suptitle(f"Invariant logistic regression, 16 clients, 50 local steps, lr {args.lr}, {seeds} seed(s)")
    _save(fig, "invariant")
    write_md("invariant", lines)


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

AUPRC_ALGS = {  # name → (registry key, options)
    "FedAvg (CE)": ("localsgdm", {}),
    "CODA+": ("codaplus", {}),
    "FCSG": ("fcsg", {}),
    "FCSG-M": ("fcsg_m", {"beta": 0.5}),
    "Acc-FCSG-M": ("acc_fcsg_m", {"beta": 0.5}),
}
TUNING_SEEDS = (100, 101)  # split, model and sampling seeds used only for the validation runs


def auprc(args) -> None:
    """Pick each method's lr by final validation AP (20 % of every client's training shard,
    tuning seeds only), then report the test AP of the seeds 0..S−1 at that lr."""
    rows, tuning = [], []
    grid = [float(v) for v in args.lr_grid.split(",")]
    start = time.perf_counter()
    for dataset in args.datasets.split(","):
        for label, (key, options) in AUPRC_ALGS.items():
            val = {
                lr: float(np.mean([_auprc_run(args, dataset, key, options, lr, s, True)[0][-1][1]
                                   for s in TUNING_SEEDS]))
                for lr in grid
            }  # fmt: skip
            lr = max(val, key=lambda g: np.nan_to_num(val[g], nan=-1.0))
            tuning += [
                dict(dataset=dataset, algorithm=label, lr=g, val_ap=v, chosen=g == lr) for g, v in val.items()
            ]
            print(
                f"[{time.perf_counter() - start:5.0f}s] {dataset} {label}: val AP {val} → lr {lr}", flush=True
            )
            for seed in range(args.seeds):
                curve, bytes_up = _auprc_run(args, dataset, key, options, lr, seed)
                rows += [
                    dict(dataset=dataset, algorithm=label, lr=lr, seed=seed, round=r, test_ap=a,
                         bytes_up_per_client=bytes_up)
                    for r, a in curve
                ]  # fmt: skip
                print(f"  seed {seed}: final test AP {curve[-1][1]:.4f}", flush=True)
    write_csv("auprc", rows)
    write_csv("auprc_tuning", tuning)
    render_auprc(args)


def _auprc_run(args, dataset: str, key: str, options: dict, lr: float, seed: int, validation: bool = False):
    """One Table 2 run: (AP curve, bytes sent up per client); with ``validation`` the clients
    train on 80 % of their shards and the AP is measured on the held-out 20 % (no test set)."""
    fed = table2_federated(dataset, args.clients, seed)
    if validation:
        fed = hold_out(fed, seed)
    problem = Problem(build_model("mlp", fed.data.input_shape, seed), fed.data.pos_ratio)
    algo = ALGORITHMS[key](problem, **options)
    data = AUPRCData(fed, args.outer_batch, seed) if key.startswith(("fcsg", "acc")) else fed
    schedule = Schedule.build(args.rounds, args.local_steps, lr)
    sim = Simulation(algo, data, schedule, args.batch_size, seed, "vmap")
    y_test = fed.data.y_test.numpy()
    every = args.rounds if validation else args.every
    try:
        curve = train(
            sim, lambda p, b: average_precision(y_test, predict(problem, p, b, fed.data.x_test)), every
        )
    except NonFiniteLoss:
        curve = [(args.rounds, float("nan"))]
    return curve, sim.ledger.summary()["bytes_up_per_client"]


def render_auprc(args) -> None:
    """Figure and Markdown table from the committed CSVs (no training)."""
    rows, tuning = read_csv("auprc"), read_csv("auprc_tuning")
    caption = (
        f"Test AP after the last round, mean ± std over {len({r['seed'] for r in rows})} seeds; lr chosen "
        f"by validation AP (grid {sorted({t['lr'] for t in tuning})}, tuning seeds {list(TUNING_SEEDS)})."
    )
    _render("auprc", rows, tuning, ("dataset", "test_ap", "val_ap"), AUPRC_ALGS, caption,
            lambda d: f"{d}: Table 2 protocol", "test AP", ("AP", 4))  # fmt: skip


# -- Fig. 2–3: federated MAML ----------------------------------------------------------------

MAML_ALGS = {
    "FCSG": ("fcsg", {}),
    "FCSG-M": ("fcsg_m", {"beta": 0.5}),
    "Acc-FCSG-M": ("acc_fcsg_m", {"beta": 0.5}),
    "Local-SCGD": ("local_scgd", {"gamma": 0.5}),  # per-task inner state (FCSG authors' baseline)
    "Local-SCGDM": ("local_scgdm", {"gamma": 0.5, "beta": 0.5}),
    "Local-SCGD (shared y)": ("local_scgd", {"gamma": 0.5, "inner_state": "shared"}),
    "Local-SCGDM (shared y)": ("local_scgdm", {"gamma": 0.5, "beta": 0.5, "inner_state": "shared"}),
}


def maml_model(n_way: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, n_way)
    )


def _maml_run(args, train_pool, eval_pool, key, options, k_shot, lr, seed, every):
    """One federated MAML run: (accuracy curve on ``eval_pool`` tasks, bytes up per client)."""
    data = FewShotTasks(train_pool, args.clients, 5, k_shot, 15, args.meta_batch, seed)
    problem = Problem(maml_model(5, seed), 0.2)
    algo = ALGORITHMS[key](problem, objective=MAMLObjective(0.4), **options)
    sim = Simulation(algo, data, Schedule.build(args.rounds, args.local_steps, lr), 1, seed, "vmap")

    def accuracy(p, b):
        return evaluate_fewshot(
            problem, p, eval_pool, 5, k_shot, 15, args.eval_tasks, args.eval_steps, 0.4, seed=123
        )

    try:
        curve = train(sim, accuracy, every)
    except NonFiniteLoss:
        curve = [(args.rounds, float("nan"))]
    return curve, sim.ledger.summary()["bytes_up_per_client"]


def maml(args) -> None:
    """Pick each method's meta lr by the final accuracy on validation tasks (held-out 20 % of
    the training classes' instances, tuning seed only), then report test-class accuracy."""
    train_pool, test_pool = digits_fewshot()
    fit_pool, val_pool = hold_out_instances(train_pool, TUNING_SEEDS[0])
    rows, tuning = [], []
    grid = [float(v) for v in args.lr_grid.split(",")]
    start = time.perf_counter()
    for k_shot in [int(s) for s in args.shots.split(",")]:
        for label, (key, options) in MAML_ALGS.items():
            val = {
                lr: _maml_run(args, fit_pool, val_pool, key, options, k_shot, lr, TUNING_SEEDS[0], args.rounds)[0][-1][1]
                for lr in grid
            }  # fmt: skip
            lr = max(val, key=lambda g: np.nan_to_num(val[g], nan=-1.0))
            tuning += [
                dict(k_shot=k_shot, algorithm=label, lr=g, val_accuracy=v, chosen=g == lr)
                for g, v in val.items()
            ]
            print(
                f"[{time.perf_counter() - start:5.0f}s] {k_shot}-shot {label}: val {val} → lr {lr}",
                flush=True,
            )
            for seed in range(args.seeds):
                curve, bytes_up = _maml_run(
                    args, train_pool, test_pool, key, options, k_shot, lr, seed, args.every
                )
                rows += [
                    dict(k_shot=k_shot, algorithm=label, lr=lr, seed=seed, round=r, test_accuracy=a,
                         bytes_up_per_client=bytes_up)
                    for r, a in curve
                ]  # fmt: skip
                print(f"  seed {seed}: final test accuracy {curve[-1][1]:.4f}", flush=True)
    write_csv("maml", rows)
    write_csv("maml_tuning", tuning)
    render_maml(args)


def render_maml(args) -> None:
    """Figure and Markdown table from the committed CSVs (no training)."""
    rows, tuning = (
        [dict(r, k_shot=f"{r['k_shot']}-shot") for r in read_csv(n)] for n in ("maml", "maml_tuning")
    )
    caption = (
        f"Test-class accuracy after the last round, mean ± std over {len({r['seed'] for r in rows})} seeds; "
        f"meta lr chosen by validation accuracy (grid {sorted({t['lr'] for t in tuning})}, tuning seed "
        f"{TUNING_SEEDS[0]})."
    )
    _render("maml", rows, tuning, ("k_shot", "test_accuracy", "val_accuracy"), MAML_ALGS, caption,
            lambda k: f"digits ×4 rotations, 5-way {k}", "test accuracy (1 adaptation step)", ("acc", 3))  # fmt: skip


def _render(name, rows, tuning, keys, labels, caption, title, ylabel, metric) -> None:
    """Mean test curves per group (dataset or shots) and the table: per group the chosen lr, its
    validation score and the final test score (mean ± std over seeds), then the bytes."""
    import matplotlib.pyplot as plt

    group, test_key, val_key = keys
    short, digits = metric
    groups = list(dict.fromkeys(r[group] for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False)
    lines = [caption, "", "| algorithm | " + " | ".join(
        f"{g}: lr | {g}: val {short} | {g}: test {short} | {g}: bytes up / client" for g in groups
    ) + " |", "|---|" + "---|---|---|---|" * len(groups)]  # fmt: skip
    cells = {label: [] for label in labels}
    for ax, g in zip(axes[0], groups):
        for label in labels:
            sel = [r for r in rows if r[group] == g and r["algorithm"] == label]
            rounds = sorted({r["round"] for r in sel})
            mean = [np.mean([r[test_key] for r in sel if r["round"] == t]) for t in rounds]
            ax.plot(
                rounds, mean, label=f"{label} (lr {sel[0]['lr']:g})", ls="--" if "shared" in label else "-"
            )
            final = [r[test_key] for r in sel if r["round"] == rounds[-1]]
            chosen = next(t for t in tuning if t[group] == g and t["algorithm"] == label and t["chosen"])
            cells[label].append(
                f"{chosen['lr']:g} | {chosen[val_key]:.{digits}f} | {np.mean(final):.{digits}f} ± "
                f"{np.std(final):.{digits}f} | {int(sel[0]['bytes_up_per_client']):,}"
            )
        ax.set_title(title(g))
        ax.set_xlabel("communication round")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, name)
    lines += [f"| {label} | " + " | ".join(row) + " |" for label, row in cells.items()]
    write_md(name, lines)


def read_csv(name: str) -> list[dict]:
    """Rows of ``benchmarks/results/fcsg_<name>.csv`` with numbers and booleans parsed."""

    def parse(v: str):
        if v in ("True", "False"):
            return v == "True"
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v

    with open(RESULTS / f"fcsg_{name}.csv", newline="") as f:
        return [{k: parse(v) for k, v in r.items()} for r in csv.DictReader(f)]


def write_md(name: str, lines: list[str]) -> None:
    path = RESULTS / f"fcsg_{name}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(path)


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
    p.add_argument("--render-only", action="store_true", help="redraw figure and table from the CSV")
    p.set_defaults(fn=invariant, render=render_invariant)
    p = sub.add_parser("auprc")
    p.add_argument("--datasets", default="digits,synthetic")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--local-steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--outer-batch", type=int, default=8)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--lr-grid", default="0.1,0.3,1,3", help="comma-separated learning rates")
    p.add_argument("--render-only", action="store_true", help="redraw figure and table from the CSVs")
    p.set_defaults(fn=auprc, render=render_auprc)
    p = sub.add_parser("maml")
    p.add_argument("--shots", default="1,5")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--meta-batch", type=int, default=4)
    p.add_argument("--lr-grid", default="0.03,0.1,0.3,1", help="comma-separated meta learning rates")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--eval-tasks", type=int, default=100)
    p.add_argument("--eval-steps", type=int, default=1, help="adaptation steps at test (paper: 3)")
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--render-only", action="store_true", help="redraw figure and table from the CSVs")
    p.set_defaults(fn=maml, render=render_maml)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if getattr(args, "render_only", False):
        return args.render(args)
    args.fn(args)


if __name__ == "__main__":
    main()

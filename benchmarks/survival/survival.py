"""Federated survival on Fed-TCGA-BRCA (issue 35): FLamby's split and metric, equal selection budgets.

Data: FLamby's ``fed_tcga_brca`` files in ``--data`` (default ``../shared/data/tcga-brca``; never
copied here): six regions = six clients (``partition = source``), FLamby's static train/test
split, 39 clinical features standardized on the training rows, ``nn.Linear(39 → 1)`` as FLamby.

Protocol, the same for every row:

1. Validation: per seed, 20 % of every client's training patients per event class (at least
   one when a class has ≥ 2), seeded by (seed, 35, client); the clients train on the rest.
   The test sets never choose anything.
2. Each row trains ``ROUNDS`` rounds of ``LOCAL_STEPS`` local steps, batch ``BATCH``, at each
   of the three learning rates of its grid (a factor 3 apart around the default); every
   ``EVAL_EVERY`` rounds the pooled validation C-index is computed; the (lr, round) with the
   best validation C-index is the row's model for that seed. Same grid size, rounds and
   evaluations for every row. A run that diverges (NaN) stops there and keeps its best
   earlier round, as ``selection = "best"`` does; the table counts such runs.
3. Metrics of the selected model, FLamby's two conventions: the mean of the six regions' test
   C-indices (Harrell's, lifelines' convention: ``fedxrisk.stats.concordance``) and the C-index
   on the pooled test set.
4. Rows: ``fedavg_cox`` (FLamby's baseline: the Cox loss of each local batch), ``fedxl2_cox``
   (the Cox partial likelihood with risk sets across regions), ``fedxl1_cindex`` (smoothed
   C-index over pairs across regions), each also with the server optimizer ``--server-opt``
   (FedAdam: ``adam``; Reddi et al. 2021, ``fedxrisk.engines.server_opt``; its three-point grid
   is over the server's step around ``SERVER_LR``, the sites keeping the row's default lr);
   ``pooled`` (one client holding every training patient, the batch Cox loss, batch 6·B: the same steps and samples per step); ``local<r>``
   (region r alone, its own validation).
5. Paired tests across the seeds against ``fedavg_cox`` (paired t-test on the mean regional
   C-index) and, per seed, a paired bootstrap of the pooled test C-index difference.

    nice -n 10 python benchmarks/survival/survival.py --data ../shared/data/tcga-brca     # the study
    python benchmarks/survival/survival.py --render-only                                  # the table
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
OUT_JSON, OUT_MD = RESULTS / "survival.json", RESULTS / "survival.md"
ROUNDS, LOCAL_STEPS, BATCH, EVAL_EVERY = 60, 8, 16, 5
SEEDS = tuple(range(10))  # ≥ 5 asked; the study is cheap (minutes), so ten for the paired tests
GRID_FACTORS = (1 / 3, 1.0, 3.0)
SERVER_LR = 0.03  # the centre of a server row's grid (Reddi et al. 2021 tune FedAdam's η around 1e-2–1e-1)
FLAMBY = {  # FLamby's published Fed-TCGA-BRCA numbers (5 seeds): mean regional test C-index, pooled test
    "FedAvg": (0.732, 0.735), "FedProx": (0.729, None), "SCAFFOLD": (0.687, None),
    "FedAdam / FedYogi": (0.815, 0.842), "FedAdagrad": (0.813, None), "pooled training": (0.676, 0.704),
    "best local (region 1)": (0.750, None),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    algorithm: str  # a key of SURVIVAL_ALGORITHMS
    clients: str = "federated"  # "federated", "pooled" or "local<r>"
    server: str | None = None  # a server optimizer (when the library has them)


def rows(server_opt: str | None) -> list[Row]:
    out = [
        Row("fedavg_cox", "fedavg_cox"),
        Row("fedxl2_cox", "fedxl2_cox"),
        Row("fedxl1_cindex", "fedxl1_cindex"),
    ]
    if server_opt:
        out += [Row(f"{r.name}+{server_opt}", r.algorithm, server=server_opt) for r in list(out)]
    out.append(Row("pooled", "fedavg_cox", "pooled"))
    out += [Row(f"local{r}", "fedavg_cox", f"local{r}") for r in range(6)]
    return out


def load(data_dir: str):
    from fedxrisk.data import make_federated
    from fedxrisk.data.readers.survival import read_tcga_brca
    from fedxrisk.data.types import binarize

    return make_federated(binarize(read_tcga_brca(data_dir)), 6, "source", None, 0, allow_missing_class=True)


def carve(fed, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(training, validation) positions of every client, per event class (protocol step 1)."""
    y = fed.data.y_train.numpy()
    train, val = [], []
    for k, shard in enumerate(fed.shards):
        rng = np.random.default_rng([seed, 35, k])
        held = []
        for c in (0, 1):
            members = rng.permutation(shard[y[shard] == c])
            n = len(members)
            held.append(members[: min(max(1, round(0.2 * n)), n - 1) if n >= 2 else 0])
        v = np.sort(np.concatenate(held))
        val.append(v)
        train.append(np.setdiff1d(shard, v))
    return train, val


def c_index_of(scores: np.ndarray, times: np.ndarray, events: np.ndarray) -> float:
    from fedxrisk.stats.concordance import c_index

    try:
        return c_index(times, events, scores)
    except ValueError:
        return float("nan")


def scores_of(sim, x: torch.Tensor) -> np.ndarray:
    params, buffers = sim.global_model()
    with torch.no_grad():
        logits, _ = sim.algorithm.problem.logits(params, buffers, x, train=False)
    return logits.double().numpy()


def train_cell(fed, row: Row, lr: float, seed: int) -> dict[str, Any]:
    """One (row, lr, seed): train, evaluating validation every EVAL_EVERY rounds; the best round's
    test metrics."""
    from fedxrisk.algorithms import Schedule
    from fedxrisk.algorithms.survival import SURVIVAL_ALGORITHMS
    from fedxrisk.data.federated import FederatedData
    from fedxrisk.engines import Simulation
    from fedxrisk.engines.server_opt import ServerOptimizer, with_server_optimizer
    from fedxrisk.errors import NonFiniteLoss
    from fedxrisk.problem import Problem

    train, val = carve(fed, seed)
    batch = BATCH
    if row.clients == "pooled":
        train, val, batch = [np.sort(np.concatenate(train))], [np.sort(np.concatenate(val))], BATCH * 6
    elif row.clients.startswith("local"):
        r = int(row.clients[5:])
        train, val = [train[r]], [val[r]]
    data = FederatedData(fed.data, train)
    torch.manual_seed(seed)
    net = nn.Linear(fed.data.input_shape[0], 1)
    algorithm = SURVIVAL_ALGORITHMS[row.algorithm](Problem(net, fed.data.pos_ratio))
    if row.server:  # the grid is over the server's step; the sites keep the algorithm's default lr
        algorithm = with_server_optimizer(algorithm, ServerOptimizer(row.server, lr=lr))
        lr = SURVIVAL_ALGORITHMS[row.algorithm].default_lr
    sim = Simulation(algorithm, data, Schedule.build(ROUNDS, LOCAL_STEPS, lr, 1), batch, seed, "vmap")
    times_tr = fed.data.groups_train["time"]
    vrows = np.concatenate(val)
    xv, tv, ev = fed.data.x_train[torch.from_numpy(vrows)], times_tr[vrows], fed.data.y_train.numpy()[vrows]
    te = fed.data.groups_test
    best = {"val": -1.0}
    while not sim.done:
        try:
            sim.run_round()
        except NonFiniteLoss:  # a diverged run keeps its best earlier round; with none it ranks last
            best["diverged_at"] = sim.round + 1
            break
        if sim.round % EVAL_EVERY and not sim.done:
            continue
        s = scores_of(sim, xv)
        v = c_index_of(s, tv, ev) if np.isfinite(s).all() else float("nan")
        if np.isfinite(v) and v > best["val"]:
            test = scores_of(sim, fed.data.x_test)
            best = {"val": v, "round": sim.round, "test_scores": test.tolist()}
    if "test_scores" not in best:
        return {
            **best,
            "val": float("nan"),
            "round": None,
            "regional": [float("nan")] * 6,
            "pooled": float("nan"),
        }
    test = np.array(best["test_scores"])
    y_te = fed.data.y_test.numpy()
    regional = [c_index_of(test[te["source"] == r], te["time"][te["source"] == r], y_te[te["source"] == r])
                for r in range(6)]  # fmt: skip
    return {**best, "regional": regional, "pooled": c_index_of(test, te["time"], y_te)}


def run_study(data_dir: str, server_opt: str | None, seeds: tuple[int, ...]) -> dict[str, Any]:
    from fedxrisk.algorithms.survival import SURVIVAL_ALGORITHMS

    fed = load(data_dir)
    results = json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() else {"cells": {}}
    for row in rows(server_opt):
        default = SERVER_LR if row.server else SURVIVAL_ALGORITHMS[row.algorithm].default_lr
        for seed in seeds:
            for factor in GRID_FACTORS:
                lr = default * factor
                key = f"{row.name}|{seed}|{lr:.6g}"
                if key in results["cells"]:
                    continue
                t0 = time.process_time()
                cell = train_cell(fed, row, lr, seed)
                cell["cpu_s"] = round(time.process_time() - t0, 2)
                results["cells"][key] = cell
                OUT_JSON.write_text(json.dumps(results, indent=1))
                print(f"{key}: val {cell['val']:.4f} regional {np.nanmean(cell['regional']):.4f} "
                      f"pooled {cell['pooled']:.4f}", flush=True)  # fmt: skip
    return results


def selected(results: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per row and seed, the cell with the best validation C-index over the lr grid."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for key, cell in results["cells"].items():
        name, seed, lr = key.split("|")
        out.setdefault(name, {})
        if "test_scores" not in cell:  # no validation value at any round (diverged, or nothing comparable)
            continue
        best = out[name].get(int(seed))
        val = cell["val"] if np.isfinite(cell["val"]) else -1.0
        if best is None or val > (best["val"] if np.isfinite(best["val"]) else -1.0):
            out[name][int(seed)] = {**cell, "lr": float(lr)}
    return out


def paired_bootstrap_p(a: np.ndarray, b: np.ndarray, times, events, draws: int = 1000) -> float:
    """Two-sided p of the pooled-test C-index difference a − b over patient resamples (same patients)."""
    rng = np.random.default_rng(0)
    n, diffs = len(times), []
    for _ in range(draws):
        i = rng.integers(0, n, n)
        diffs.append(c_index_of(a[i], times[i], events[i]) - c_index_of(b[i], times[i], events[i]))
    diffs = np.array(diffs)
    diffs = diffs[np.isfinite(diffs)]
    return float(min(1.0, 2 * min((diffs <= 0).mean(), (diffs >= 0).mean())))


def _versus(per_seed: dict, base: dict) -> str:
    """Mean regional C-index difference to ``base`` over the common seeds, with the paired t-test."""
    from scipy.stats import ttest_rel

    common = [s for s in sorted(per_seed) if s in base]
    if per_seed is base or len(common) < 2:
        return "—"
    a = np.array([np.nanmean(per_seed[s]["regional"]) for s in common])
    b = np.array([np.nanmean(base[s]["regional"]) for s in common])
    return f"{(a - b).mean():+.3f}, p = {ttest_rel(a, b).pvalue:.3f}"


def _bootstrap_counts(per_seed: dict, base: dict, fed) -> str:
    """Seeds whose pooled-test C-index differs from ``base``'s at p < 0.05 (paired bootstrap): up / down."""
    common = [s for s in sorted(per_seed) if s in base]
    if per_seed is base or fed is None or not common:
        return "—"
    te, y = fed.data.groups_test, fed.data.y_test.numpy()
    up = down = 0
    for s in common:
        sa, sb = np.array(per_seed[s]["test_scores"]), np.array(base[s]["test_scores"])
        if paired_bootstrap_p(sa, sb, te["time"], y, 300) < 0.05:
            up += per_seed[s]["pooled"] > base[s]["pooled"]
            down += per_seed[s]["pooled"] < base[s]["pooled"]
    return f"{up} / {down}"


def patient_ci(per_seed: dict, fed, draws: int = 1000) -> str:
    """95 % patient-bootstrap intervals of the row's seed-mean regional and pooled test C-index: each
    draw resamples the test patients within each region (the same draws for every seed and row),
    every seed's selected model is scored on it, and the seeds' values are averaged."""
    from fedxrisk.stats.survival import bootstrap_draws

    if fed is None or not per_seed:
        return "—"
    te, y = fed.data.groups_test, fed.data.y_test.numpy()
    pooled, regional = zip(*(bootstrap_draws(te["time"], y, np.array(c["test_scores"]), te["source"], draws)
                             for c in per_seed.values()))  # fmt: skip
    with np.errstate(invalid="ignore"):
        reg, pool = np.nanmean(np.stack(regional), 0), np.nanmean(np.stack(pooled), 0)
    lo_r, hi_r = np.nanquantile(reg, [0.025, 0.975])
    lo_p, hi_p = np.nanquantile(pool, [0.025, 0.975])
    return f"[{lo_r:.3f}, {hi_r:.3f}] / [{lo_p:.3f}, {hi_p:.3f}]"


def test_events(fed) -> str:
    """Test patients and events per region (what each regional C-index rests on)."""
    te, y = fed.data.groups_test, fed.data.y_test.numpy()
    cells = [f"region {r}: {int((te['source'] == r).sum())} patients, {int(y[te['source'] == r].sum())} events"
             for r in range(6)]  # fmt: skip
    return "Test set per region: " + "; ".join(cells) + f"; pooled: {len(y)} patients, {int(y.sum())} events."


def render(results: dict[str, Any], data_dir: str | None) -> str:
    sel = selected(results)
    base, adam = sel.get("fedavg_cox", {}), sel.get("fedavg_cox+adam")
    fed = load(data_dir) if data_dir else None
    lines = [
        "| row | mean regional test C-index (mean ± SD over seeds) | pooled test C-index (mean ± SD over seeds) "
        "| patient-bootstrap 95% CI over the test patients: mean regional / pooled | vs fedavg_cox (regional, paired t) "
        "| vs fedavg_cox+adam (regional, paired t) | vs fedavg_cox: seeds with pooled-test p < 0.05 "
        "(paired bootstrap) up / down | selected lr (server rows: the server's step) | runs that diverged (NaN) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, per_seed in sel.items():
        seeds = sorted(per_seed)
        if not seeds:
            lines.append(f"| {name} | no validation C-index at any lr and seed (its validation part has no "
                         "comparable pair) | — | — | — | — | — | — | — |")  # fmt: skip
            continue
        reg = np.array([np.nanmean(per_seed[s]["regional"]) for s in seeds])
        pooled = np.array([per_seed[s]["pooled"] for s in seeds])
        lrs = sorted({per_seed[s]["lr"] for s in seeds})
        name_cells = [c for k, c in results["cells"].items() if k.split("|")[0] == name]
        diverged = sum("diverged_at" in c for c in name_cells)
        lines.append(
            f"| {name} | {np.nanmean(reg):.3f} ± {np.nanstd(reg):.3f} | {np.nanmean(pooled):.3f} ± "
            f"{np.nanstd(pooled):.3f} | {patient_ci(per_seed, fed)} | {_versus(per_seed, base)} | {'—' if adam is None else _versus(per_seed, adam)} "
            f"| {_bootstrap_counts(per_seed, base, fed)} | {', '.join(f'{v:.3g}' for v in lrs)} "
            f"| {diverged} of {len(name_cells)} |"
        )
    if fed is not None:
        lines += ["", test_events(fed), "± is the SD of the row's value over the training seeds (the same test "
                  "patients); the bracketed intervals resample the test patients (1,000 draws within each region)."]  # fmt: skip
    lines += ["", "Each region's test C-index (mean over the seeds), federated and pooled rows: where a row's "
              "mean regional value comes from (events per region above).", "",
              "| row | " + " | ".join(f"region {r}" for r in range(6)) + " |", "|---|" + "---|" * 6]  # fmt: skip
    for name, per_seed in sel.items():
        if per_seed and not name.startswith("local"):
            by_region = np.nanmean(np.array([per_seed[s]["regional"] for s in sorted(per_seed)], float), 0)
            lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in by_region) + " |")
    lines += ["", "FLamby's published numbers on the same split (5 seeds; their training budgets):", "",
              "| FLamby row | mean regional test C-index | pooled test C-index |", "|---|---|---|"]  # fmt: skip
    for name, (reg, pooled) in FLAMBY.items():
        lines.append(f"| {name} | {reg:.3f} | {'—' if pooled is None else f'{pooled:.3f}'} |")
    cpu = sum(c.get("cpu_s", 0) for c in results["cells"].values())
    seeds = sorted({int(k.split("|")[1]) for k in results["cells"]})
    lines += ["", f"{len(results['cells'])} cells, {cpu / 60:.1f} CPU minutes; seeds {seeds}; {ROUNDS} rounds × "
              f"{LOCAL_STEPS} local steps, batch {BATCH}, validation every {EVAL_EVERY} rounds."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "tcga-brca"))
    p.add_argument(
        "--server-opt", default=None, help="also run every federated row with this server optimizer"
    )
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--render-only", action="store_true")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    torch.set_num_threads(1)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    results = (
        json.loads(OUT_JSON.read_text()) if args.render_only else run_study(args.data, args.server_opt, seeds)
    )
    OUT_MD.write_text(render(results, args.data if Path(args.data).is_dir() else None))
    print(OUT_MD.read_text())


if __name__ == "__main__":
    main()

"""Where do the AUC methods beat cross-entropy? The evidence study of issue 15 (docs/evidence.md).

Protocol (every method gets the same budget):

1. Each client's training shard is split, per class, into 80 % training and
   20 % validation (seeded); every run trains on the 80 % only. The union of
   the 20 % parts is the validation set. The test set is never used to choose.
2. Selection (seed 0): every method runs each learning rate of its grid
   (``LR_GRIDS``: three values a factor 3 apart; no other knob is tuned) and
   keeps the one with the best *validation* value of its own target metric
   (AUROC; FeDXL2: pAUC(FPR ≤ 0.3); FCSG-M: AP). Learning rates are selected on
   the class-heterogeneous partition of each imratio and reused for iid.
3. Final: the selected learning rate on seeds 0, 1, 2 (seed 0 is the selection
   run itself: same data, same training, its test metrics are read only here).
   Test AUROC, AP, pAUC(FPR ≤ 0.3, normalized) as mean ± std, and per-seed
   paired differences against CE FedAvg.
4. Two-stage: the AUC method starts from the final model of CE FedAvg
   (same regime, seed and selected CE learning rate) and runs half the steps.

Results go to ``benchmarks/results/evidence.json`` after every run (resumable:
finished cells are skipped); ``--render-only`` rebuilds the tables
(``benchmarks/results/evidence*.md``) and figures (``docs/figures/evidence_*.png``).

    nice -n 5 python benchmarks/evidence.py            # the study (hours on one core)
    python benchmarks/evidence.py --render-only        # tables and figures from the JSON
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "figures"
CACHE = ROOT / "runs" / "evidence_v2_cache"  # pretrained CE models for two-stage runs (not committed)
STEM = "evidence_v2"  # v1 (evidence.json) ran older code and had no CE → CE control; never mixed in
OUT = RESULTS / f"{STEM}.json"  # merged from the parts evidence_v2.<part>.json that workers write
SOURCES = RESULTS / f"{STEM}_sources.json"  # source fingerprint → {file: sha256} of the cells' code
PART = {"name": "main"}

CLIENTS, BATCH, LOCAL_STEPS, STAGES, LR_DECAY = 16, 32, 8, 3, 3.0
POSITIVES = 8  # class-aware batches: r = 8/32 = 0.25 (LibAUC's DualSampler default rate is 0.2)
VAL_FRACTION = 0.2
EVAL_EVERY = 10  # rounds between validation evaluations (the curves)
SEEDS = (0, 1, 2)
EXTRA_SEEDS = (3, 4)  # CE, CE → CE, CE long and CE → CODASCA (code): the paired tests need them
ALL_SEEDS = SEEDS + EXTRA_SEEDS
# three learning rates a factor 3 apart per method (the same budget for all), placed around
# each algorithm's default_lr; LocalSCGDAM's top is 0.1 because Alg. 1 needs α·η < 1 (α = 9)
LR_GRIDS: dict[str, tuple[float, ...]] = {
    "ce": (0.1, 0.3, 1.0),
    "ce_long": (0.1, 0.3, 1.0),
    "ce_ca": (0.1, 0.3, 1.0),
    "codasca_paper": (1.0, 3.0, 10.0),
    "codasca_code": (1.0, 3.0, 10.0),
    "localscgdam": (0.011, 0.033, 0.1),
    "fedxl2": (0.5, 1.5, 5.0),
    "fcsg_m": (0.1, 0.3, 1.0),
    "codasca_plain": (1.0, 3.0, 10.0),
}

# name → (algorithm, options, positives per batch, target metric)
METHODS: dict[str, tuple[str, dict[str, Any], int, str]] = {
    "ce": ("localsgdm", {}, 0, "auroc"),
    "ce_long": ("localsgdm", {}, 0, "auroc"),  # CE for HORIZON × the steps: the extra-steps control
    "ce_ca": ("localsgdm", {}, POSITIVES, "auroc"),
    "codasca_paper": ("codasca", {"form": "paper"}, POSITIVES, "auroc"),
    "codasca_code": ("codasca", {"form": "code"}, POSITIVES, "auroc"),
    "localscgdam": ("localscgdam", {}, POSITIVES, "auroc"),
    "fedxl2": ("fedxl2", {}, POSITIVES, "pauc"),
    "fcsg_m": ("fcsg_m", {}, POSITIVES, "ap"),
    "codasca_plain": ("codasca", {"form": "paper"}, 0, "auroc"),  # the default run's batches
}
HORIZON = {"ce_long": 1.5}  # = CE's steps + a two-stage second stage (half of CE's)
SANITY_ONLY = ("codasca_plain",)  # `fedxrisk run`'s default pipeline: plain batches, data's p
LABELS = {
    "ce": "CE FedAvg",
    "ce_long": "CE FedAvg, 1.5× steps",
    "ce_ca": "CE FedAvg, class-aware",
    "codasca_paper": "CODASCA (paper)",
    "codasca_code": "CODASCA (code)",
    "localscgdam": "LocalSCGDAM",
    "fedxl2": "FeDXL2 (pAUC)",
    "fcsg_m": "FCSG-M (AP)",
    "codasca_plain": "CODASCA (paper), plain batches",
}
# CE continued from CE (CE → CE) is the control every two-stage row is compared with
TWO_STAGE = [m for m in METHODS if m not in ("ce_long", *SANITY_ONLY)]


def mnist1d(imratio: float, partition: str) -> dict[str, Any]:
    return {"dataset": "mnist1d", "num_samples": 20000, "model": "cnn1d", "imratio": imratio,
            "partition": partition, "rounds": 200}  # fmt: skip


# name → data/model settings; "select_on": the regime whose selected learning rates it reuses
REGIMES: dict[str, dict[str, Any]] = {
    "digits": {"dataset": "digits", "model": "mlp", "imratio": 0.1, "partition": "class", "rounds": 60},
    "breast_cancer": {
        "dataset": "breast_cancer",
        "model": "mlp",
        "imratio": None,
        "partition": "iid",
        "rounds": 60,
    },  # fmt: skip
    "mnist1d 0.1 class": mnist1d(0.1, "class"),
    "mnist1d 0.02 class": mnist1d(0.02, "class"),
    "mnist1d 0.02 iid": {**mnist1d(0.02, "iid"), "select_on": "mnist1d 0.02 class"},
    "mnist1d 0.1 iid": {**mnist1d(0.1, "iid"), "select_on": "mnist1d 0.1 class"},
    "mnist1d 0.005 class": mnist1d(0.005, "class"),
}
SANITY = ("digits", "breast_cancer")  # from scratch only


# -- data ------------------------------------------------------------------------------------
def split_validation(fed, seed: int):
    """(train shards, validation indices): per client and class, VAL_FRACTION of the shard
    (at least one sample of a class the client holds twice or more) becomes validation."""
    y = fed.data.y_train.numpy()
    train, val = [], []
    for k, shard in enumerate(fed.shards):
        rng = np.random.default_rng([seed, 15, k])
        keep = []
        for c in (0, 1):
            members = rng.permutation(shard[y[shard] == c])
            n_val = max(1, round(VAL_FRACTION * len(members))) if len(members) >= 2 else 0
            val.append(members[:n_val])
            keep.append(members[n_val:])
        train.append(np.sort(np.concatenate(keep)))
    return train, np.sort(np.concatenate(val))


_DATA: dict[tuple, Any] = {}


def regime_data(regime: str, seed: int):
    """(FederatedData on the training parts, validation indices), cached per process."""
    from fedxrisk.data import FederatedData, make_federated

    key = (regime, seed)
    if key not in _DATA:
        r = REGIMES[regime]
        fed = make_federated(
            r["dataset"], CLIENTS, r["partition"], r["imratio"], seed,
            allow_missing_class=True, num_samples=r.get("num_samples"),
        )  # fmt: skip
        shards, val = split_validation(fed, seed)
        if len(_DATA) >= 10:  # a few MB each; generating mnist1d takes ~45 s, so keep several
            _DATA.pop(next(iter(_DATA)))
        _DATA[key] = (FederatedData(fed.data, shards), val)
    return _DATA[key]


# -- one run ---------------------------------------------------------------------------------
def metrics_of(problem, params, buffers, x, y) -> dict[str, float]:
    from fedxrisk.metrics import auroc, average_precision, partial_auroc, predict

    s = predict(problem, params, buffers, x)
    y = y.numpy()
    return {"auroc": auroc(y, s), "ap": average_precision(y, s), "pauc": partial_auroc(y, s, 0.3)}


def build_simulation(regime: str, method: str, lr: float, seed: int, rounds: int, init: Path | None):
    """The Simulation of one cell; ``init``: a saved CE model the AUC method starts from (two-stage)."""
    import torch

    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.classaware import use_class_aware_batches
    from fedxrisk.engines import Simulation
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem

    fed, val = regime_data(regime, seed)
    r, (alg, options, positives, _) = REGIMES[regime], METHODS[method]
    model = build_model(r["model"], fed.data.input_shape, seed)
    if init is not None:
        load_pretrained(model, init)
    problem = Problem(model, fed.data.pos_ratio)
    algorithm = ALGORITHMS[alg](problem, **options)
    use_class_aware_batches(algorithm, positives, BATCH)
    schedule = Schedule.build(rounds, LOCAL_STEPS, lr, STAGES, LR_DECAY, 1.0)
    sim = Simulation(algorithm, fed, schedule, BATCH, seed, "vmap")
    torch.manual_seed(seed)
    return sim, problem, fed, val


def load_pretrained(model, path: Path) -> None:
    """Two-stage: the model's parameters and buffers become the saved CE model's, exactly
    (the library's ``init_from`` loader, as ``fedxrisk run --init-from`` uses it)."""
    from fedxrisk.init_from import load_weights

    load_weights(model, "pretrained CE model", path)


def run_cell(
    regime: str, method: str, lr: float, seed: int, two_stage: bool, stretch: int = 1
) -> dict[str, Any]:
    """Train one cell; validation curve every EVAL_EVERY rounds, final val and test metrics.
    ``stretch``: train that many times longer (CE's horizon check, not part of any table)."""
    import torch

    from fedxrisk.engines import NonFiniteLoss

    rounds = round(REGIMES[regime]["rounds"] * HORIZON.get(method, 1.0)) * stretch // (2 if two_stage else 1)
    init = pretrained_path(regime, seed) if two_stage else None
    if init is not None and not init.exists():
        raise RuntimeError(f"two-stage {regime} seed {seed}: the CE model {init} is missing")
    start = time.perf_counter()
    try:
        sim, problem, fed, val = build_simulation(regime, method, lr, seed, rounds, init)
    except ValueError as e:  # e.g. LocalSCGDAM's αη < 1 refuses this lr
        nan = {"auroc": math.nan, "ap": math.nan, "pauc": math.nan}
        return {"regime": regime, "method": method, "two_stage": two_stage, "lr": lr, "seed": seed,
                "status": f"refused: {e}", "steps": 0, "val": nan, "test": nan, "curve": [], "seconds": 0.0,
                "source": source_fingerprint()}  # fmt: skip
    data = fed.data
    x_val, y_val = data.x_train[torch.from_numpy(val)], data.y_train[torch.from_numpy(val)]
    curve, status = [], "ok"
    try:
        while not sim.done:
            plan = sim.run_round()
            if sim.round % EVAL_EVERY == 0 or sim.done:
                m = metrics_of(problem, *sim.global_model(), x_val, y_val)
                curve.append([plan.first_step + plan.window, m["auroc"], m["ap"], m["pauc"]])
    except NonFiniteLoss:
        status = "nan"
    params, buffers = sim.global_model()
    nan = {"auroc": math.nan, "ap": math.nan, "pauc": math.nan}
    ok = status == "ok"
    out = {
        "regime": regime, "method": method, "two_stage": two_stage, "lr": lr, "seed": seed,
        "status": status, "steps": rounds * LOCAL_STEPS,
        "val": metrics_of(problem, params, buffers, x_val, y_val) if ok else nan,
        "test": metrics_of(problem, params, buffers, data.x_test, data.y_test) if ok else nan,
        "curve": curve, "seconds": round(time.perf_counter() - start, 1),
        "samples": len(data.y_train) + len(data.y_test),  # train (after imbalance) + test
        "source": source_fingerprint(),
    }  # fmt: skip
    if method == "ce" and not two_stage and ok and stretch == 1:
        CACHE.mkdir(parents=True, exist_ok=True)
        blob = {"params": {k: v.detach().cpu() for k, v in params.items()},
                "buffers": {k: v.detach().cpu() for k, v in buffers.items()}}  # fmt: skip
        torch.save(blob, model_path(regime, seed, lr))
    return out


def source_fingerprint() -> dict[str, Any]:
    """The commit and a digest of every fedxrisk source file this process has imported (the
    per-file sha256 go to SOURCES under that digest), so a cell can be traced to its code."""
    import hashlib
    import subprocess

    files = {}
    for name, mod in sorted(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if name.split(".")[0] != "fedxrisk" or not path:
            continue
        p = Path(path).resolve()
        rel = p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else p.as_posix()
        files[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    known = json.loads(SOURCES.read_text()) if SOURCES.exists() else {}
    if digest not in known:
        known[digest] = files
        SOURCES.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--", "src"))
    return {"commit": git("rev-parse", "HEAD"), "src_dirty": dirty, "files": digest}


def model_path(regime: str, seed: int, lr: float) -> Path:
    return CACHE / f"ce-{regime.replace(' ', '_')}-s{seed}-lr{lr:.6g}.pt"


# -- the study -------------------------------------------------------------------------------
def key(regime: str, method: str, two_stage: bool, lr: float, seed: int) -> str:
    return f"{regime}|{method}|{'two' if two_stage else 'scratch'}|{lr:.6g}|{seed}"


def part_path(name: str) -> Path:
    return RESULTS / f"{STEM}.{name}.json"


def load_results() -> dict[str, Any]:
    """Every stored cell: the merged file and all worker parts."""
    results: dict[str, Any] = {}
    for path in [OUT, *sorted(RESULTS.glob(f"{STEM}.*.json"))]:
        if path.exists():
            results.update(json.loads(path.read_text()))
    return results


def save_results(results: dict[str, Any]) -> None:
    """This worker's cells to its part file (atomic), so parallel workers never collide."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = part_path(PART["name"])
    mine = json.loads(path.read_text()) if path.exists() else {}
    mine.update({k: v for k, v in results.items() if v.get("part") == PART["name"]})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(mine, indent=1, allow_nan=True) + "\n")
    os.replace(tmp, path)


def merge_parts() -> None:
    """Fold the worker parts into evidence.json (the committed raw results)."""
    results = load_results()
    OUT.write_text(json.dumps(dict(sorted(results.items())), indent=1, allow_nan=True) + "\n")
    for path in RESULTS.glob(f"{STEM}.*.json"):
        path.unlink()


def lr_grid(method: str) -> list[float]:
    return list(LR_GRIDS[method])


def target(record: dict[str, Any]) -> float:
    """The validation value a method is selected on (NaN / failed runs rank last)."""
    value = record["val"][METHODS[record["method"]][3]]
    return -math.inf if value is None or math.isnan(value) else value


def extra_lr(results, source: str, method: str, two_stage: bool) -> float | None:
    """One more learning rate, a factor 3 beyond the grid's edge, when the best of the grid sits
    on that edge (the same rule for every method; an lr the algorithm refuses counts as failed)."""
    grid = lr_grid(method)
    runs = [results.get(key(source, method, two_stage, lr, 0)) for lr in grid]
    if any(r is None for r in runs):
        return None
    best = grid.index(max(runs, key=target)["lr"])
    if target(runs[best]) == -math.inf:
        return None
    if best == 0:
        return float(f"{grid[0] / 3:.4g}")
    return float(f"{grid[-1] * 3:.4g}") if best == len(grid) - 1 else None


def candidates(results, source: str, method: str, two_stage: bool) -> list[float]:
    extra = extra_lr(results, source, method, two_stage)
    return lr_grid(method) + ([extra] if extra is not None else [])


def selected_lr(results, regime: str, method: str, two_stage: bool) -> float | None:
    """The candidate learning rate with the best validation target on seed 0; None until all ran."""
    source = REGIMES[regime].get("select_on", regime)
    runs = [
        results.get(key(source, method, two_stage, lr, 0))
        for lr in candidates(results, source, method, two_stage)
    ]
    if any(r is None for r in runs):
        return None
    return max(runs, key=target)["lr"]


def pretrained_path(regime: str, seed: int) -> Path:
    lr = selected_lr(load_results(), regime, "ce", False)
    if lr is None:
        raise RuntimeError(f"two-stage on {regime} needs CE's selected learning rate first")
    return model_path(regime, seed, lr)


def ensure(results, regime, method, two_stage, lr, seed) -> None:
    """Run one cell unless it is stored; two-stage cells first (re)build their CE model."""
    k = key(regime, method, two_stage, lr, seed)
    if k not in results:
        results.update(load_results())  # another worker may have run it meanwhile
    if k in results:
        return
    if two_stage:
        ce_lr = selected_lr(results, regime, "ce", False)
        if not model_path(regime, seed, ce_lr).exists():  # (re)train the CE model it starts from
            ce = run_cell(regime, "ce", ce_lr, seed, False)
            ce["part"] = PART["name"]
            results[key(regime, "ce", False, ce_lr, seed)] = ce
            save_results(results)
    rec = run_cell(regime, method, lr, seed, two_stage)
    rec["part"] = PART["name"]
    results[k] = rec
    save_results(results)
    tag = "two-stage" if two_stage else "scratch"
    print(f"{regime:20s} {method:14s} {tag:9s} lr={lr:<7g} seed={seed} val={rec['val']['auroc']:.4f} "
          f"({rec['seconds']:.0f}s)", flush=True)  # fmt: skip


def variants(regime: str) -> list[tuple[str, bool]]:
    scratch = [(m, False) for m in METHODS if (m not in SANITY_ONLY or regime in SANITY)]
    if regime in SANITY:
        return [(m, t) for m, t in scratch if m != "ce_long"]
    return scratch + [(m, True) for m in TWO_STAGE]


# The study in priority order, so one cut short keeps the most informative cells (CPU time is
# the bottleneck): per step (regimes, two-stage?, methods, select on seed 0?, final seeds).
# First the two class-heterogeneous mnist1d regimes: every from-scratch selection, CE, the
# controls CE → CE and CE long, CE → CODASCA (code) (LibAUC's practice), the other two-stage
# rows, extra seeds for the paired tests, the other from-scratch finals; then the sanity
# datasets, then LocalSCGDAM (3× a CE step), CODASCA (paper) two-stage, iid and imratio 0.005.
MAIN = ("mnist1d 0.1 class", "mnist1d 0.02 class")
SCRATCH = ("ce", "ce_ca", "codasca_paper", "codasca_code", "fedxl2", "fcsg_m", "codasca_plain")
TWO_MAIN = ("ce_ca", "fedxl2", "fcsg_m")
CONTROLS = ("ce", "ce_long")


def _main_steps(regime: str) -> list[tuple[tuple[str, ...], bool, tuple[str, ...], bool, tuple[int, ...]]]:
    r = (regime,)
    return [
        (r, False, SCRATCH, True, ()),
        (r, False, ("ce",), False, SEEDS),
        (r, True, ("ce",), True, SEEDS),
        (r, False, ("ce_long",), True, SEEDS),
        (r, True, ("codasca_code",), True, SEEDS),
        (r, True, TWO_MAIN, True, SEEDS),
        (r, False, CONTROLS, False, EXTRA_SEEDS),
        (r, True, ("ce", "codasca_code"), False, EXTRA_SEEDS),
        (r, False, SCRATCH, False, SEEDS),
    ]


REST = ("mnist1d 0.1 iid", "mnist1d 0.02 iid", "mnist1d 0.005 class")
PLAN = [
    *_main_steps(MAIN[0]),
    *_main_steps(MAIN[1]),
    (SANITY, False, SCRATCH + ("localscgdam",), True, SEEDS),
    (MAIN, False, ("localscgdam",), True, SEEDS),
    (MAIN, True, ("codasca_paper", "localscgdam"), True, SEEDS),
    *[step for regime in REST for step in _main_steps(regime)],
    (REST, False, ("localscgdam",), True, SEEDS),
    (REST, True, ("codasca_paper", "localscgdam"), True, SEEDS),
]


def run_study(regimes: list[str], seeds: tuple[int, ...], methods: tuple[str, ...] = tuple(METHODS)) -> None:
    """The PLAN's steps for the requested regimes: selection on seed 0, then the selected lr on
    the step's seeds that are in ``seeds`` (``methods``: only these, e.g. to finish a subset)."""
    results = load_results()
    for group, two, names, select, final in PLAN:
        for regime in (g for g in group if g in regimes):
            source = REGIMES[regime].get("select_on", regime)
            todo = [(m, t) for m, t in variants(regime) if t == two and m in names and m in methods]
            for method, t in todo if select else ():
                for lr in lr_grid(method):
                    ensure(results, source, method, t, lr, 0)
                extra = extra_lr(results, source, method, t)
                if extra is not None:
                    ensure(results, source, method, t, extra, 0)
            for seed in (s for s in final if s in seeds):
                for method, t in todo:
                    ensure(results, regime, method, t, selected_lr(results, regime, method, t), seed)


# -- rendering -------------------------------------------------------------------------------
def final_runs(results, regime, method, two_stage) -> list[dict[str, Any]]:
    lr = selected_lr(results, regime, method, two_stage)
    if lr is None:
        return []
    runs = [results.get(key(regime, method, two_stage, lr, s)) for s in ALL_SEEDS]
    return [r for r in runs if r is not None]


def _ms(values: list[float]) -> str:
    v = [x for x in values if x is not None and not math.isnan(x)]
    if not v:
        return "–"
    return f"{np.mean(v):.3f} ± {np.std(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def _paired(runs, ce_runs, metric: str) -> str:
    """mean ± std of per-seed differences against CE FedAvg, and wins/seeds."""
    ce = {r["seed"]: r["test"][metric] for r in ce_runs}
    d = [r["test"][metric] - ce[r["seed"]] for r in runs if r["seed"] in ce]
    d = [x for x in d if not math.isnan(x)]
    if not d:
        return "–"
    wins = sum(x > 0 for x in d)
    return f"{np.mean(d):+.3f} ± {np.std(d):.3f} ({wins}/{len(d)})"


def render(results) -> None:
    (RESULTS / "evidence.md").write_text(results_table(results))
    short = RESULTS / "evidence_800steps.json"
    if short.exists():  # the first pass at half the mnist1d horizon (CE had not plateaued)
        head = ("MNIST-1D at 800 local steps (half the final horizon), same protocol, from scratch only "
                "(its two-stage cells were lost to a missing CE model file). ")  # fmt: skip
        table = results_table(json.loads(short.read_text()), two_stage=False)
        (RESULTS / "evidence_800steps.md").write_text(head + table)
    render_summary(results)
    render_selection(results)
    plot(results)
    for doc in (ROOT / "docs" / "evidence.md", ROOT / "README.md"):
        fill_regions(doc)


def results_table(results, two_stage: bool = True) -> str:
    """Markdown: per regime and method, test metrics over seeds and paired differences vs CE."""
    lines = [
        "| regime | method | start | lr | test AUROC | Δ vs CE | test AP | Δ vs CE | test pAUC₀.₃ | Δ vs CE | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for regime in REGIMES:
        ce_runs = final_runs(results, regime, "ce", False)
        for method, two in variants(regime):
            runs = final_runs(results, regime, method, two)
            if not runs or (two and not two_stage):
                continue
            lr = runs[0]["lr"]
            cols = []
            for metric in ("auroc", "ap", "pauc"):
                cols.append(_ms([r["test"][metric] for r in runs]))
                cols.append("" if method == "ce" and not two else _paired(runs, ce_runs, metric))
            start = "CE model" if two else "scratch"
            lines.append(
                f"| {regime} | {LABELS[method]} | {start} | {lr:g} | "
                + " | ".join(cols)
                + f" | {len(runs)} |"
            )
    header = (
        "Test metrics at the learning rate selected on validation (seed 0), mean ± std over seeds; "
        "Δ = per-seed paired difference against CE FedAvg (mean ± std, wins/seeds). "
        "pAUC₀.₃ = normalized partial AUROC at FPR ≤ 0.3.\n\n"
    )
    return header + "\n".join(lines) + "\n"


def fill_regions(doc: Path) -> None:
    """Replace each ``<!-- BEGIN GENERATED benchmarks/results/evidence*.md -->`` region of ``doc``
    with that file's current content (the COMMON.md convention)."""
    import re

    if not doc.exists():
        return
    pattern = re.compile(
        r"(<!-- BEGIN GENERATED (benchmarks/results/evidence[\w.-]*\.md) -->\n).*?(<!-- END GENERATED -->)",
        re.S,
    )
    text = pattern.sub(lambda m: m.group(1) + (ROOT / m.group(2)).read_text() + m.group(3), doc.read_text())
    doc.write_text(text)


SUMMARY = [  # (column, method, two-stage, metric): each AUC method on its own target metric
    ("CE AUROC", "ce", False, "auroc"),
    ("CE class-aware AUROC", "ce_ca", False, "auroc"),
    ("CODASCA (code) AUROC", "codasca_code", False, "auroc"),
    ("CODASCA (code) two-stage AUROC", "codasca_code", True, "auroc"),
    ("LocalSCGDAM AUROC", "localscgdam", False, "auroc"),
    ("CE pAUC₀.₃", "ce", False, "pauc"),
    ("FeDXL2 pAUC₀.₃", "fedxl2", False, "pauc"),
    ("CE AP", "ce", False, "ap"),
    ("FCSG-M AP", "fcsg_m", False, "ap"),
]


def render_summary(results) -> None:
    """The README's short table: test means over seeds; the full table is evidence.md."""
    lines = ["| regime | " + " | ".join(c for c, *_ in SUMMARY) + " |", "|---|" + "---|" * len(SUMMARY)]
    for regime in REGIMES:
        cells = []
        for _, method, two, metric in SUMMARY:
            runs = final_runs(results, regime, method, two) if (two is False or regime not in SANITY) else []
            vals = [r["test"][metric] for r in runs if not math.isnan(r["test"][metric])]
            cells.append(f"{np.mean(vals):.3f}" if vals else "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {regime} | " + " | ".join(cells) + " |")
    head = "Test means over the seeds run (see docs/evidence.md for ± std, seeds and paired differences).\n\n"
    (RESULTS / "evidence_summary.md").write_text(head + "\n".join(lines) + "\n")


def render_selection(results) -> None:
    """Every selection run's validation target, so the choice can be checked."""
    lines = ["| regime | method | start | lr 1 | lr 2 | lr 3 | edge extension | selected lr |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for regime in REGIMES:
        if "select_on" in REGIMES[regime]:
            continue
        for method, two in variants(regime):
            cells = []
            extra = extra_lr(results, regime, method, two)
            for lr in [*lr_grid(method), extra]:
                if lr is None:
                    cells.append("")
                    continue
                r = results.get(key(regime, method, two, lr, 0))
                cells.append(
                    "–"
                    if r is None
                    else f"{lr:g}: {target(r):.3f}"
                    if target(r) > -math.inf
                    else f"{lr:g}: NaN"
                )
            sel = selected_lr(results, regime, method, two)
            start = "CE model" if two else "scratch"
            metric = METHODS[method][3]
            lines.append(
                f"| {regime} | {LABELS[method]} ({metric}) | {start} | "
                + " | ".join(cells)
                + f" | {sel if sel is not None else '–'} |"
            )
    head = "Validation target (seed 0) for each learning rate of the grid (lr: value); the test set is not read.\n\n"
    (RESULTS / "evidence_selection.md").write_text(head + "\n".join(lines) + "\n")


def plot(results) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    regimes = [r for r in REGIMES if final_runs(results, r, "ce", False)]
    if not regimes:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.5 + 0.45 * len(regimes) * 2.2), sharey=True)
    offsets = {}
    variants_all = [(m, False) for m in METHODS] + [(m, True) for m in TWO_STAGE]
    for i, v in enumerate(variants_all):
        offsets[v] = (i - len(variants_all) / 2) * 0.06
    colors = plt.get_cmap("tab10")
    for ax, metric, title in zip(
        axes, ("auroc", "ap", "pauc"), ("test AUROC", "test AP", "test pAUC (FPR ≤ 0.3)")
    ):
        for j, regime in enumerate(regimes):
            for (method, two), off in offsets.items():
                runs = final_runs(results, regime, method, two)
                vals = [r["test"][metric] for r in runs if not math.isnan(r["test"][metric])]
                if not vals:
                    continue
                c = colors(list(METHODS).index(method))
                ax.errorbar(np.mean(vals), j + off, xerr=np.std(vals), fmt="s" if two else "o", color=c,
                            mfc="none" if two else c, ms=5,
                            label=f"{LABELS[method]}{' (two-stage)' if two else ''}" if j == 0 else None)  # fmt: skip
        ax.set_yticks(range(len(regimes)), regimes)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(FIGURES / "evidence_metrics.png", dpi=110)
    plt.close(fig)
    # CE's validation curves (selection runs, seed 0, every lr): does CE plateau?
    sel = [r for r in REGIMES if "select_on" not in REGIMES[r]]
    fig, axes = plt.subplots(1, len(sel), figsize=(3.2 * len(sel), 3), sharey=False)
    for ax, regime in zip(np.atleast_1d(axes), sel):
        for lr in lr_grid("ce"):
            r = results.get(key(regime, "ce", False, lr, 0))
            if r and r["curve"]:
                c = np.array(r["curve"])
                ax.plot(c[:, 0], c[:, 1], label=f"lr {lr:g}")
        for lr, style in zip(lr_grid("ce"), ("k:", "k--", "k-.")):
            long = results.get(long_key(regime, lr))
            if long and long["curve"]:
                c = np.array(long["curve"])
                ax.plot(c[:, 0], c[:, 1], style, lw=1, label=f"lr {lr:g}, {LONG_STRETCH}× steps")
        ax.set_title(regime, fontsize=9)
        ax.set_xlabel("local step")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("CE FedAvg validation AUROC")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(FIGURES / "evidence_ce_curve.png", dpi=110)
    plt.close(fig)


def long_key(regime: str, lr: float) -> str:
    return f"{regime}|ce|long{LONG_STRETCH}|{lr:.6g}|0"


LONG_STRETCH = 2


def run_long(regime: str) -> None:
    """CE FedAvg at its selected lr and the grid's next lower one for LONG_STRETCH× the steps
    (seed 0, validation curve only): how far the study's horizon is from CE's plateau."""
    results = load_results()
    best = selected_lr(results, regime, "ce", False)
    grid = lr_grid("ce")
    for lr in [best] + grid[max(0, grid.index(best) - 1) : grid.index(best)]:
        if long_key(regime, lr) in results:
            continue
        rec = run_cell(regime, "ce", lr, 0, False, LONG_STRETCH)
        rec["part"] = PART["name"]
        results[long_key(regime, lr)] = rec
        save_results(results)
        print(f"{regime} CE lr {lr:g} ×{LONG_STRETCH} steps: val {rec['val']['auroc']:.4f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--render-only", action="store_true", help="tables and figures from evidence.json")
    parser.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated regime names")
    parser.add_argument("--seeds", default=",".join(map(str, ALL_SEEDS)))
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated method names")
    parser.add_argument("--part", default="main", help="this worker's results file evidence.<part>.json")
    parser.add_argument("--merge", action="store_true", help="fold the worker parts into evidence.json")
    parser.add_argument("--long", action="store_true", help=f"CE at {LONG_STRETCH}× the steps (the regimes')")
    args = parser.parse_args(argv)
    PART["name"] = args.part
    if args.merge:
        merge_parts()
    if not args.render_only and not args.merge:
        import torch

        torch.set_num_threads(1)
        regimes = [r.strip() for r in args.regimes.split(",")]
        unknown = [r for r in regimes if r not in REGIMES]
        if unknown:
            sys.exit(f"unknown regime(s) {unknown}; choose from {list(REGIMES)}")
        if args.long:
            for regime in regimes:
                run_long(regime)
        else:
            methods = tuple(m.strip() for m in args.methods.split(","))
            run_study(regimes, tuple(int(s) for s in args.seeds.split(",")), methods)
    render(load_results())


if __name__ == "__main__":
    main()

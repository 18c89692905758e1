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
EXTRA_SEEDS = (3, 4)  # the controls and the two-stage rows (not LocalSCGDAM's): the paired tests need them
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
    from fedxrisk.run.weights import load_weights

    load_weights(model, "pretrained CE model", path)


def rounds_of(regime: str, method: str, two_stage: bool) -> int:
    """A cell's rounds: the regime's; 1.5× for CE long; half for a second stage (CE → CE too)."""
    return round(REGIMES[regime]["rounds"] * HORIZON.get(method, 1.0)) // (2 if two_stage else 1)


def run_cell(regime: str, method: str, lr: float, seed: int, two_stage: bool) -> dict[str, Any]:
    """Train one cell; validation curve every EVAL_EVERY rounds, final val and test metrics."""
    import torch

    from fedxrisk.engines import NonFiniteLoss

    rounds = rounds_of(regime, method, two_stage)
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
    if method == "ce" and not two_stage and ok:
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
# First the two class-heterogeneous mnist1d regimes: CE, the control CE → CE, CE → CODASCA
# (code) (LibAUC's practice), the other two-stage rows, the control CE long, extra seeds for the
# paired tests, then every from-scratch selection (FCSG-M's, the slowest, last) and its finals;
# then the sanity datasets, LocalSCGDAM (3× a CE step), CODASCA (paper) two-stage, iid, 0.005.
MAIN = ("mnist1d 0.1 class", "mnist1d 0.02 class")
SCRATCH = ("ce", "ce_ca", "codasca_code", "codasca_paper", "fedxl2", "fcsg_m", "codasca_plain")
TWO_MAIN = ("ce_ca", "fedxl2", "fcsg_m")
CONTROLS = ("ce", "ce_long")


def _main_steps(regime: str) -> list[tuple[tuple[str, ...], bool, tuple[str, ...], bool, tuple[int, ...]]]:
    r = (regime,)
    return [
        (r, False, ("ce",), True, SEEDS),
        (r, True, ("ce",), True, SEEDS),
        (r, True, ("codasca_code",), True, SEEDS),
        (r, True, TWO_MAIN, True, SEEDS),
        (r, False, ("ce_long",), True, SEEDS),
        (r, False, CONTROLS, False, EXTRA_SEEDS),
        (r, True, ("ce", "codasca_code"), False, EXTRA_SEEDS),
        (r, True, TWO_MAIN, False, EXTRA_SEEDS),
        *[(r, False, (m,), True, ()) for m in SCRATCH],
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


# -- rendering, provenance, verification ------------------------------------------------------
def final_runs(results, regime, method, two_stage) -> list[dict[str, Any]]:
    lr = selected_lr(results, regime, method, two_stage)
    if lr is None:
        return []
    runs = [results.get(key(regime, method, two_stage, lr, s)) for s in ALL_SEEDS]
    return [r for r in runs if r is not None]


def render(results) -> None:
    """Tables (benchmarks/results/evidence*.md), figures, then every doc region (docs.py)."""
    import docs
    import evidence_report

    for name in evidence_report.render(results):
        print(f"wrote benchmarks/results/{name}")
    for doc in docs.render():
        print(f"updated {doc.relative_to(ROOT)}")


def cell_sources(results) -> dict[str, str]:
    """{file: sha256} over every cell's recorded source; refuses cells that ran different code."""
    known = json.loads(SOURCES.read_text()) if SOURCES.exists() else {}
    files: dict[str, str] = {}
    clash: set[str] = set()
    for rec in results.values():
        digest = rec.get("source", {}).get("files")
        if digest not in known:
            raise SystemExit(
                f"evidence: cell {rec['regime']}|{rec['method']} has no recorded source {digest}"
            )
        for path, sha in known[digest].items():
            if files.setdefault(path, sha) != sha:
                clash.add(path)
    if clash:
        raise SystemExit("evidence: the cells ran different versions of " + ", ".join(sorted(clash)))
    return files


def record_provenance(results, note: str = "") -> None:
    """benchmarks/results/provenance.json's "evidence" entry: the union of the cells' sources."""
    import provenance

    commits = sorted({r["source"]["commit"] for r in results.values()},
                     key=lambda c: provenance.git("log", "-1", "--format=%ct", c))  # oldest first  # fmt: skip
    if any(r["source"]["src_dirty"] for r in results.values()):
        raise SystemExit("evidence: some cells ran with uncommitted changes in src/; rerun them")
    entry = provenance.record("evidence", cell_sources(results), commit=commits[-1],
                              note=note or f"{len(results)} cells; commits {', '.join(c[:10] for c in commits)}")  # fmt: skip
    print(f"recorded the source of {len(results)} cells ({len(entry['files'])} files) in {provenance.RECORD}")


def verify(results, regime: str) -> None:
    """Rerun seed 0 of every row of ``regime`` that has it (CE first: the two-stage start) and
    require bit-for-bit equal validation and test metrics and curves; only then record the
    current source as the study's (after a refactor that should not change behaviour)."""
    import provenance

    cells = [(m, t, selected_lr(results, regime, m, t)) for m, t in variants(regime)]
    cells = [(m, t, lr) for m, t, lr in cells if lr is not None and key(regime, m, t, lr, 0) in results]
    if not cells:
        raise SystemExit(f"evidence --verify: no finished seed-0 cell of {regime!r}")
    differ = []
    for method, two, lr in cells:
        old, new = results[key(regime, method, two, lr, 0)], run_cell(regime, method, lr, 0, two)
        same = all(json.dumps(old[f]) == json.dumps(new[f]) for f in ("val", "test", "curve", "status"))
        print(f"{key(regime, method, two, lr, 0)}: {'bit-for-bit equal' if same else 'DIFFERS'}", flush=True)
        if not same:
            differ.append(key(regime, method, two, lr, 0))
    if differ:
        raise SystemExit(f"evidence --verify: {len(differ)} cells differ; rerun the study: {differ}")
    provenance.record("evidence", provenance.fingerprint(), note=f"verified: {len(cells)} seed-0 cells of "
                      f"{regime} reran bit for bit at {provenance.git('rev-parse', 'HEAD')[:10]}")  # fmt: skip
    print(f"recorded the current source for evidence ({len(cells)} cells equal)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--render-only", action="store_true", help=f"tables and figures from {OUT.name}")
    parser.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated regime names")
    parser.add_argument("--seeds", default=",".join(map(str, ALL_SEEDS)))
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated method names")
    parser.add_argument("--part", default="main", help=f"this worker's results file {STEM}.<part>.json")
    parser.add_argument("--merge", action="store_true", help=f"fold the worker parts into {OUT.name}")
    parser.add_argument("--record-provenance", action="store_true",
                        help="record the cells' source in benchmarks/results/provenance.json")  # fmt: skip
    parser.add_argument(
        "--verify", metavar="REGIME", help="rerun seed 0 of every row, require equality, record"
    )
    args = parser.parse_args(argv)
    PART["name"] = args.part
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.merge:
        merge_parts()
    if args.verify:
        import torch

        torch.set_num_threads(1)
        verify(load_results(), args.verify)
        return
    if not args.render_only and not args.merge and not args.record_provenance:
        import torch

        torch.set_num_threads(1)
        regimes = [r.strip() for r in args.regimes.split(",")]
        unknown = [r for r in regimes if r not in REGIMES]
        if unknown:
            sys.exit(f"unknown regime(s) {unknown}; choose from {list(REGIMES)}")
        methods = tuple(m.strip() for m in args.methods.split(","))
        run_study(regimes, tuple(int(s) for s in args.seeds.split(",")), methods)
    if args.record_provenance:
        record_provenance(load_results())
    render(load_results())


if __name__ == "__main__":
    main()

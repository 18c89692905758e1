"""Where do the AUC methods beat cross-entropy? The evidence study of issue 15 (docs/evidence.md).

Protocol (every method gets the same budget); every cell is a run of the library's run layer
(``fedxrisk run``'s build and training loop, through ``study_cells.train_cell``; a run folder
per cell in ``runs/evidence/``):

1. ``data.validation = 0.2``: each client's training shard is split, per class,
   into 80 % training and 20 % validation (seeded, ``fedxrisk.data.validation``);
   every run trains on the 80 % only and is validated on the clients' 20 % parts
   every 10 rounds. ``selection = "last"``: the final model is the result. The test
   set is never used to choose.
2. Selection (seed 0): every method runs each learning rate of its grid
   (``LR_GRIDS``: three values a factor 3 apart; no other knob is tuned) and
   keeps the one with the best *validation* value of its own target metric
   (AUROC; FeDXL2: pAUC(FPR ≤ 0.3); FCSG-M: AP). Learning rates are selected on
   the class-heterogeneous partition of each imratio and reused for iid.
3. Final: the selected learning rate on seeds 0, 1, 2 (seed 0 is the selection
   run itself: same data, same training, its test metrics are read only here).
   Test AUROC, AP, pAUC(FPR ≤ 0.3, normalized) as mean ± std, and per-seed
   paired differences against CE FedAvg.
4. Two-stage: the AUC method starts (``model.init_from``) from the final model of
   CE FedAvg (same regime, seed and selected CE learning rate) and runs half the steps.

The stored cells (``evidence_v2*.json``) ran the study's own code before this port (issue 22);
the run layer's carving is the split that code made, and ``--verify REGIME`` reruns seed 0 of
every row to check that the port reproduces them bit for bit.

Results go to ``benchmarks/results/evidence.json`` after every run (resumable:
finished cells are skipped); ``--render-only`` rebuilds the tables
(``benchmarks/results/evidence*.md``) and figures (``docs/figures/evidence_*.png``).

    nice -n 5 python benchmarks/evidence/run.py            # the study (hours on one core)
    python benchmarks/evidence/run.py --render-only        # tables and figures from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.study_cells import VAL_COLUMN, objective, select_lr, source_fingerprint, train_cell  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "figures"
RUNS = ROOT / "runs" / "evidence"  # a run folder per cell (not committed); two-stage cells start from CE's
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


# -- one run ---------------------------------------------------------------------------------
def run_config(regime: str, method: str, lr: float, seed: int, two_stage: bool):
    """The RunConfig of one cell (a two-stage cell's ``init_from``: CE's run folder of its seed)."""
    from fedxrisk.run.spec import RunConfig

    r, (alg, options, positives, target_metric) = REGIMES[regime], METHODS[method]
    init = pretrained_path(regime, seed) if two_stage else None
    return RunConfig(
        algorithm=alg, dataset=r["dataset"], clients=CLIENTS, imratio=r["imratio"], partition=r["partition"],
        allow_missing_class=True, num_samples=r.get("num_samples"), model=r["model"],
        rounds=rounds_of(regime, method, two_stage), local_steps=LOCAL_STEPS, batch_size=BATCH, lr=lr,
        stages=STAGES, lr_decay=LR_DECAY, seed=seed, engine="vmap", eval_every=EVAL_EVERY,
        positives_per_batch=positives, options=dict(options), validation=VAL_FRACTION, selection="last",
        monitor=VAL_COLUMN[target_metric], init_from=None if init is None else str(init),
        checkpoint_every=0, tensorboard=False,
    )  # fmt: skip


def rounds_of(regime: str, method: str, two_stage: bool) -> int:
    """A cell's rounds: the regime's; 1.5× for CE long; half for a second stage (CE → CE too)."""
    return round(REGIMES[regime]["rounds"] * HORIZON.get(method, 1.0)) // (2 if two_stage else 1)


def run_dir(regime: str, method: str, two_stage: bool, lr: float, seed: int) -> Path:
    return RUNS / key(regime, method, two_stage, lr, seed).replace("|", "__").replace(" ", "_")


def run_cell(regime: str, method: str, lr: float, seed: int, two_stage: bool) -> dict[str, Any]:
    """Train one cell (``study_cells.train_cell``): validation curve every EVAL_EVERY rounds, the
    final model's validation and test metrics."""
    if two_stage and not (pretrained_path(regime, seed) / "model.pt").exists():
        raise RuntimeError(
            f"two-stage {regime} seed {seed}: the CE run {pretrained_path(regime, seed)} is missing"
        )
    cfg = run_config(regime, method, lr, seed, two_stage)
    cell = train_cell(cfg, run_dir(regime, method, two_stage, lr, seed))
    for extra in ("scores", "labels", "round"):  # the final model (selection = last); no paired score tests
        cell.pop(extra, None)
    cell["test"].pop("acc", None)
    return {"regime": regime, "method": method, "two_stage": two_stage, "lr": lr, "seed": seed,
            "steps": cfg.rounds * LOCAL_STEPS, **cell,
            "source": source_fingerprint(SOURCES)}  # fmt: skip


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
    return objective(record, METHODS[record["method"]][3])


def _lr_choice(results, source: str, method: str, two_stage: bool) -> tuple[list[float], float | None]:
    def lookup(lr: float):
        return results.get(key(source, method, two_stage, lr, 0))

    return select_lr(lr_grid(method), lookup, METHODS[method][3])


def candidates(results, source: str, method: str, two_stage: bool) -> list[float]:
    """The grid, plus one learning rate a factor 3 beyond its edge when the best sits on that edge."""
    return _lr_choice(results, source, method, two_stage)[0]


def extra_lr(results, source: str, method: str, two_stage: bool) -> float | None:
    """The edge extension of :func:`candidates`, if any."""
    extra = candidates(results, source, method, two_stage)[len(lr_grid(method)) :]
    return extra[0] if extra else None


def selected_lr(results, regime: str, method: str, two_stage: bool) -> float | None:
    """The candidate learning rate with the best validation target on seed 0; None until all ran."""
    return _lr_choice(results, REGIMES[regime].get("select_on", regime), method, two_stage)[1]


def pretrained_path(regime: str, seed: int) -> Path:
    """The run folder of the CE FedAvg cell a two-stage cell starts from (its model.pt)."""
    lr = selected_lr(load_results(), regime, "ce", False)
    if lr is None:
        raise RuntimeError(f"two-stage on {regime} needs CE's selected learning rate first")
    return run_dir(regime, "ce", False, lr, seed)


def ensure(results, regime, method, two_stage, lr, seed) -> None:
    """Run one cell unless it is stored; two-stage cells first (re)build their CE model."""
    k = key(regime, method, two_stage, lr, seed)
    if k not in results:
        results.update(load_results())  # another worker may have run it meanwhile
    if k in results:
        return
    if two_stage:
        ce_lr = selected_lr(results, regime, "ce", False)
        if not (run_dir(regime, "ce", False, ce_lr, seed) / "model.pt").exists():  # (re)train the CE run
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
    from benchmarks import provenance

    commits = sorted({r["source"]["commit"] for r in results.values()},
                     key=lambda c: provenance.git("log", "-1", "--format=%ct", c))  # oldest first  # fmt: skip
    if any(r["source"]["src_dirty"] for r in results.values()):
        raise SystemExit("evidence: some cells ran with uncommitted changes in src/; rerun them")
    entry = provenance.record("evidence", cell_sources(results), commit=commits[-1],
                              note=note or f"{len(results)} cells; commits {', '.join(c[:10] for c in commits)}")  # fmt: skip
    print(f"recorded the source of {len(results)} cells ({len(entry['files'])} files) in {provenance.RECORD}")


def verify(results, regime: str, methods: tuple[str, ...] = tuple(METHODS)) -> None:
    """Rerun seed 0 of every row of ``regime`` that has it (CE first: the two-stage start) and
    require bit-for-bit equal validation and test metrics and curves; only then record the
    current source as the study's (after a refactor that should not change behaviour)."""
    from benchmarks import provenance

    cells = [(m, t, selected_lr(results, regime, m, t)) for m, t in variants(regime) if m in methods]
    cells = [(m, t, lr) for m, t, lr in cells if lr is not None and key(regime, m, t, lr, 0) in results]
    if not cells:
        raise SystemExit(f"evidence --verify: no finished seed-0 cell of {regime!r}")
    differ = []
    for method, two, lr in cells:
        old, new = results[key(regime, method, two, lr, 0)], run_cell(regime, method, lr, 0, two)
        same = all(json.dumps(old[f]) == json.dumps(new[f]) for f in ("val", "test", "curve", "status"))
        print(f"{key(regime, method, two, lr, 0)}: {'bit-for-bit equal' if same else 'DIFFERS'} (validation "
              f"{METHODS[method][3]} {old['val'][METHODS[method][3]]!r} → {new['val'][METHODS[method][3]]!r}, test AUROC "
              f"{old['test']['auroc']!r} → {new['test']['auroc']!r})", flush=True)  # fmt: skip
        if not same:
            differ.append(key(regime, method, two, lr, 0))
    if differ:
        raise SystemExit(f"evidence --verify: {len(differ)} cells differ; rerun the study: {differ}")
    if set(methods) != set(METHODS):
        raise SystemExit(
            "evidence --verify: equal, but only some rows were rerun (--methods); nothing recorded"
        )
    provenance.record("evidence", provenance.fingerprint(), note=f"verified: {len(cells)} seed-0 cells of "
                      f"{regime} reran bit for bit at {provenance.git('rev-parse', 'HEAD')[:10]}")  # fmt: skip
    print(f"recorded the current source for evidence ({len(cells)} cells equal)")


def main(argv: list[str] | None = None) -> bool:
    """Train the missing cells (or merge, verify, record); True when the tables should be
    rendered next (``run.py`` renders them: this module never imports its report)."""
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
    if args.merge:
        merge_parts()
    if args.verify:
        import torch

        torch.set_num_threads(1)
        verify(load_results(), args.verify, tuple(m.strip() for m in args.methods.split(",")))
        return False
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
    return True

"""Do the AUC methods help on real imbalanced data? The real-data study of issue 21 (docs/real-data.md).

Datasets (the public files in ``--data``, default ``../shared/data``; never copied here):
Fed-Heart-Disease (4 hospitals, FLamby's preprocessing and split), BreastMNIST
(official train/val/test, malignant = positive) and the bank-marketing campaign
table as prepared by ADBench (16 clients, two partitions). ``REGIMES`` holds the
set-ups, ``METHODS`` the methods, ``SETTINGS`` how a method is trained.

Protocol, the same for every method (benchmarks/evidence.py's, on real data):

1. Validation: the library's ``data.validation`` (``fedxrisk.data.validation``):
   BreastMNIST's official val split; elsewhere 20 % of each client's training
   shard per class (seeded), the clients train on the rest. The test set is
   never used to choose anything.
2. Selection on seed 0: each method runs the three learning rates of its grid
   (``LR_GRIDS``, a factor 3 apart), plus one more a factor 3 beyond the edge
   when the best sits on an edge, and keeps the best on its own validation
   target (AUROC; FeDXL2 pAUC(FPR ≤ 0.3); FCSG-M AP). A NaN run ranks last.
3. Final: the selected lr on every seed of the regime; test AUROC, AP,
   pAUC₀.₃, accuracy at 0.5 (logit > 0); test scores are kept for the paired
   tests (DeLong for AUROC, paired bootstrap for AP/pAUC) against CE FedAvg
   and, for two-stage rows, against CE → CE.
4. Settings: ``scratch`` (federated); ``two`` (starts from the CE FedAvg model of
   the same seed at CE's selected lr, then half the rounds with a fresh
   schedule: CE → CE is the control); ``central`` (K = 1 on the union of the
   training parts, batch K·B, the same steps: the upper line); ``local<h>``
   (client h alone on its training part: the lower line, heart only).

Results go to ``benchmarks/results/real_data.json`` after every cell
(resumable, finished cells are skipped); each cell records the commit and a
digest of the fedxrisk source it ran (``real_data_sources.json``).

    nice -n 10 python benchmarks/real_data.py --data ../shared/data   # the study (~1 h of one core)
    python benchmarks/real_data.py --render-only                      # tables, figures, docs
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evidence import load_pretrained  # noqa: E402  (the evidence study's loader of the CE model)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "real_data.json"
SOURCES = RESULTS / "real_data_sources.json"
CACHE = ROOT / "runs" / "real_data_cache"  # CE models the two-stage cells start from (not committed)
DATA = {"root": ROOT.parent / "shared" / "data"}

LOCAL_STEPS, STAGES, LR_DECAY, EVAL_EVERY = 8, 3, 3.0, 5
VALIDATION = 0.2  # data.validation: per client and class, carved from the training shard

LR_GRIDS: dict[str, tuple[float, ...]] = {
    "ce": (0.1, 0.3, 1.0),
    "codasca": (0.3, 1.0, 3.0),
    "codaplus": (0.3, 1.0, 3.0),
    "localscgdam": (0.011, 0.033, 0.1),  # α·η < 1 with α = 9 caps it at 0.11
    "fedxl2": (0.5, 1.5, 5.0),
    "fcsg_m": (0.1, 0.3, 1.0),
}
# name → (algorithm, class-aware batches?, validation target)
METHODS: dict[str, tuple[str, bool, str]] = {
    "ce": ("localsgdm", False, "auroc"),
    "codasca": ("codasca", True, "auroc"),
    "codaplus": ("codaplus", True, "auroc"),
    "localscgdam": ("localscgdam", True, "auroc"),
    "fedxl2": ("fedxl2", True, "pauc"),
    "fcsg_m": ("fcsg_m", True, "ap"),
}
LABELS = {
    "ce": "CE FedAvg",
    "codasca": "CODASCA",
    "codaplus": "CODA+",
    "localscgdam": "LocalSCGDAM",
    "fedxl2": "FeDXL2 (pAUC)",
    "fcsg_m": "FCSG-M (AP)",
}


def _heart(model: str) -> dict[str, Any]:
    return {"dataset": "heart_disease", "path": "heart-disease", "partition": "source", "clients": 4,
            "model": model, "batch": 16, "rounds": 40, "seeds": (0, 1, 2, 3, 4), "val": "carve"}  # fmt: skip


def _campaign(partition: str) -> dict[str, Any]:
    return {"dataset": "npz", "path": "adbench/5_campaign.npz", "partition": partition, "clients": 16,
            "model": "linear", "batch": 32, "rounds": 60, "seeds": (0, 1, 2), "val": "carve"}  # fmt: skip


REGIMES: dict[str, dict[str, Any]] = {
    "heart": _heart("linear"),
    "breast": {
        "dataset": "medmnist",
        "path": "medmnist/breastmnist.npz",
        "positive_classes": [0],
        "partition": "iid",
        "clients": 4,
        "model": "cnn28",
        "batch": 32,
        "rounds": 30,
        "seeds": (0, 1, 2),
        "val": "official",
    },  # fmt: skip
    "campaign class": _campaign("class"),
    "campaign dirichlet": _campaign("dirichlet"),
    "heart mlp": _heart("mlp"),
    # the heart protocol again with another validation draw: how much does selection noise move the table?
    "heart draw2": {**_heart("linear"), "val_seed": 1000},
}
HOSPITALS = ("Cleveland", "Hungarian", "Switzerland", "VA")

# (regime, setting, methods), in the order run: a study cut short keeps the most informative cells
PLAN: list[tuple[str, str, tuple[str, ...]]] = [
    ("heart", "scratch", ("ce", "codasca", "codaplus", "fedxl2", "fcsg_m")),
    ("heart", "two", ("ce", "codasca")),
    ("heart", "central", ("ce", "codasca")),
    ("heart", "local0", ("ce",)),
    ("heart", "local1", ("ce",)),
    ("heart", "local2", ("ce",)),
    ("heart", "local3", ("ce",)),
    ("campaign class", "scratch", ("ce", "codasca")),
    ("campaign dirichlet", "scratch", ("ce", "codasca")),
    ("heart draw2", "scratch", ("ce", "codasca", "codaplus")),
    ("breast", "scratch", ("ce", "codasca", "fedxl2")),
    ("breast", "two", ("ce", "codasca")),
    ("campaign class", "two", ("ce", "codasca")),
    ("campaign dirichlet", "two", ("ce", "codasca")),
    ("heart", "scratch", ("localscgdam",)),
    ("campaign class", "central", ("ce", "codasca")),
    ("breast", "central", ("ce",)),
    ("heart mlp", "scratch", ("ce", "codasca")),
    ("heart mlp", "two", ("ce", "codasca")),
]


# -- data ------------------------------------------------------------------------------------
_DATA: dict[tuple, Any] = {}


def regime_data(regime: str, seed: int):
    """(FederatedData on the training parts, validation x, y, per-client validation positions),
    the validation split made by the library's ``data.validation`` (``with_validation``)."""
    from fedxrisk.data import make_federated
    from fedxrisk.data.validation import with_validation

    key = (regime, seed)
    if key not in _DATA:
        r = REGIMES[regime]
        fed = make_federated(
            r["dataset"], r["clients"], r["partition"], None, seed, positive_classes=r.get("positive_classes"),
            allow_missing_class=True, data_dir=str(DATA["root"] / r["path"]),
        )  # fmt: skip
        fed = with_validation(
            fed, VALIDATION if r["val"] == "carve" else "official", seed + r.get("val_seed", 0)
        )
        _DATA.clear()
        _DATA[key] = (fed, fed.data.x_val, fed.data.y_val, fed.val_shards)
    return _DATA[key]


def setting_data(regime: str, setting: str, seed: int):
    """The data a setting trains on: all clients, their union (central) or one client (local<h>)."""
    import torch

    from fedxrisk.data import FederatedData

    fed, x_val, y_val, per_client = regime_data(regime, seed)
    if setting == "central":
        return FederatedData(fed.data, [np.sort(np.concatenate(fed.shards))]), x_val, y_val
    if setting.startswith("local"):
        h = int(setting[5:])
        rows = torch.from_numpy(per_client[h])
        return FederatedData(fed.data, [fed.shards[h]]), x_val[rows], y_val[rows]
    return fed, x_val, y_val


# -- one cell --------------------------------------------------------------------------------
def positives_per_batch(pos_ratio: float, batch: int) -> int:
    """Class-aware batches: the data's share of positives, at least a quarter of the batch."""
    return max(1, round(batch * max(pos_ratio, 0.25)))


def evaluate(problem, params, buffers, x, y) -> tuple[dict[str, float], np.ndarray]:
    from fedxrisk.metrics import auroc, average_precision, partial_auroc, predict

    s = predict(problem, params, buffers, x).reshape(-1)
    y = y.numpy().reshape(-1)
    both = 0 < y.sum() < len(y)
    m = {
        "auroc": auroc(y, s) if both else math.nan,
        "ap": average_precision(y, s) if both else math.nan,
        "pauc": partial_auroc(y, s, 0.3) if both else math.nan,
        "acc": float(np.mean((s > 0) == (y > 0.5))),
    }
    return m, s


def model_path(regime: str, seed: int, lr: float) -> Path:
    return CACHE / f"ce-{regime.replace(' ', '_')}-s{seed}-lr{lr:.6g}.pt"


def rounds_of(regime: str, setting: str) -> int:
    return REGIMES[regime]["rounds"] // (2 if setting == "two" else 1)


def run_cell(
    regime: str, method: str, setting: str, lr: float, seed: int, init: Path | None
) -> dict[str, Any]:
    import torch

    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.classaware import use_class_aware_batches
    from fedxrisk.engines import NonFiniteLoss, Simulation
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem

    r = REGIMES[regime]
    fed, x_val, y_val = setting_data(regime, setting, seed)
    scale = r["clients"] if setting == "central" else 1  # central: the K clients' samples per step
    batch = r["batch"] * scale
    rounds = rounds_of(regime, setting)
    start = time.perf_counter()
    model = build_model(r["model"], fed.data.input_shape, seed)
    if init is not None:
        load_pretrained(model, init)
    problem = Problem(model, fed.data.pos_ratio)
    alg, class_aware, _ = METHODS[method]
    nan = {"auroc": math.nan, "ap": math.nan, "pauc": math.nan, "acc": math.nan}
    out = {"regime": regime, "method": method, "setting": setting, "lr": lr, "seed": seed,
           "steps": rounds * LOCAL_STEPS, "batch": batch, "status": "ok", "curve": []}  # fmt: skip
    try:
        algorithm = ALGORITHMS[alg](problem)
        if class_aware:
            use_class_aware_batches(algorithm, positives_per_batch(float(fed.data.pos_ratio), batch), batch)
        schedule = Schedule.build(rounds, LOCAL_STEPS, lr, STAGES, LR_DECAY, 1.0)
        sim = Simulation(algorithm, fed, schedule, batch, seed, "vmap")
    except ValueError as e:  # e.g. LocalSCGDAM's αη < 1 refuses this lr
        return {**out, "status": f"refused: {e}", "val": nan, "test": nan, "seconds": 0.0, "source": source()}
    out["positives_per_batch"] = int(algorithm.positives_per_batch)
    torch.manual_seed(seed)
    try:
        while not sim.done:
            plan = sim.run_round()
            if sim.round % EVAL_EVERY == 0 or sim.done:
                m, _ = evaluate(problem, *sim.global_model(), x_val, y_val)
                out["curve"].append([plan.first_step + plan.window, m["auroc"], m["ap"], m["pauc"]])
    except NonFiniteLoss:
        out["status"] = "nan"
    params, buffers = sim.global_model()
    if out["status"] == "ok":
        out["val"], _ = evaluate(problem, params, buffers, x_val, y_val)
        out["test"], scores = evaluate(problem, params, buffers, fed.data.x_test, fed.data.y_test)
        out["scores"] = base64.b64encode(scores.astype(np.float32).tobytes()).decode()
    else:
        out["val"], out["test"] = nan, nan
    out["seconds"] = round(time.perf_counter() - start, 1)
    out["source"] = source()
    if method == "ce" and setting == "scratch" and out["status"] == "ok":
        CACHE.mkdir(parents=True, exist_ok=True)
        blob = {"params": {k: v.detach().cpu() for k, v in params.items()},
                "buffers": {k: v.detach().cpu() for k, v in buffers.items()}}  # fmt: skip
        torch.save(blob, model_path(regime, seed, lr))
    return out


def test_labels(regime: str, seed: int) -> list[int]:
    fed, *_ = regime_data(regime, seed)
    return [int(v) for v in fed.data.y_test.numpy().reshape(-1)]


def source() -> dict[str, Any]:
    """The commit and a digest of every fedxrisk source file this process imported (the per-file
    sha256 go to SOURCES under that digest, the layout of evidence.py's evidence_v2_sources.json)."""
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
    dirty = bool(git("status", "--porcelain", "--", "src"))
    return {"commit": git("rev-parse", "HEAD"), "src_dirty": dirty, "files": digest}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


# -- the study -------------------------------------------------------------------------------
def key(regime: str, method: str, setting: str, lr: float, seed: int) -> str:
    return f"{regime}|{method}|{setting}|{lr:.6g}|{seed}"


def load_results() -> dict[str, Any]:
    return json.loads(OUT.read_text()) if OUT.exists() else {}


def save_results(results: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(results.items())), indent=0, allow_nan=True) + "\n")
    os.replace(tmp, OUT)


def target(record: dict[str, Any]) -> float:
    value = record["val"][METHODS[record["method"]][2]]
    return -math.inf if value is None or math.isnan(value) else value


def extra_lr(results, regime: str, method: str, setting: str) -> float | None:
    """evidence.py's rule: one more lr a factor 3 beyond the grid's edge when the best sits there."""
    grid = list(LR_GRIDS[method])
    runs = [results.get(key(regime, method, setting, lr, 0)) for lr in grid]
    if any(r is None for r in runs):
        return None
    best = max(range(len(grid)), key=lambda i: target(runs[i]))
    if target(runs[best]) == -math.inf or len({target(r) for r in runs}) == 1:
        return None
    if best == 0:
        return float(f"{grid[0] / 3:.4g}")
    return float(f"{grid[-1] * 3:.4g}") if best == len(grid) - 1 else None


def candidates(results, regime: str, method: str, setting: str) -> list[float]:
    extra = extra_lr(results, regime, method, setting)
    return list(LR_GRIDS[method]) + ([extra] if extra is not None else [])


def selected_lr(results, regime: str, method: str, setting: str) -> float | None:
    """Best validation target on seed 0; None until every candidate ran. When validation cannot
    rank the runs (one class in it, e.g. Switzerland alone), the grid's middle lr."""
    runs = [
        results.get(key(regime, method, setting, lr, 0))
        for lr in candidates(results, regime, method, setting)
    ]
    if any(r is None for r in runs):
        return None
    if all(target(r) == -math.inf for r in runs):
        return LR_GRIDS[method][1]
    return max(runs, key=target)["lr"]


def ensure(results, regime: str, method: str, setting: str, lr: float, seed: int) -> None:
    k = key(regime, method, setting, lr, seed)
    if k in results:
        return
    init = None
    if setting == "two":
        ce_lr = selected_lr(results, regime, "ce", "scratch")
        if ce_lr is None:
            raise RuntimeError(f"two-stage {regime}: CE's selection must run first")
        init = model_path(regime, seed, ce_lr)
        if not init.exists():  # (re)train the CE model it starts from (the cache is not committed)
            rec = run_cell(regime, "ce", "scratch", ce_lr, seed, None)
            results[key(regime, "ce", "scratch", ce_lr, seed)] = rec
    rec = run_cell(regime, method, setting, lr, seed, init)
    results[k] = rec
    labels = test_labels(regime, seed)
    if results.setdefault("_labels", {}).setdefault(regime, labels) != labels:
        raise RuntimeError(f"{regime}: the test set differs between seeds; the paired tests assume one")
    save_results(results)
    print(f"{time.strftime('%H:%M:%S')} {regime:18s} {method:11s} {setting:8s} lr={lr:<6g} seed={seed} "
          f"{rec['status']:4s} val={target(rec):.4f} test AUROC={rec['test']['auroc']:.4f} ({rec['seconds']:.0f}s)",
          flush=True)  # fmt: skip


def run_study(regimes: list[str]) -> None:
    results = load_results()
    for regime, setting, methods in PLAN:
        if regime not in regimes:
            continue
        for method in methods:
            for lr in LR_GRIDS[method]:
                ensure(results, regime, method, setting, lr, 0)
            extra = extra_lr(results, regime, method, setting)
            if extra is not None:
                ensure(results, regime, method, setting, extra, 0)
        for seed in REGIMES[regime]["seeds"]:
            for method in methods:
                ensure(results, regime, method, setting, selected_lr(results, regime, method, setting), seed)


def record_provenance(results: dict[str, Any]) -> None:
    """benchmarks/results/provenance.json's "real_data" entry (benchmarks/provenance.py, which
    ``docs.py --check`` reads): the union of the cells' sources; refuses cells that ran different code."""
    try:
        import provenance
    except ImportError:
        sys.exit("real_data: benchmarks/provenance.py is missing on this branch; nothing recorded")
    cells = [rec for k, rec in results.items() if not k.startswith("_")]
    if any(rec["source"]["src_dirty"] for rec in cells):
        sys.exit("real_data: some cells ran with uncommitted changes in src/; rerun them")
    known = json.loads(SOURCES.read_text()) if SOURCES.exists() else {}
    files: dict[str, str] = {}
    for rec in cells:
        digest = rec["source"]["files"]
        if digest not in known:
            sys.exit(f"real_data: cell {rec['regime']}|{rec['method']} has no recorded source {digest}")
        for path, sha in known[digest].items():
            if files.setdefault(path, sha) != sha:
                sys.exit(f"real_data: the cells ran different versions of {path}; rerun the older ones")
    commits = sorted({rec["source"]["commit"] for rec in cells})
    provenance.record(
        "real_data", files, commit=commits[-1], note=f"{len(cells)} cells; {len(commits)} commit(s)"
    )
    print(f"real_data: recorded the source of {len(cells)} cells ({len(files)} files)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data", default=str(DATA["root"]), help="folder with heart-disease/, medmnist/, adbench/"
    )
    parser.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated regime names")
    parser.add_argument("--render-only", action="store_true", help="tables, figures and docs from the JSON")
    parser.add_argument("--record-provenance", action="store_true",
                        help="record the cells' source in benchmarks/results/provenance.json")  # fmt: skip
    args = parser.parse_args(argv)
    if args.record_provenance:
        record_provenance(load_results())
        return
    DATA["root"] = Path(args.data).expanduser().resolve()
    if not args.render_only:
        import torch

        torch.set_num_threads(1)
        regimes = [r.strip() for r in args.regimes.split(",")]
        unknown = [r for r in regimes if r not in REGIMES]
        if unknown:
            sys.exit(f"unknown regime(s) {unknown}; choose from {list(REGIMES)}")
        if not DATA["root"].is_dir():
            sys.exit(f"--data {DATA['root']}: no such folder (it holds heart-disease/, medmnist/, adbench/)")
        run_study(regimes)
    import real_data_report

    real_data_report.render(load_results())


if __name__ == "__main__":
    main()

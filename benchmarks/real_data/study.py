"""Do the AUC methods help on real imbalanced data? The real-data study of issue 21 (docs/real-data.md).

Datasets (the public files in ``--data``, default ``../shared/data``; never copied here):
Fed-Heart-Disease (4 hospitals, FLamby's preprocessing and split), BreastMNIST
(official train/val/test, malignant = positive) and the bank-marketing campaign
table as prepared by ADBench (16 clients, two partitions). ``REGIMES`` holds the
set-ups, ``METHODS`` the methods, ``SETTINGS`` how a method is trained.

Protocol, the same for every method, run by the library's run layer (``fedxrisk run``'s
build and training loop, through ``study_cells.train_cell``; each cell is a run folder in
``runs/real_data/``):

1. Validation: ``data.validation`` (``fedxrisk.data.validation``): BreastMNIST's
   official val split; elsewhere 20 % of each client's training shard per class
   (seeded), the clients train on the rest. The test set never chooses anything.
2. Round: ``selection = "best"`` on the algorithm's own validation target (the
   product default: AUROC; FeDXL2 pAUC(FPR ≤ 0.3); FCSG-M AP), evaluated every
   5 rounds; ``model.pt`` is that round's model, for CE FedAvg exactly as for the
   AUC methods.
3. Learning rate on seed 0: the three of the method's grid (``LR_GRIDS``, a factor
   3 apart), plus one more a factor 3 beyond the edge when the best sits on an
   edge; the best selected validation value wins (``fedxrisk tune``'s objective).
   A NaN run ranks last.
4. Final: the selected lr on every seed of the regime; test AUROC, AP, pAUC₀.₃,
   accuracy at 0.5 (logit > 0) of ``model.pt``; its test scores are kept for the
   paired tests (DeLong for AUROC, paired bootstrap for AP/pAUC) against CE FedAvg
   and, for two-stage rows, against CE → CE.
5. Settings: ``scratch`` (federated); ``two`` (``model.init_from`` the CE FedAvg
   model of the same seed at CE's selected lr, then half the rounds with a fresh
   schedule; its round 0, the CE model, may be the one selected: CE → CE is the
   control); ``central`` (K = 1 on the union of the federated training parts, batch
   K·B, the same steps, validated on the union of the clients' validation parts:
   the upper line); ``local<h>`` (client h alone on its training part, validated on
   its own part: the lower line, heart only).

Results go to ``benchmarks/results/real_data.json`` after every cell
(resumable, finished cells are skipped); each cell records the commit and a
digest of the fedxrisk source it ran (``real_data_sources.json``).

    nice -n 10 python benchmarks/real_data/run.py --data ../shared/data   # the study (~30 min, 2 cores)
    python benchmarks/real_data/run.py --render-only                      # tables, figures, docs
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.study_cells import objective as objective_of  # noqa: E402
from benchmarks.common.study_cells import (  # noqa: E402
    read_cells,
    record_sources,
    select_lr,
    source_fingerprint,
    train_cell,
    write_cells,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "real_data.json"
SOURCES = RESULTS / "real_data_sources.json"
RUNS = ROOT / "runs" / "real_data"  # a run folder per cell (not committed); two-stage cells start from CE's
DATA = {"root": ROOT.parent / "shared" / "data"}

LOCAL_STEPS, STAGES, LR_DECAY, EVAL_EVERY = 8, 3, 3.0, 5
VALIDATION = 0.2  # data.validation: per client and class, carved from the training shard
SELECTION = "best"  # the model of the best validation evaluation, every method alike

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


def _image(path: str, positive_classes: list[int]) -> dict[str, Any]:
    return {"dataset": "medmnist", "path": path, "positive_classes": positive_classes, "partition": "iid",
            "clients": 4, "model": "cnn28", "batch": 32, "rounds": 30, "seeds": (0, 1, 2, 3, 4), "val": "official"}  # fmt: skip


REGIMES: dict[str, dict[str, Any]] = {
    "heart": _heart("linear"),
    "breast": _image("medmnist/breastmnist.npz", [0]),
    # the image regime with a rare class (issue 42): diabetic-retinopathy grade 4, 6 % of the rows
    "retina rare": _image("medmnist/retinamnist.npz", [4]),
    "campaign class": _campaign("class"),
    "campaign dirichlet": _campaign("dirichlet"),
    "heart mlp": _heart("mlp"),
    # the heart protocol again with another validation draw: how much does selection noise move the table?
    "heart draw2": {**_heart("linear"), "val_seed": 1000},
}
HOSPITALS = ("Cleveland", "Hungarian", "Switzerland", "VA")

# (regime, setting, methods), in the order run: a study cut short keeps the most informative cells.
# Every row reruns with selection = best (issue 22); then the rows issue 21 left missing.
PLAN: list[tuple[str, str, tuple[str, ...]]] = [
    ("heart", "scratch", ("ce", "codasca", "codaplus", "fedxl2", "fcsg_m")),
    ("heart", "two", ("ce", "codasca")),
    ("heart", "central", ("ce", "codasca")),
    ("campaign class", "scratch", ("ce", "codasca")),
    ("campaign dirichlet", "scratch", ("ce", "codasca")),
    ("breast", "scratch", ("ce", "codasca")),
    ("breast", "two", ("ce", "codasca")),
    ("campaign class", "two", ("ce", "codasca")),
    ("campaign dirichlet", "two", ("ce", "codasca")),
    ("campaign class", "central", ("ce", "codasca")),
    ("breast", "central", ("ce",)),
    ("heart", "local0", ("ce",)),
    ("heart", "local1", ("ce",)),
    ("heart", "local2", ("ce",)),
    ("heart", "local3", ("ce",)),
    ("heart", "scratch", ("localscgdam",)),
    ("heart mlp", "scratch", ("ce", "codasca")),
    ("heart mlp", "two", ("ce", "codasca")),
    ("breast", "scratch", ("fedxl2",)),
    # the image regime with a rare class and controls (issue 42): CE, CE → CE, CE → CODASCA, CODASCA
    ("retina rare", "scratch", ("ce", "codasca")),
    ("retina rare", "two", ("ce", "codasca")),
    ("heart draw2", "scratch", ("ce", "codasca", "codaplus")),
]


# -- one cell --------------------------------------------------------------------------------
def positives_per_batch(pos_ratio: float, batch: int) -> int:
    """Class-aware batches: the data's share of positives, at least a quarter of the batch."""
    return max(1, round(batch * max(pos_ratio, 0.25)))


def rounds_of(regime: str, setting: str) -> int:
    return REGIMES[regime]["rounds"] // (2 if setting == "two" else 1)


def run_config(regime: str, method: str, lr: float, seed: int):
    """The federated RunConfig of a scratch cell (the data every setting of the regime starts from)."""
    from fedxrisk.run.spec import RunConfig

    r = REGIMES[regime]
    return RunConfig(
        algorithm=METHODS[method][0], dataset=r["dataset"], clients=r["clients"], imratio=None,
        partition=r["partition"], positive_classes=r.get("positive_classes"), model=r["model"],
        rounds=r["rounds"], local_steps=LOCAL_STEPS, batch_size=r["batch"], lr=lr, stages=STAGES,
        lr_decay=LR_DECAY, seed=seed, engine="vmap", eval_every=EVAL_EVERY, allow_missing_class=True,
        data_dir=str(DATA["root"] / r["path"]), validation=VALIDATION if r["val"] == "carve" else "official",
        selection=SELECTION, checkpoint_every=0, tensorboard=False,  # class-aware rows: adjust() sets P
    )  # fmt: skip


def pooled(data):
    """Central: one client holding the union of the training parts and of the validation parts."""
    from fedxrisk.data import FederatedData

    shards, val = [np.sort(np.concatenate(data.shards))], [np.concatenate(data.val_shards)]
    return FederatedData(data.data, shards, data.augment, data.stream, val)


def one_site(h: int):
    """Local: client ``h`` alone, validated on its own validation part."""
    from fedxrisk.data import FederatedData

    return lambda data: FederatedData(
        data.data, [data.shards[h]], data.augment, data.stream, [data.val_shards[h]]
    )


def run_dir(regime: str, method: str, setting: str, lr: float, seed: int) -> Path:
    return RUNS / key(regime, method, setting, lr, seed).replace("|", "__").replace(" ", "_")


def run_cell(
    regime: str, method: str, setting: str, lr: float, seed: int, init: Path | None
) -> dict[str, Any]:
    """Train one cell through the run layer (``study_cells.train_cell``)."""
    r = REGIMES[regime]
    fed_cfg = run_config(regime, method, lr, seed)
    cfg = dataclasses.replace(
        fed_cfg, rounds=rounds_of(regime, setting), init_from=str(init) if init else None
    )
    reshape = None
    if setting == "central":
        cfg = dataclasses.replace(cfg, clients=1, partition="iid", batch_size=r["batch"] * r["clients"])
        reshape = pooled
    elif setting.startswith("local"):
        cfg = dataclasses.replace(cfg, clients=1, partition="iid")
        reshape = one_site(int(setting[5:]))
    data_cfg = dataclasses.replace(fed_cfg, seed=seed + r.get("val_seed", 0))  # draw2: another carving
    batch = cfg.batch_size

    def adjust(c, data):  # class-aware batches from the training data's positive ratio
        if not METHODS[method][1]:
            return c
        return dataclasses.replace(
            c, positives_per_batch=positives_per_batch(float(data.data.pos_ratio), batch)
        )

    out = {"regime": regime, "method": method, "setting": setting, "lr": lr, "seed": seed,
           "steps": cfg.rounds * LOCAL_STEPS, "batch": batch, "selection": SELECTION}  # fmt: skip
    cell = train_cell(cfg, run_dir(regime, method, setting, lr, seed), reshape, data_cfg, adjust)
    out.update(cell)
    out["source"] = source_fingerprint(SOURCES)
    return out


# -- the study -------------------------------------------------------------------------------
def key(regime: str, method: str, setting: str, lr: float, seed: int) -> str:
    return f"{regime}|{method}|{setting}|{lr:.6g}|{seed}"


def load_results() -> dict[str, Any]:
    return read_cells(OUT)


def save_results(results: dict[str, Any]) -> None:
    write_cells(OUT, results)


def target(record: dict[str, Any]) -> float:
    return objective_of(record, METHODS[record["method"]][2])


def _lr_choice(results, regime: str, method: str, setting: str) -> tuple[list[float], float | None]:
    def lookup(lr: float):
        return results.get(key(regime, method, setting, lr, 0))

    return select_lr(LR_GRIDS[method], lookup, METHODS[method][2])


def candidates(results, regime: str, method: str, setting: str) -> list[float]:
    """The grid, plus one more lr a factor 3 beyond the edge when the best sits there."""
    return _lr_choice(results, regime, method, setting)[0]


def selected_lr(results, regime: str, method: str, setting: str) -> float | None:
    """Best validation target on seed 0 (``study_cells.select_lr``); None until every candidate ran."""
    return _lr_choice(results, regime, method, setting)[1]


def ensure(results, regime: str, method: str, setting: str, lr: float, seed: int) -> None:
    k = key(regime, method, setting, lr, seed)
    if k in results:
        return
    init = None
    if setting == "two":
        ce_lr = selected_lr(results, regime, "ce", "scratch")
        if ce_lr is None:
            raise RuntimeError(f"two-stage {regime}: CE's selection must run first")
        init = run_dir(regime, "ce", "scratch", ce_lr, seed)
        if not (init / "model.pt").exists():  # (re)train the CE run it starts from (runs/ is not committed)
            rec = run_cell(regime, "ce", "scratch", ce_lr, seed, None)
            rec.pop("labels", None)
            results[key(regime, "ce", "scratch", ce_lr, seed)] = rec
    rec = run_cell(regime, method, setting, lr, seed, init)
    labels = rec.pop("labels", None)
    results[k] = rec
    if labels is not None and results.setdefault("_labels", {}).setdefault(regime, labels) != labels:
        raise RuntimeError(f"{regime}: the test set differs between seeds; the paired tests assume one")
    save_results(results)
    print(f"{time.strftime('%H:%M:%S')} {regime:18s} {method:11s} {setting:8s} lr={lr:<6g} seed={seed} "
          f"{rec['status'][:4]:4s} val={target(rec):.4f} round={rec['round']} test AUROC={rec['test']['auroc']:.4f} "
          f"({rec['seconds']:.0f}s)", flush=True)  # fmt: skip


def run_study(regimes: list[str]) -> None:
    results = load_results()
    for regime, setting, methods in PLAN:
        if regime not in regimes:
            continue
        for method in methods:
            for lr in LR_GRIDS[method]:
                ensure(results, regime, method, setting, lr, 0)
            for lr in candidates(results, regime, method, setting):  # the edge extension, if any
                ensure(results, regime, method, setting, lr, 0)
        for seed in REGIMES[regime]["seeds"]:
            for method in methods:
                ensure(results, regime, method, setting, selected_lr(results, regime, method, setting), seed)


def verify(results: dict[str, Any]) -> None:
    """Rerun seed 0 of every planned row at its selected lr (a two-stage row from a fresh CE run)
    and require bit-for-bit equal status, validation, test metrics, round and curve; only then
    record the current source as the study's (after changes that should not alter its cells)."""
    from benchmarks import provenance

    if any(rec["source"]["src_dirty"] for k, rec in results.items() if not k.startswith("_")):
        sys.exit("real_data --verify: some stored cells ran with uncommitted changes in src/; rerun them")
    rows = [(regime, setting, m) for regime, setting, methods in PLAN for m in methods]
    fields = ("status", "val", "test", "round", "curve")
    differ, checked = [], 0
    for regime, setting, method in rows:
        lr = selected_lr(results, regime, method, setting)
        k = key(regime, method, setting, lr, 0) if lr is not None else None
        if k is None or k not in results:
            sys.exit(f"real_data --verify: {regime}|{method}|{setting} has no finished seed-0 cell")
        init = None
        if setting == "two":
            ce_lr = selected_lr(results, regime, "ce", "scratch")
            init = run_dir(regime, "ce", "scratch", ce_lr, 0)
            run_cell(regime, "ce", "scratch", ce_lr, 0, None)  # the start, retrained from scratch
        new = run_cell(regime, method, setting, lr, 0, init)
        same = all(json.dumps(results[k][f]) == json.dumps(new[f]) for f in fields)
        checked += 1
        print(f"{k}: {'bit-for-bit equal' if same else 'DIFFERS'} (test AUROC "
              f"{results[k]['test']['auroc']!r} → {new['test']['auroc']!r})", flush=True)  # fmt: skip
        if not same:
            differ.append(k)
    if differ:
        sys.exit(f"real_data --verify: {len(differ)} cells differ; rerun the study: {differ}")
    commit = provenance.git("rev-parse", "HEAD")
    provenance.record("real_data", provenance.fingerprint(), note=f"verified: {checked} seed-0 cells "
                      f"(every planned row) reran bit for bit at {commit[:10]}")  # fmt: skip
    print(f"recorded the current source for real_data ({checked} cells equal)")


def record_provenance(results: dict[str, Any]) -> None:
    """benchmarks/results/provenance.json's "real_data" entry: the union of the cells' sources."""
    cells = [rec for k, rec in results.items() if not k.startswith("_")]
    record_sources("real_data", cells, SOURCES, lambda rec: f"{rec['regime']}|{rec['method']}")


def main(argv: list[str] | None = None) -> bool:
    """Train the missing cells (or verify, record); True when the tables should be rendered next
    (``run.py`` renders them: this module never imports its report)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data", default=str(DATA["root"]), help="folder with heart-disease/, medmnist/, adbench/"
    )
    parser.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated regime names")
    parser.add_argument("--render-only", action="store_true", help="tables, figures and docs from the JSON")
    parser.add_argument("--record-provenance", action="store_true",
                        help="record the cells' source in benchmarks/results/provenance.json")  # fmt: skip
    parser.add_argument("--verify", action="store_true",
                        help="rerun seed 0 of every row bit for bit, then record the current source")  # fmt: skip
    args = parser.parse_args(argv)
    if args.record_provenance:
        record_provenance(load_results())
        return False
    DATA["root"] = Path(args.data).expanduser().resolve()
    if args.verify:
        import torch

        torch.set_num_threads(1)
        verify(load_results())
        return False
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
    return True

"""Heterogeneous sites: server optimizers, personalization, class-aware batches and the AUC methods
on real multi-site data (issue 33's study; docs/real-data.md, "Heterogeneous sites").

Regimes (``REGIMES``): heart's four hospitals (FLamby's split, ``partition = source``) with
FLamby's logistic regression (``linear``) and with the small MLP; label-skewed ``dirichlet``
(α = 0.5, K = 16) splits of campaign and mammography; and campaign's split with 15 % of the
training and validation labels flipped at half of the sites (a study-side transform,
:func:`flip_labels`; test labels untouched). Rows (``ROWS``): CE FedAvg, + class-aware batches,
+ FedAdam / FedYogi, + fine-tuning, + personal head, Ditto, CODASCA, CODA+ (+ FedAdam,
+ personal head), pooled (one client, all training data) and local-only (each hospital alone).

Protocol, the same for every row, each cell a run of the library's run layer
(``study_cells.train_cell``: ``fedxrisk run``'s build and loop; run folders in ``runs/heterogeneous/``):

1. Validation: ``data.validation = 0.2`` (20 % of each client's training shard per class); the
   test set never chooses anything. The model kept is the last (``selection = last``), so every
   row deploys what it ends with: the global model, or each site's own (``site_<k>.pt``:
   fine-tuned, personal head, Ditto's v_k; a local-only site's model).
2. Budget: three values a factor 3 apart on seed 0 (+ one beyond an edge that wins,
   ``study_cells.select_lr``): the client lr (``LR_GRIDS``), or for a server-optimizer row the
   server lr at CE FedAvg's selected client lr. The value maximises validation AUROC of the
   deployed models (each site's validation rows scored by the model that site deploys, pooled).
3. Final: that value on every seed; per site (each site's deployed model on its own test rows)
   and pooled test AUROC, AP and accuracy at 0.5 (logit > 0), test scores kept for the paired
   tests (report.py).

    nice -n 10 python benchmarks/heterogeneous/run.py --data ../shared/data --regimes heart
    python benchmarks/heterogeneous/run.py --render-only        # tables (docs: python benchmarks/docs.py)
    python benchmarks/heterogeneous/run.py --record-provenance  # the cells' source → provenance.json
                                                            # (a study run ends with it)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.study_cells import (  # noqa: E402
    encode_scores,
    read_cells,
    record_sources,
    select_lr,
    source_fingerprint,
    train_cell,
    write_cells,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "heterogeneous.json"
SOURCES = RESULTS / "heterogeneous_sources.json"
RUNS = ROOT / "runs" / "heterogeneous"
DATA = {"root": ROOT.parent / "shared" / "data"}
LOCAL_STEPS, STAGES, LR_DECAY, VALIDATION, FINETUNE = 8, 3, 3.0, 0.2, 20
LR_GRIDS = {"ce": (0.1, 0.3, 1.0), "auc": (0.3, 1.0, 3.0), "server": (0.01, 0.03, 0.1)}


@dataclass(frozen=True)
class Row:
    label: str
    algorithm: str = "localsgdm"
    grid: str = "ce"  # LR_GRIDS key; "server": the server lr at CE FedAvg's client lr
    class_aware: bool = False
    server: str | None = None
    changes: dict[str, Any] = field(default_factory=dict)  # other RunConfig fields
    kind: str = "fed"  # fed, pooled (one client, all training data), local (each site alone)
    auc: bool = False


ROWS: dict[str, Row] = {
    "ce": Row("CE FedAvg"),
    "ce_ca": Row("CE + class-aware", class_aware=True),
    "ce_adam": Row("CE + FedAdam", grid="server", server="adam"),
    "ce_yogi": Row("CE + FedYogi", grid="server", server="yogi"),
    "ce_ft": Row(f"CE + fine-tuning ({FINETUNE} steps)", changes={"finetune_steps": FINETUNE}),
    "ce_head": Row("CE + personal head", changes={"personal": "head"}),
    "ditto": Row("Ditto (λ = 1)", algorithm="ditto"),
    "codasca": Row("CODASCA", "codasca", "auc", True, auc=True),
    "codaplus": Row("CODA+", "codaplus", "auc", True, auc=True),
    "codaplus_adam": Row("CODA+ + FedAdam", "codaplus", "server", True, "adam", auc=True),
    "codaplus_head": Row("CODA+ + personal head", "codaplus", "auc", True, changes={"personal": "head"}, auc=True),
    "pooled": Row("pooled (one client)", kind="pooled"),
    "local": Row("local only (each site alone)", kind="local"),
}  # fmt: skip
HEART_ROWS = tuple(ROWS)
SKEW_ROWS = ("ce", "ce_ca", "ce_adam", "codasca", "codaplus", "codaplus_adam", "pooled")


def _heart(model: str) -> dict[str, Any]:
    return {"dataset": "heart_disease", "path": "heart-disease", "partition": "source", "clients": 4,
            "model": model, "batch": 16, "rounds": 40, "seeds": 10, "rows": HEART_ROWS}  # fmt: skip


def _skewed(path: str, flip: float = 0.0) -> dict[str, Any]:
    return {"dataset": "npz", "path": path, "partition": "dirichlet", "alpha": 0.5, "clients": 16,
            "model": "linear", "batch": 32, "rounds": 60, "seeds": 3, "rows": SKEW_ROWS, "flip": flip}  # fmt: skip


REGIMES: dict[str, dict[str, Any]] = {
    "heart": _heart("linear"),
    "campaign dir0.5": _skewed("adbench/5_campaign.npz"),
    "mammography dir0.5": _skewed("adbench/23_mammography.npz"),
    "campaign dir0.5 noisy": _skewed("adbench/5_campaign.npz", flip=0.15),
    "heart mlp": _heart("mlp"),
}
HOSPITALS = ("Cleveland", "Hungarian", "Switzerland", "VA")


def positives_per_batch(pos_ratio: float, batch: int) -> int:
    """Class-aware batches (as real_data/study.py): the data's share of positives, at least a quarter."""
    return max(1, round(batch * max(pos_ratio, 0.25)))


def flip_labels(data, share: float, seed: int):
    """Label noise: ``share`` of the training and validation labels flipped at the first half of
    the sites (seeded); the test labels are untouched. Returns a new FederatedData."""
    from fedxrisk.data import FederatedData

    rng = np.random.default_rng(10_000 + seed)
    y_train, y_val = data.data.y_train.clone(), data.data.y_val.clone()
    for k in range(data.num_clients // 2):
        for y, rows in ((y_train, data.shards[k]), (y_val, data.val_shards[k])):
            picked = rng.choice(rows, size=round(share * len(rows)), replace=False)
            y[picked] = 1.0 - y[picked]
    noisy = dataclasses.replace(data.data, y_train=y_train, y_val=y_val)
    return FederatedData(noisy, data.shards, data.augment, data.stream, data.val_shards)


def run_config(regime: str, row: Row, lr: float, seed: int, server_lr: float | None = None):
    from fedxrisk.run.spec import RunConfig

    r = REGIMES[regime]
    cfg = RunConfig(
        algorithm=row.algorithm, dataset=r["dataset"], clients=r["clients"], imratio=None,
        partition=r["partition"], dirichlet_alpha=r.get("alpha", 0.5), model=r["model"], rounds=r["rounds"],
        local_steps=LOCAL_STEPS, batch_size=r["batch"], lr=lr, stages=STAGES, lr_decay=LR_DECAY, seed=seed,
        engine="vmap", eval_every=r["rounds"], allow_missing_class=True, data_dir=str(DATA["root"] / r["path"]),
        validation=VALIDATION, selection="last", checkpoint_every=0, tensorboard=False,
    )  # fmt: skip
    if row.server:
        cfg = dataclasses.replace(cfg, server={"optimizer": row.server, "lr": server_lr})
    return dataclasses.replace(cfg, **row.changes)


def logits(model_file: Path, x) -> np.ndarray:
    import torch

    from fedxrisk.inference import read_model_file

    model = read_model_file(model_file)[0]
    with torch.no_grad():
        return model(x).reshape(-1).numpy()


def site_rows(data) -> list[np.ndarray]:
    """Each site's test rows (heart: its hospital's; a dirichlet split has none: the whole set)."""
    from fedxrisk.engines.personal import site_test_rows

    masks = site_test_rows(data)
    return masks if masks is not None else [np.ones(len(data.data.y_test), bool)] * data.num_clients


def deployed(
    regime: str, row: Row, lr: float, seed: int, server_lr: float | None, out: Path
) -> dict[str, Any]:
    """Train the row's cell(s); score every site's validation and test rows with the model that site deploys."""
    from fedxrisk.metrics import auroc

    r = REGIMES[regime]
    base = run_config(regime, row, lr, seed, server_lr)
    seen: list[Any] = []

    def reshape_for(pick):
        def reshape(data):
            if r.get("flip"):
                data = flip_labels(data, r["flip"], seed)
            seen.append(data)
            return pick(data)

        return reshape

    def adjust(c, data):
        if not row.class_aware:
            return c
        return dataclasses.replace(
            c, positives_per_batch=positives_per_batch(float(data.data.pos_ratio), c.batch_size)
        )

    jobs: list[tuple[Any, Any, Path]] = []  # (cfg, reshape, folder)
    if row.kind == "fed":
        jobs.append((base, reshape_for(lambda d: d), out))
    elif row.kind == "pooled":
        cfg = dataclasses.replace(base, clients=1, partition="iid", batch_size=r["batch"] * r["clients"])
        jobs.append((cfg, reshape_for(pooled), out))
    else:
        for h in range(r["clients"]):
            cfg = dataclasses.replace(base, clients=1, partition="iid")
            jobs.append((cfg, reshape_for(lambda d, h=h: one_site(d, h)), out / f"site{h}"))
    cells = [train_cell(cfg, folder, reshape, base, adjust) for cfg, reshape, folder in jobs]
    seconds = sum(c["seconds"] for c in cells)
    if any(c["status"] != "ok" for c in cells):
        return {"status": next(c["status"] for c in cells if c["status"] != "ok"), "val_auroc": math.nan,
                "seconds": seconds}  # fmt: skip
    data = seen[0]
    masks = site_rows(data)
    x_test, y_test = data.data.x_test, data.data.y_test.numpy().reshape(-1)
    personal = row.kind == "local" or (out / "site_0.pt").exists()
    models = [
        (out / f"site{k}" / "model.pt") if row.kind == "local" else
        (out / f"site_{k}.pt") if personal else (out / "model.pt")
        for k in range(data.num_clients)
    ]  # fmt: skip
    if personal and masks[0].all():
        raise RuntimeError(f"{regime}|{row.label}: site models need the sites' own test rows")
    x_val, y_val = data.data.x_val, data.data.y_val.numpy().reshape(-1)
    vy = np.concatenate([y_val[data.val_shards[k]] for k in range(data.num_clients)])
    vs = np.concatenate([logits(m, x_val[data.val_shards[k]]) for k, m in enumerate(models)])
    test = logits(models[0], x_test) if not personal else np.zeros(len(y_test))
    for k, model in enumerate(models if personal else []):
        test[masks[k]] = logits(model, x_test[masks[k]])
    by_site = None if masks[0].all() else np.argmax(np.stack(masks), axis=0).tolist()
    rec = {"status": "ok", "val_auroc": float(auroc(vy, vs)) if 0 < vy.sum() < len(vy) else math.nan,
           "scores": encode_scores(test), "personal": personal, "seconds": seconds,
           "labels": y_test.astype(int).tolist(), "sites": by_site}  # fmt: skip
    if personal and row.kind != "local":
        rec["global_scores"] = encode_scores(logits(out / "model.pt", x_test))
    return rec


def pooled(data):
    from fedxrisk.data import FederatedData

    shards, val = [np.sort(np.concatenate(data.shards))], [np.concatenate(data.val_shards)]
    return FederatedData(data.data, shards, data.augment, data.stream, val)


def one_site(data, h: int):
    from fedxrisk.data import FederatedData

    return FederatedData(data.data, [data.shards[h]], data.augment, data.stream, [data.val_shards[h]])


# -- the study -------------------------------------------------------------------------------
def key(regime: str, row: str, value: float, seed: int) -> str:
    return f"{regime}|{row}|{value:.6g}|{seed}"


def load_results() -> dict[str, Any]:
    return read_cells(OUT)


def save_results(results: dict[str, Any]) -> None:
    write_cells(OUT, results)


def choice(results, regime: str, row: str) -> tuple[list[float], float | None]:
    """(values to run on seed 0, the selected one or None until they ran): best validation AUROC."""

    def lookup(value: float):
        rec = results.get(key(regime, row, value, 0))
        return None if rec is None else {"val": {"auroc": rec["val_auroc"]}}

    return select_lr(LR_GRIDS[ROWS[row].grid], lookup, "auroc")


def ensure(results, regime: str, row: str, value: float, seed: int) -> None:
    k = key(regime, row, value, seed)
    if k in results:
        return
    spec = ROWS[row]
    lr, server_lr = value, None
    if spec.grid == "server":  # the server's step is searched; clients keep CE FedAvg's (or CODA+'s) lr
        base = "ce" if not spec.auc else "codaplus"
        lr, server_lr = choice(results, regime, base)[1], value
        if lr is None:
            raise RuntimeError(f"{regime}|{row}: {base}'s selection must run first")
    folder = RUNS / k.replace("|", "__").replace(" ", "_")
    start = time.process_time()
    rec = deployed(regime, spec, lr, seed, server_lr, folder)
    rec |= {"regime": regime, "row": row, "value": value, "lr": lr, "server_lr": server_lr, "seed": seed,
            "cpu_seconds": round(time.process_time() - start, 1), "source": source_fingerprint(SOURCES)}  # fmt: skip
    labels, sites = rec.pop("labels", None), rec.pop("sites", None)
    if labels is not None:
        shared = results.setdefault("_test", {}).setdefault(regime, {"labels": labels, "sites": sites})
        if shared["labels"] != labels or shared["sites"] != sites:
            raise RuntimeError(f"{regime}: the test set differs between cells; the paired tests assume one")
    results[k] = rec
    save_results(results)
    print(f"{time.strftime('%H:%M:%S')} {regime:20s} {row:14s} value={value:<6g} seed={seed} {rec['status'][:6]:6s} "
          f"val AUROC={rec['val_auroc']:.4f} ({rec['cpu_seconds']:.0f} s CPU)", flush=True)  # fmt: skip


def run_study(regimes: list[str]) -> None:
    results = load_results()
    for regime in regimes:
        rows = REGIMES[regime]["rows"]
        for row in rows:  # selection on seed 0, in ROWS order (server rows after the lr they borrow)
            for value in LR_GRIDS[ROWS[row].grid]:
                ensure(results, regime, row, value, 0)
            for value in choice(results, regime, row)[0]:
                ensure(results, regime, row, value, 0)
        for seed in range(1, REGIMES[regime]["seeds"]):
            for row in rows:
                ensure(results, regime, row, choice(results, regime, row)[1], seed)


def record_provenance(results: dict[str, Any]) -> None:
    """provenance.json's "heterogeneous" entry: the union of the cells' recorded sources."""
    cells = [rec for k, rec in results.items() if not k.startswith("_")]
    record_sources("heterogeneous", cells, SOURCES, lambda rec: f"{rec['regime']}|{rec['row']}")


def main(argv: list[str] | None = None) -> bool:
    """Train the missing cells (or record their source); True when the tables should be rendered
    next (``run.py`` renders them: this module never imports its report)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(DATA["root"]), help="folder with heart-disease/ and adbench/")
    parser.add_argument("--regimes", default="heart", help=f"comma-separated, of: {', '.join(REGIMES)}")
    parser.add_argument("--render-only", action="store_true", help="tables and docs from the JSON")
    parser.add_argument(
        "--record-provenance", action="store_true", help="record the cells' source (provenance.json)"
    )
    args = parser.parse_args(argv)
    if args.record_provenance:
        record_provenance(load_results())
        return False
    if not args.render_only:
        import torch

        torch.set_num_threads(1)
        DATA["root"] = Path(args.data).expanduser().resolve()
        regimes = [r.strip() for r in args.regimes.split(",")]
        unknown = [r for r in regimes if r not in REGIMES]
        if unknown:
            sys.exit(f"heterogeneous: unknown regime(s) {unknown}; choose from {list(REGIMES)}")
        if not DATA["root"].is_dir():
            sys.exit(f"heterogeneous: --data {DATA['root']}: no such folder")
        run_study(regimes)
        record_provenance(load_results())  # every cell's source, or which cell to rerun
    return True

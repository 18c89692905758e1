"""What the studies (evidence, real_data, heterogeneous) share: a cell trained through the run layer,
the learning-rate rule on validation, and the source fingerprint of a cell.

A cell is one run of ``fedxrisk run``'s machinery: :func:`fedxrisk.run.build.build_data` carves
the validation data (``data.validation``), :func:`fedxrisk.run.build.build` and
:func:`fedxrisk.run.loop.train` train, evaluate validation every ``eval_every`` rounds and keep
the model ``selection`` asks for (``"best"``: the best value of ``monitor``) in ``model.pt`` of the
cell's run folder. Its validation value is :func:`fedxrisk.run.tune.validation_value` (what
``fedxrisk tune`` maximises); its test metrics are those of ``model.pt`` re-evaluated, checked
against the summary's ``selected`` row. A study may hand the built data to a ``reshape`` (e.g.
pooling the clients) before training; the run folder's ``config.toml`` then describes the data
before it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("auroc", "ap", "pauc")
VAL_COLUMN = {"auroc": "val_auroc", "ap": "val_ap", "pauc": "val_pauc30_norm"}  # pauc: FPR ≤ 0.3
NAN = dict.fromkeys(METRICS, math.nan)


def test_metrics(y: np.ndarray, s: np.ndarray) -> dict[str, float]:
    """AUROC, AP, normalized pAUC(FPR ≤ 0.3) and accuracy at logit 0 (NaN AUC metrics for one class)."""
    from fedxrisk.metrics import auroc, average_precision, partial_auroc

    both = 0 < y.sum() < len(y)
    return {
        "auroc": auroc(y, s) if both else math.nan,
        "ap": average_precision(y, s) if both else math.nan,
        "pauc": partial_auroc(y, s, 0.3) if both else math.nan,
        "acc": float(np.mean((s > 0) == (y > 0.5))),
    }


def encode_scores(scores: np.ndarray) -> str:
    return base64.b64encode(scores.astype(np.float32).tobytes()).decode()


def train_cell(
    cfg: Any,
    out: Path,
    reshape: Callable[[Any], Any] | None = None,
    data_cfg: Any = None,
    adjust: Callable[[Any, Any], Any] | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` (a RunConfig with ``validation`` set) in the run folder ``out`` (replaced).

    ``data_cfg``: the config whose data (clients, partition, validation carved with its seed) is
    built, when it is not ``cfg``'s; ``reshape(FederatedData) -> FederatedData``: the clients the
    run trains (e.g. all pooled, or one site); ``adjust(cfg, data) -> cfg``: settings that depend
    on the built data (e.g. positives per class-aware batch from its positive ratio).
    Returns ``status`` (ok, nan, refused: …), ``val`` (the selected model's validation metrics),
    ``test`` (model.pt's), ``round`` (the selected one), ``curve`` ([step, val AUROC, AP, pAUC]
    per evaluation), ``scores`` (model.pt's test logits, float32 base64), ``labels`` (the test
    labels, for the caller to check; not a cell field) and ``seconds``.
    """
    import torch

    from fedxrisk.engines import NonFiniteLoss
    from fedxrisk.errors import ConfigError
    from fedxrisk.metrics import predict
    from fedxrisk.run.build import build, build_data
    from fedxrisk.run.callbacks import default_callbacks
    from fedxrisk.run.checks import checked as check
    from fedxrisk.run.folder import RunFolder
    from fedxrisk.run.loop import train
    from fedxrisk.run.tune import validation_value

    start = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)  # an interrupted cell starts again
    out.parent.mkdir(parents=True, exist_ok=True)
    refused = {"status": "", "val": NAN, "test": {**NAN, "acc": math.nan}, "curve": [], "round": None}
    try:
        checked = check(cfg)
        data, _ = build_data(checked.config if data_cfg is None else check(data_cfg).config)
        if reshape is not None:
            data = reshape(data)
        if adjust is not None:
            checked = check(adjust(checked.config, data))
        setup = build(checked, data_from=SimpleNamespace(data=data, stream=None))
    except (ConfigError, ValueError) as e:  # e.g. LocalSCGDAM's αη < 1 refuses this lr
        return {**refused, "status": f"refused: {e}", "seconds": 0.0}
    folder = RunFolder(out)
    folder.start(setup.config)
    try:
        result = train(setup, folder, default_callbacks(None))
    except NonFiniteLoss:
        return {**refused, "status": "nan", "seconds": round(time.perf_counter() - start, 1)}
    history, summary = result.history, result.summary
    monitor = setup.config.resolved_monitor()
    selected = summary["selected"]
    row = next(r for r in history if r["round"] == selected["round"])
    val = {m: float(row[VAL_COLUMN[m]]) for m in METRICS}
    scored = validation_value(summary, history, monitor)
    if scored != row[monitor] and not (math.isnan(scored) and math.isnan(row[monitor])):
        raise RuntimeError(f"{out}: the selected row is not the one fedxrisk tune would score")
    blob = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    scores = predict(setup.problem, blob["params"], blob.get("buffers") or {}, setup.data.data.x_test)
    scores = scores.reshape(-1)
    y = setup.data.data.y_test.numpy().reshape(-1)
    test = test_metrics(y, scores)
    if not (math.isnan(test["auroc"]) or abs(test["auroc"] - selected["test_auroc"]) < 1e-9):
        raise RuntimeError(
            f"{out}: model.pt's test AUROC {test['auroc']} ≠ the summary's {selected['test_auroc']}"
        )
    curve = [[r["step"], *(float(r[VAL_COLUMN[m]]) for m in METRICS)] for r in history if r["round"] > 0]
    return {"status": "ok", "val": val, "test": test, "round": selected["round"], "curve": curve,
            "scores": encode_scores(scores), "labels": [int(v) for v in y], "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip


# -- the learning-rate rule ----------------------------------------------------------------------
def objective(record: dict[str, Any] | None, metric: str) -> float:
    """A cell's validation value of ``metric``; a NaN or refused run ranks last."""
    value = record["val"][metric] if record else math.nan
    return -math.inf if value is None or math.isnan(value) else value


def edge_extension(grid: Sequence[float], runs: Sequence[dict[str, Any]], metric: str) -> float | None:
    """One more learning rate a factor 3 beyond the grid's edge when the best of ``runs`` (the
    grid's cells, in order) sits on that edge; None when every run failed or all tie."""
    values = [objective(r, metric) for r in runs]
    best = max(range(len(grid)), key=lambda i: values[i])
    if values[best] == -math.inf or len(set(values)) == 1:
        return None
    if best == 0:
        return float(f"{grid[0] / 3:.4g}")
    return float(f"{grid[-1] * 3:.4g}") if best == len(grid) - 1 else None


def select_lr(
    grid: Sequence[float], lookup: Callable[[float], dict[str, Any] | None], metric: str
) -> tuple[list[float], float | None]:
    """(the candidates to run, the selected lr or None until all ran): the grid, extended at an
    edge; the best validation ``metric`` wins (the first of equal values); when no run has a
    finite value (validation of one class), the grid's middle."""
    runs = [lookup(lr) for lr in grid]
    if any(r is None for r in runs):
        return list(grid), None
    extra = edge_extension(grid, runs, metric)
    candidates = list(grid) + ([extra] if extra is not None else [])
    runs += [lookup(extra)] if extra is not None else []
    if any(r is None for r in runs):
        return candidates, None
    if all(objective(r, metric) == -math.inf for r in runs):
        return candidates, grid[len(grid) // 2]
    return candidates, candidates[max(range(len(runs)), key=lambda i: objective(runs[i], metric))]


# -- provenance ----------------------------------------------------------------------------------
def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def source_fingerprint(sources: Path) -> dict[str, Any]:
    """The commit and a digest of every fedxrisk source file this process imported (the per-file
    sha256 go to ``sources`` under that digest), so a cell can be traced to its code."""
    files = {}
    for name, mod in sorted(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if name.split(".")[0] != "fedxrisk" or not path:
            continue
        p = Path(path).resolve()
        rel = p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else p.as_posix()
        files[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    known = json.loads(sources.read_text()) if sources.exists() else {}
    if digest not in known:
        known[digest] = files
        sources.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    dirty = bool(git("status", "--porcelain", "--", "src"))
    return {"commit": git("rev-parse", "HEAD"), "src_dirty": dirty, "files": digest}


def record_sources(
    name: str, cells: list[dict[str, Any]], sources: Path, label: Callable[[dict], str]
) -> None:
    """provenance.json's ``name`` entry (benchmarks/provenance.py, which ``docs.py --check`` reads):
    the union of the ``cells``' :func:`source_fingerprint` files. Refuses, in one line, a cell that ran
    uncommitted source or a source not in ``sources``, and cells that ran different versions of a
    file. ``label``: a cell's name in those lines."""
    from benchmarks import provenance

    known = json.loads(sources.read_text()) if sources.exists() else {}
    files: dict[str, str] = {}
    for rec in cells:
        src = rec["source"]
        if src["src_dirty"]:
            sys.exit(f"{name}: cell {label(rec)} ran with uncommitted changes in src/; rerun it")
        if src["files"] not in known:
            sys.exit(f"{name}: cell {label(rec)} has no recorded source {src['files']}; rerun it")
        for path, sha in known[src["files"]].items():
            if files.setdefault(path, sha) != sha:
                sys.exit(f"{name}: the cells ran different versions of {path}; rerun the older ones")
    commits = sorted({rec["source"]["commit"] for rec in cells})
    provenance.record(name, files, commit=commits[-1], note=f"{len(cells)} cells; {len(commits)} commit(s)")
    print(f"{name}: recorded the source of {len(cells)} cells ({len(files)} files)")


def read_cells(path: Path) -> dict[str, Any]:
    """A study's stored cells ({} before its first)."""
    return json.loads(path.read_text()) if path.exists() else {}


def write_cells(path: Path, cells: dict[str, Any]) -> None:
    """Replace ``path`` with ``cells`` (sorted by key) in one rename: a killed study keeps its last write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(cells.items())), indent=0, allow_nan=True) + "\n")
    os.replace(tmp, path)

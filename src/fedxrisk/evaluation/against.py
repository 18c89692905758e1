"""``fedxrisk evaluate RUN_A --against RUN_B``: is model A better than model B on the same patients?

AUROC: DeLong's paired test (:func:`fedxrisk.stats.delong_paired`, pROC's
``roc.test(paired = TRUE)``); AP and pAUC(FPR ≤ 0.3): the paired stratified bootstrap
(:func:`fedxrisk.stats.paired_bootstrap`), one set of resamples for both models. On data with
sites the federated paired test (two secure sums, :mod:`fedxrisk.stats.federated`) is reported
beside it (:mod:`fedxrisk.evaluation.federated`). The two runs must have been tested on the same
patients: their rebuilt test sets are compared and a difference is refused in one line.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch

from fedxrisk.inference import InputError, TrainedModel

PAUC_FPR = 0.3


def check_comparable(a: TrainedModel, b: TrainedModel) -> None:
    """One-line :class:`InputError` when model B cannot score model A's inputs the same way, or is model A."""
    if os.path.samefile(a.run_dir / "model.pt", b.run_dir / "model.pt"):
        raise InputError(
            f"--against {b.run_dir} is the evaluated run itself; name another run to compare with"
        )
    if a.input_shape != b.input_shape or a.num_labels != b.num_labels:
        raise InputError(
            f"--against {b.run_dir}: its model takes inputs {list(b.input_shape)} with {b.num_labels} label(s), "
            f"{a.run_dir}'s {list(a.input_shape)} with {a.num_labels}; they cannot be compared"
        )


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return x.shape == y.shape and bool(torch.equal(x, y))
    return type(x) is type(y) and getattr(x, "paths", None) == getattr(y, "paths", None) is not None


def check_same_test_set(a: TrainedModel, b: TrainedModel) -> None:
    """One-line :class:`InputError` unless both runs' rebuilt test sets hold the same rows in the same order."""
    from fedxrisk.run.build import build_data

    try:
        da, db = build_data(a.config)[0].data, build_data(b.config)[0].data
    except ValueError as e:
        raise InputError(f"cannot rebuild a run's data to compare the test sets ({e})") from e
    if len(da.y_test) != len(db.y_test):
        raise InputError(
            f"--against {b.run_dir}: its test set has {len(db.y_test)} rows, {a.run_dir}'s {len(da.y_test)}; "
            "a paired comparison needs the same patients (same data, split and seed), or use --dataset"
        )
    if not (_same(da.y_test, db.y_test) and _same(da.x_test, db.x_test)):
        raise InputError(
            f"--against {b.run_dir}: its test set holds other patients (or other features) than {a.run_dir}'s; "
            "a paired comparison needs the same patients (same data, split and seed), or use --dataset"
        )


def against_report(
    y: np.ndarray,
    scores_a: np.ndarray,
    scores_b: np.ndarray,
    names: list[str],
    run_b: str,
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    """Per label: A − B by the paired DeLong test (AUROC) and the paired bootstrap (AP, pAUC30)."""
    from fedxrisk.metrics import _rankable
    from fedxrisk.stats import compare_models

    labels = {}
    for j, name in enumerate(names):
        known = ~np.isnan(y[:, j])
        yj = y[known, j].astype(bool)
        sa, sb = _rankable(scores_a[known, j]), _rankable(scores_b[known, j])
        if sa is None or sb is None or not 0 < yj.sum() < len(yj) or resamples < 1:
            nan = {"difference": math.nan, "p_value": math.nan, "low": math.nan, "high": math.nan}
            labels[name] = {"auroc": nan, "ap": nan, "pauc": nan}
            continue
        labels[name] = compare_models(yj, sa, sb, resamples, [seed, 99, j], PAUC_FPR)
    return {
        "run": run_b,
        "method": "AUROC: paired DeLong test; AP, pAUC30: paired stratified bootstrap (percentile interval)",
        "resamples": resamples,
        "labels": labels,
    }


def _n(x: float, fmt: str = ".4f") -> str:
    return "–" if x is None or math.isnan(x) else format(x, fmt)


def _p(x: float) -> str:
    return "–" if x is None or math.isnan(x) else (f"{x:.2e}" if x < 1e-3 else f"{x:.4f}")


def _rows(result: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    rows = []
    for label, metrics in result["against"]["labels"].items():
        for key, name in (("auroc", "AUROC"), ("ap", "AP"), ("pauc", "pAUC30")):
            m = metrics[key]
            a, b = (
                (m.get("auroc1"), m.get("auroc2"))
                if key == "auroc"
                else (m.get("estimate1"), m.get("estimate2"))
            )
            ci = f"[{_n(m['low'], '+.4f')}, {_n(m['high'], '+.4f')}]"
            rows.append((label, name, _n(a), _n(b), f"{_n(m['difference'], '+.4f')} {ci}", _p(m["p_value"])))
    return rows


def markdown_lines(result: dict[str, Any]) -> list[str]:
    if "against" not in result:
        return []
    ag = result["against"]
    lines = [
        f"## Against {ag['run']} (same patients)",
        "",
        f"{ag['method']} ({ag['resamples']} resamples). Difference = this run − the other.",
        "",
        "| label | metric | this run | other | difference [95% CI] | p |",
        "|---|---|---:|---:|---|---:|",
    ]
    lines += [f"| {' | '.join(r)} |" for r in _rows(result)]
    return [*lines, ""]


def console_table(result: dict[str, Any]) -> Any | None:
    from rich import box
    from rich.table import Table

    if "against" not in result:
        return None
    table = Table(title=f"this run − {result['against']['run']}"[:76], box=box.SIMPLE_HEAD)
    for name in ("label", "metric", "this", "other", "difference [95% CI]", "p"):
        table.add_column(
            name, justify="left" if name in ("label", "metric", "difference [95% CI]") else "right"
        )
    for row in _rows(result):
        table.add_row(row[0][:12], *row[1:])
    return table

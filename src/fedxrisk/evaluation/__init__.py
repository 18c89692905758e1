"""``fedxrisk evaluate``: a finished run's model on labelled data, with 95% confidence intervals.

Per label (multi-label data) and per group (the run's clients, or the sites of
a ``source`` column), this reports AUROC with DeLong's interval
(:mod:`fedxrisk.stats.delong`), average precision and the normalized partial
AUROC at FPR ≤ 0.3 (:func:`fedxrisk.metrics.partial_auroc`) with stratified
bootstrap percentile intervals (:mod:`fedxrisk.stats.bootstrap`). Point
estimates are the functions of :mod:`fedxrisk.metrics` the run itself used, so
evaluating a run on its own data reproduces ``summary.json``'s ``final`` block
(the ``summary`` entry of ``evaluation.json``).

Data: by default the run's own test set rebuilt from its ``config.toml``, with
one row per client on the client's own test portion where the data has one (a
``source`` partition whose reader keeps each site's test rows: heart_disease,
sites, a manifest with ``split`` and ``source``), else on its training shard,
labelled as such in a table of its own; or ``dataset`` (+ ``data_dir``) read by a
registered reader (its ``split``; groups = the split's ``source`` column, where
the reader keeps it); or a ``manifest`` CSV scored in streamed batches (every row; groups =
its ``source`` column; a multi-label run needs its label columns, where -1
(uncertain) leaves the row out of that label and a blank counts as 0).
No engine is started.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.evaluation.against import against_report, check_comparable, check_same_test_set
from fedxrisk.evaluation.clinic import calibration_report, operating_points
from fedxrisk.evaluation.data import Progress, Scored, _manifest_data, dataset_data, run_data
from fedxrisk.evaluation.federated import federated_report
from fedxrisk.evaluation.report import FILES, PAUC_FPR, console_tables, markdown, write_files
from fedxrisk.evaluation.survival import evaluate_survival, is_survival_run, refuse_binary_options
from fedxrisk.inference import InputError, TrainedModel, load_trained, resolve_workers
from fedxrisk.outfiles import check_folder, refuse_inputs

__all__ = [
    "FILES",
    "PAUC_FPR",
    "Scored",
    "console_tables",
    "evaluate",
    "label_metrics",
    "markdown",
    "run_summary",
]
LEVEL = 0.95
SPLITS = ("test", "train")
MAX_BOOTSTRAP = 100_000  # resamples: a 95% percentile interval is stable long before this


def evaluate(
    run_dir: str | Path,
    *,
    dataset: str | None = None,
    data_dir: str | None = None,
    manifest: str | Path | None = None,
    split: str = "test",
    bootstrap: int = 1000,
    seed: int = 0,
    device: str = "cpu",
    out: str | Path | None = None,
    overwrite: bool = False,
    batch_size: int = 256,
    workers: int | None = None,
    progress: Progress | None = None,
    against: str | Path | None = None,
    at_specificity: float | None = None,
    at_sensitivity: float | None = None,
    calibration: bool = False,
    threshold_from: str = "test",
    personal: bool = False,
    dp_epsilon: float | None = None,
    dp_delta: float = 1e-5,
) -> dict[str, Any]:
    """Evaluate the final model of ``run_dir``; write evaluation.json/.md, roc.png, pr.png into ``out``.

    ``against``: a second run scored on the same patients (paired tests,
    :mod:`fedxrisk.evaluation.against`); ``at_specificity``/``at_sensitivity``: operating points
    with CIs, their threshold chosen on the evaluated data (``threshold_from = "test"``, in-sample)
    or on the run's validation data (``"validation"``); ``calibration``: Brier, ECE, temperature scaling and reliability.png
    (:mod:`fedxrisk.evaluation.clinic`). On data with sites the pooled AUROC [CI] is also computed
    federated (:mod:`fedxrisk.evaluation.federated`), and with ``dp_epsilon`` from one
    differentially private release (:mod:`fedxrisk.stats.dp_eval`).

    ``out`` defaults to the run folder; existing evaluation files there are refused
    unless ``overwrite``. File data is read lazily and decoded in ``workers`` processes
    (default: half the cores). Raises :class:`~fedxrisk.inference.InputError` before
    anything is written when the run, the data or an option is bad.
    """
    if manifest is not None and (dataset is not None or data_dir is not None):
        raise InputError("give either --manifest or --dataset/--data-dir, not both")
    if data_dir is not None and dataset is None:
        raise InputError("--data-dir needs --dataset (the reader that reads it)")
    if split not in SPLITS:
        raise InputError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0 <= bootstrap <= MAX_BOOTSTRAP:
        raise InputError(
            f"--bootstrap must be between 0 (no bootstrap intervals) and {MAX_BOOTSTRAP}, got {bootstrap}"
        )
    if seed < 0:
        raise InputError(f"--seed must be ≥ 0, got {seed}")
    if batch_size < 1:
        raise InputError(f"--batch-size must be ≥ 1, got {batch_size}")
    for name, v in (("--at-specificity", at_specificity), ("--at-sensitivity", at_sensitivity)):
        if v is not None and not 0 < v < 1:
            raise InputError(f"{name} must lie strictly between 0 and 1, got {v}")
    if personal and (dataset is not None or manifest is not None):
        raise InputError(
            "--personal scores each site's model on the run's own test rows: drop --dataset/--manifest"
        )
    if threshold_from not in ("test", "validation"):
        raise InputError(f"--threshold-from must be test or validation, got {threshold_from!r}")
    if dp_epsilon is not None and not (0 < dp_epsilon < math.inf and 0 < dp_delta < 1):
        raise InputError(
            f"--dp-epsilon must be a finite number > 0 and --dp-delta in (0, 1), got {dp_epsilon}, {dp_delta}"
        )
    if against is not None and manifest is not None:
        raise InputError("--against compares on the run's own test set or a --dataset, not a --manifest")
    folder = Path(out) if out is not None else Path(run_dir)
    check_folder(folder, lambda f: (f / "config.toml").exists() or (f / "evaluation.json").exists(),
                 "fedxrisk run or evaluation")  # fmt: skip
    if manifest is not None:
        for name in FILES:
            refuse_inputs(folder / name, [("the --manifest file", Path(manifest))])
    names = (*FILES, "reliability.png") if calibration else FILES
    taken = [name for name in names if (folder / name).exists() or (folder / name).is_symlink()]
    if taken and not overwrite:
        raise InputError(f"{folder}: already holds {', '.join(taken)}; pass --overwrite to replace, or --out")
    trained = load_trained(run_dir, device)
    if is_survival_run(trained):  # Harrell's C per site and pooled (evaluation/survival.py)
        refuse_binary_options(dict(manifest=manifest, against=against, at_specificity=at_specificity,
                                   at_sensitivity=at_sensitivity, calibration=calibration, personal=personal,
                                   dp_epsilon=dp_epsilon))  # fmt: skip
        return evaluate_survival(trained, folder, dataset, data_dir, split, bootstrap, seed)
    other = None if against is None else load_trained(against, device)
    workers = resolve_workers(workers)
    if other is not None:
        check_comparable(trained, other)
        if dataset is None:
            check_same_test_set(trained, other)
    if manifest is not None:
        data = _manifest_data(trained, manifest, batch_size, workers, progress)
    elif dataset is not None:
        data = dataset_data(trained, dataset, data_dir, split, workers)
    else:
        data = run_data(trained)
    result = _report(trained, data, bootstrap, seed)
    data_b = None
    if other is not None:
        data_b = (
            run_data(trained, other)
            if dataset is None
            else dataset_data(trained, dataset, data_dir, split, workers, other)
        )
        result["against"] = against_report(
            data.y, data.scores, data_b.scores, trained.label_names, str(against), bootstrap, seed
        )
    dp = None if dp_epsilon is None else (dp_epsilon, dp_delta)
    result["federated"] = federated_report(data, trained.label_names, data_b, dp=dp, seed=seed)
    if dp is not None and result["federated"] is None:
        raise InputError(
            "--dp-epsilon privatizes the federated evaluation: the data needs sites (a source column)"
        )
    if personal:
        from fedxrisk.evaluation.personal import personal_report

        result["personal"] = personal_report(trained, label_metrics, bootstrap, seed)
    asks = (at_specificity, at_sensitivity, threshold_from)
    clinic(result, trained, data, asks, calibration, bootstrap, seed)
    write_files(result, data, trained.label_names, folder)
    return result


def clinic(result: dict[str, Any], trained: TrainedModel, data: Scored, asks: tuple[float | None, float | None, str],
           calibration: bool, resamples: int, seed: int) -> None:  # fmt: skip
    """Operating points (``asks`` = at_specificity, at_sensitivity, where the threshold is chosen) and
    calibration per label, into ``result`` (the validation data: the run's)."""
    from fedxrisk.metrics import _rankable

    at_specificity, at_sensitivity, threshold_from = asks
    names = trained.label_names
    validation = None
    if calibration or (threshold_from == "validation" and asks[:2] != (None, None)):
        validation = data.validation if data.shards is not None else run_data(trained).validation
    if at_specificity is not None or at_sensitivity is not None:
        if threshold_from == "validation" and validation is None:
            raise InputError(
                f"--threshold-from validation: {trained.run_dir} has no validation data (train with data.validation)"
            )
        ops = {}
        for j, name in enumerate(names):
            known = ~np.isnan(data.y[:, j])
            s = _rankable(data.scores[known, j])
            chosen = None
            if threshold_from == "validation":
                vy, vs = validation[0][:, j], validation[1][:, j]  # type: ignore[index]
                chosen = (vy[~np.isnan(vy)], vs[~np.isnan(vy)])
            ops[name] = (
                {}
                if s is None
                else operating_points(
                    data.y[known, j], s, at_specificity, at_sensitivity, resamples, seed, chosen
                )
            )
        result["operating_points"] = ops
    if calibration:
        result["calibration"] = {
            name: calibration_report(data.y[:, j], data.scores[:, j],
                                     None if validation is None else (validation[0][:, j], validation[1][:, j]),
                                     trained.config.algorithm)
            for j, name in enumerate(names)
        }  # fmt: skip


# ---- metrics ------------------------------------------------------------------------------------


def label_metrics(y: np.ndarray, scores: np.ndarray, resamples: int, seed: Sequence[int]) -> dict[str, Any]:
    """AUROC [DeLong CI], AP and pAUC(FPR ≤ 0.3) [bootstrap CIs] of one label; NaN labels left out."""
    from fedxrisk.metrics import _rankable, auroc, average_precision, partial_auroc
    from fedxrisk.stats import bootstrap_intervals, delong, wald_interval
    from fedxrisk.stats.bootstrap import weighted_ap, weighted_partial_auroc

    known = ~np.isnan(y)
    y, scores = y[known], scores[known]
    ranked = _rankable(scores)
    both = ranked is not None and 0 < y.sum() < len(y)
    point = auroc(y, scores)
    variance = delong(y, ranked).variance if both else math.nan
    boot = bootstrap_intervals(
        y, ranked if ranked is not None else scores,
        {"ap": weighted_ap, "pauc30": lambda y, s, c: weighted_partial_auroc(y, s, c, PAUC_FPR)},
        resamples, seed, LEVEL,
    )  # fmt: skip
    return {
        "n": int(len(y)),
        "positives": int(y.sum()),
        "negatives": int(len(y) - y.sum()),
        "prevalence": float(y.mean()) if len(y) else math.nan,  # AP's baseline: a random ranking's AP
        "auroc": point,
        "auroc_se": math.sqrt(variance) if not math.isnan(variance) else math.nan,
        "auroc_ci": list(wald_interval(point, variance, LEVEL)),
        "ap": average_precision(y, scores),
        "ap_ci": list(boot["ap"]),
        "pauc30": partial_auroc(y, scores, PAUC_FPR),
        "pauc30_ci": list(boot["pauc30"]),
    }


def metric_warnings(overall: dict[str, dict[str, Any]]) -> list[str]:
    """A warning per label with one class only (no AUROC, AP or pAUC exists), and per label whose
    AUROC lies clearly below 0.5 (the whole DeLong interval, or < 0.3 without one): the scores rank
    negatives first, as when the positive class is inverted."""
    out = []
    for name, m in overall.items():
        if m["positives"] == 0 or m["negatives"] == 0:
            where = "the evaluated rows" if name == "score" else f"label {name!r}"
            missing = "positive" if m["positives"] == 0 else "negative"
            out.append(
                f"{where}: {m['n']} row(s), no {missing} one: AUROC, AP and pAUC are undefined (null); "
                "evaluate on data holding both classes"
            )
        hi = m["auroc_ci"][1]
        low = hi < 0.5 if hi is not None and not math.isnan(hi) else m["auroc"] < 0.3
        if low and not math.isnan(m["auroc"]):
            where = "" if name == "score" else f" ({name})"
            out.append(
                f"AUROC {m['auroc']:.4f}{where} is far below 0.5: scores rank negatives first: "
                "is the positive class inverted?"
            )
    return out


def run_summary(y: np.ndarray, scores: np.ndarray, client_aurocs: Sequence[float] | None) -> dict[str, Any]:
    """The keys of summary.json's ``final`` block, by :func:`fedxrisk.metrics.final_metrics` as training
    computes them (``y``, ``scores``: ``[N, L]``; one label is scored as single-label)."""
    from fedxrisk.metrics import final_metrics

    if y.shape[1] == 1:
        y, scores = y[:, 0], scores[:, 0]
    return final_metrics(y, scores, None if client_aurocs is None else list(client_aurocs))


def _report(trained: TrainedModel, data: Scored, resamples: int, seed: int) -> dict[str, Any]:
    from fedxrisk.metrics import _nanmean, auroc, per_label

    names = trained.label_names

    def table(y: np.ndarray, s: np.ndarray, g: int) -> dict[str, Any]:
        return {
            name: label_metrics(y[:, j], s[:, j], resamples, [seed, g, j]) for j, name in enumerate(names)
        }

    clients = None
    if data.shards is not None:
        clients = [_nanmean(per_label(auroc, gy, gs)) for gy, gs in data.shards]
    overall = table(data.y, data.scores, 0)
    return {
        "run": str(trained.run_dir),
        "data": data.description,
        "positive_class": trained.positive,
        "warnings": metric_warnings(overall),
        "samples": int(len(data.y)),
        "labels": names,
        "level": LEVEL,
        "pauc_max_fpr": PAUC_FPR,
        "auroc_interval": "DeLong (Wald on the AUROC scale, clipped to [0, 1])",
        "bootstrap": {"resamples": resamples, "seed": seed, "method": "stratified percentile"},
        "overall": overall,
        "summary": run_summary(data.y, data.scores, clients),
        "group_kind": data.group_kind,
        "groups_split": data.groups_split,
        "groups": {name: table(gy, gs, 1 + i) for i, (name, gy, gs) in enumerate(data.groups)},
    }

"""``fedxrisk evaluate`` on a survival run: Harrell's C per site and pooled, with patient-bootstrap CIs.

The run's own test set is rebuilt from its ``config.toml`` (as training built it), or a registered
survival reader's split is read (``--dataset``/``--data-dir``/``--split``); the saved model's risk
scores (its logits: higher = earlier failure, the scores ``fedxrisk predict`` writes) are scored by
:func:`fedxrisk.stats.survival.cindex_report` (pooled, per site, mean over sites; intervals over
resamples of the patients within each site, none where C = 0/1 or a site has too few events).
Evaluating a run on its own test set reproduces ``summary.json``'s ``test_cindex`` (same seed).
Writes ``evaluation.json`` and ``evaluation.md`` together.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.inference import InputError, TrainedModel

# evaluate's options that have no survival meaning (AUROC curves, thresholds, calibration, …)
BINARY_ONLY = (
    "manifest",
    "against",
    "at_specificity",
    "at_sensitivity",
    "calibration",
    "personal",
    "dp_epsilon",
)
FILES = ("evaluation.json", "evaluation.md")


def is_survival_run(trained: TrainedModel) -> bool:
    """A run of a survival dataset (:data:`fedxrisk.data.registry.SURVIVAL_DATASETS`)."""
    from fedxrisk.catalog import table

    return trained.config.dataset in table("survival_datasets")


def refuse_binary_options(options: dict[str, Any]) -> None:
    """One line naming the first option a survival evaluation does not take."""
    for name in BINARY_ONLY:
        if options.get(name) not in (None, False):
            flag = "--" + name.replace("_", "-")
            raise InputError(
                f"{flag} applies to binary runs; a survival run is evaluated by Harrell's C-index "
                f"(per site and pooled, patient-bootstrap CIs): drop {flag}"
            )


def survival_data(
    trained: TrainedModel, dataset: str | None, data_dir: str | None, split: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any, tuple[str, ...], str]:
    """(times, events, risk scores, sites, site names, where) of the run's test set or a reader's split."""
    from fedxrisk.catalog import table

    if dataset is None:
        from fedxrisk.run.build import build_data

        try:
            fed, _ = build_data(trained.config)
        except ValueError as e:
            raise InputError(f"{trained.run_dir}: cannot rebuild the run's data ({e})") from e
        d, split, where = fed.data, "test", f"the run's test set ({trained.config.dataset})"
    else:
        from fedxrisk.data.loading import load_dataset
        from fedxrisk.data.types import binarize

        if dataset not in table("survival_datasets"):
            raise InputError(
                f"{dataset!r} is not survival data; a survival run is evaluated on one of "
                f"{', '.join(table('survival_datasets'))}"
            )
        try:
            d = binarize(load_dataset(dataset, data_dir))
        except ValueError as e:
            raise InputError(str(e)) from e
        if d.input_shape != trained.input_shape:
            raise InputError(
                f"{dataset}: inputs {list(d.input_shape)}; the model takes {list(trained.input_shape)}"
            )
        where = f"{dataset}{f' in {data_dir}' if data_dir else ''}, {split} split"
    x, y, groups = (
        (d.x_test, d.y_test, d.groups_test) if split == "test" else (d.x_train, d.y_train, d.groups_train)
    )
    scores = np.asarray(trained.model_logits(x), np.float64).ravel()
    return groups["time"], y.numpy(), scores, groups.get("source"), tuple(d.source_names), where


def evaluate_survival(
    trained: TrainedModel,
    folder: Path,
    dataset: str | None,
    data_dir: str | None,
    split: str,
    bootstrap: int,
    seed: int,
) -> dict[str, Any]:
    """evaluation.json's content for a survival run (module doc), written with evaluation.md."""
    from fedxrisk.outfiles import make_folder, text_writer, write_together
    from fedxrisk.run.folder import json_safe
    from fedxrisk.stats.survival import cindex_report

    if bootstrap < 1:
        raise InputError("--bootstrap 0: a survival evaluation's intervals resample patients; give ≥ 1")
    times, events, scores, sites, names, where = survival_data(trained, dataset, data_dir, split)
    report = cindex_report(times, events, scores, sites, names, draws=bootstrap, seed=seed)
    result: dict[str, Any] = {
        "task": "survival",
        "run": str(trained.run_dir),
        "data": where,
        "metric": "Harrell's C-index of the model's risk scores (higher = earlier event)",
        "test_cindex": report,
        "federated": federated_block(times, events, scores, sites),
        "warnings": [],
    }
    result["files"] = [str(folder / f) for f in FILES]
    texts = {
        "evaluation.json": json.dumps(json_safe(result), indent=2, allow_nan=False) + "\n",
        "evaluation.md": markdown(result),
    }
    make_folder(folder)
    write_together({folder / n: text_writer(t) for n, t in texts.items()}, "no evaluation file was written")
    return result


FEDERATED_NOTE = (
    "computed without pooling risk scores: two secure sums (fedxrisk.stats.federated_cindex); released: "
    "the pooled count of patients per (time bin, score bin), without site or event flag, the largest "
    "time and four sums; with fine bins a cell often holds one patient, so the binned (time, score) pairs "
    "are revealed, not who or where"
)


def federated_block(times: Any, events: Any, scores: Any, sites: Any) -> dict[str, Any] | None:
    """The pooled C-index computed federated (none without sites), with its bound and disclosure."""
    from dataclasses import asdict

    from fedxrisk.stats.federated_cindex import federated_cindex

    if sites is None or len(np.unique(sites)) < 2:
        return None
    site = np.asarray(sites)
    parts = [(times[site == k], events[site == k], scores[site == k]) for k in np.unique(site)]
    return {**asdict(federated_cindex(parts)), "note": FEDERATED_NOTE}


def markdown_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(group, C-index [CI] (events)) rows: pooled, mean over sites, each site."""
    from fedxrisk.stats.survival import describe

    rows = [("pooled", describe(report["pooled"]))]
    if "mean_over_sites" in report:
        rows.append(("mean over sites", describe(report["mean_over_sites"])))
    return rows + [(name, describe(entry)) for name, entry in report["per_site"].items()]


def markdown(result: dict[str, Any]) -> str:
    """evaluation.md of a survival run."""
    lines = [f"# Evaluation of {result['run']}", "", f"Data: {result['data']}. {result['metric']}.", ""]
    lines += ["| group | C-index [95% CI] (events) |", "|---|---|"]
    lines += [f"| {group} | {text} |" for group, text in markdown_rows(result["test_cindex"])]
    lines += ["", f"Intervals: {result['test_cindex']['interval']}."]
    fed = result.get("federated")
    if fed:
        lines += ["", f"Pooled C-index computed federated: {fed['c_index']:.4f} (± {fed['bound']:.4f} binning "
                  f"bound), {fed['note']}."]  # fmt: skip
    return "\n".join(lines) + "\n"

"""``fedxrisk predict``: a finished run's scores for new inputs, streamed in batches into a CSV.

One output row per input row: its identifier column(s) (see :mod:`fedxrisk.inputs`)
then one score column per label. ``scores="prob"`` (default) writes the sigmoid
of the model's logit, ``"logit"`` the logit itself, ``"both"`` both; a label's
columns are named ``prob`` / ``logit`` for a single-label model and
``prob_<label>`` / ``logit_<label>`` otherwise. Values have 9 significant
digits, so a logit reads back as exactly the float32 the model returned.
Models trained with AUC losses rank well but are not calibrated: a probability
here orders inputs, it is not a risk estimate. A survival run writes one ``risk`` column
whatever ``scores`` says: the model's logit η, the Cox risk score (higher = earlier event; the
scores ``evaluate`` computes Harrell's C of).

Identifier cells a spreadsheet would take for a formula (``=…``, ``+…``, ``-…``,
``@…``) are written with a leading ``'`` (:func:`fedxrisk.textsafe.csv_cell`).

The CSV is written to a temporary file and renamed at the end: an error (a
corrupt image met on the way) leaves nothing behind. An existing ``out`` is
refused unless ``overwrite=True``.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.evaluation.survival import is_survival_run
from fedxrisk.inference import InputError, load_trained, resolve_workers
from fedxrisk.inputs import open_input
from fedxrisk.outfiles import check_creatable, make_folder, refuse_inputs, refuse_symlink, replace_atomic
from fedxrisk.textsafe import csv_cell

SCORE_KINDS = ("prob", "logit", "both")
Progress = Callable[[int, int], None]  # (rows done, rows in total)


@dataclass
class Predictions:
    """Identifiers and logits ``[N, L]`` of every input row, in input order."""

    id_columns: tuple[str, ...]
    ids: list[tuple[Any, ...]]
    logits: np.ndarray
    label_names: list[str]
    positive: str | None = None  # the positive class's name (one-label runs that record it)
    survival: bool = False  # a survival run: one ``risk`` column, the logit (higher = earlier event)

    @property
    def probabilities(self) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.logits.astype(np.float64)))

    def columns(self, scores: str = "prob") -> list[str]:
        if self.survival:
            return ["risk"]
        kinds = ("prob", "logit") if scores == "both" else (scores,)
        if self.label_names == ["score"]:
            return [f"{k}_{self.positive}" if self.positive else k for k in kinds]
        return [f"{k}_{name}" for k in kinds for name in self.label_names]


def check_out(
    out: str | Path | None, overwrite: bool, run_dir: str | Path = "", input: str | Path = ""
) -> None:
    """Refuse to replace an existing file unless ``overwrite``; never the input or a file of the run."""
    if out is None:
        return
    out = Path(out)
    refuse_symlink(out)
    inputs = [("the input", Path(input))] if str(input) else []
    if str(run_dir) and Path(run_dir).is_dir():
        inputs += [
            (f"a file of the run {run_dir}", p) for p in sorted(Path(run_dir).iterdir()) if p.is_file()
        ]
    refuse_inputs(out, inputs)
    if out.exists() and not overwrite:
        raise InputError(f"{out}: already exists; choose another --out or pass --overwrite to replace it")
    if out.exists() and out.is_dir():
        raise InputError(f"--out {out} is a folder; name the CSV file to write")
    check_creatable(out.parent)


def predict(
    run_dir: str | Path,
    input: str | Path,
    out: str | Path | None = None,
    *,
    scores: str = "prob",
    batch_size: int = 256,
    device: str = "cpu",
    workers: int | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Predictions:
    """Score ``input`` with the final model of ``run_dir``; write ``out`` (CSV) when given.

    ``workers``: processes decoding images ahead (default: half the cores; 0: none).
    Raises :class:`~fedxrisk.inference.InputError` (a ``ConfigError``) for a bad run
    folder, input or ``out`` before anything is written.
    """
    if scores not in SCORE_KINDS:
        raise InputError(f"scores must be one of {SCORE_KINDS}, got {scores!r}")
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1, got {batch_size}")
    check_out(out, overwrite, run_dir, input)
    trained = load_trained(run_dir, device)
    source = open_input(input, trained.input_shape, resolve_workers(workers), trained.preprocessing)
    ids: list[tuple[Any, ...]] = []
    logits: list[np.ndarray] = []
    for batch in source.batches(batch_size):
        ids += batch.ids
        logits.append(trained.logits(batch.x).reshape(len(batch.ids), -1))
        if progress:
            progress(len(ids), source.count)
    width = trained.num_labels
    result = Predictions(
        source.id_columns, ids, np.concatenate(logits) if logits else np.zeros((0, width), np.float32),
        trained.label_names, _positive_name(trained.positive), is_survival_run(trained),
    )  # fmt: skip
    if out is not None:
        write_csv(result, Path(out), scores)
    return result


def write_csv(pred: Predictions, out: Path, scores: str = "prob") -> None:
    """The predictions as CSV, through a temporary file and a rename."""
    blocks = {"prob": pred.probabilities, "logit": pred.logits}
    kinds = ("logit",) if pred.survival else ("prob", "logit") if scores == "both" else (scores,)
    values = np.hstack([blocks[k] for k in kinds])

    def write(f) -> None:
        writer = csv.writer(f)
        writer.writerow([*map(csv_cell, pred.id_columns), *pred.columns(scores)])
        for ident, row in zip(pred.ids, values):
            writer.writerow([*map(csv_cell, ident), *(format(float(v), ".9g") for v in row)])

    make_folder(out.parent)
    replace_atomic(out, write)


def _positive_name(record: dict[str, Any] | None) -> str | None:
    """``lesion`` (``a+b`` for several positive classes) from summary.json's positive_class, if named."""
    names = (record or {}).get("names")
    return "+".join(names) if names else None

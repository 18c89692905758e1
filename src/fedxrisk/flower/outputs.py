"""The server's outputs of a Flower run: evaluation rows in ``history.csv``, ``model.pt``, ``summary.json``.

Every file goes through the project's safe writers (:mod:`fedxrisk.outfiles`: never through a
symbolic link, a full disk in one line; ``model.pt`` and ``summary.json`` written atomically)
and every ``history.csv`` cell through :func:`fedxrisk.textsafe.csv_cell`.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.engines.validation import BOUND_KEYS, VAL_KEYS, histogram_validation
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.wire import Packet, unflatten
from fedxrisk.metrics import auroc, average_precision, predict
from fedxrisk.outfiles import disk_errors, open_append, replace_atomic
from fedxrisk.run.folder import (  # noqa: F401  (LAST_MODEL: re-exported for the coordinator)
    HISTORY,
    HISTORY_FIELDS,
    LAST_MODEL,
    MODEL,
    SUMMARY,
    json_safe,
    write_json_atomic,
)
from fedxrisk.textsafe import csv_cell
from fedxrisk.tree import Tree


def history_fields(cfg: FlowerConfig) -> tuple[str, ...]:
    """``history.csv``'s columns: those of ``fedxrisk run`` (a private run adds ``epsilon`` and, where
    replacing one site's data costs more, ``epsilon_replace_one``, as run/privacy_outputs.py)."""
    p = cfg.privacy
    if p is None:
        return HISTORY_FIELDS
    from fedxrisk.engines.privacy.accountant import REPLACE, relation

    same = relation(p["sampling"], p["sampling_rate"]) == REPLACE
    return (*HISTORY_FIELDS, "epsilon", *(() if same else ("epsilon_replace_one",)))


def summed_validation(replies: list[Packet]) -> dict[str, float]:
    """``val_*`` and ``val_*_bound`` of the global model from the **sum** of the sites' per-class
    score histograms (integers: secure aggregation could wrap the sum); NaN when no site holds
    validation data. The same code computes the distributed engine's values from its ranks' sums."""
    secure = [rep.arrays["validation-sum"]["counts"] for rep in replies if "validation-sum" in rep.arrays]
    if secure:  # under SecAgg+: the sum, the same on every reply
        return histogram_validation(secure[0].numpy())
    counts = [rep.arrays["validation"]["counts"] for rep in replies if "validation" in rep.arrays]
    if not counts:
        return dict.fromkeys((*VAL_KEYS, *BOUND_KEYS), math.nan)
    return histogram_validation(torch.stack(counts).sum(0).numpy())


def global_model(replies: list[Packet]) -> dict[str, Tree]:
    """The simulation's global model from the sites' reported models (in client order): client 0's
    parameters, the client mean of float buffers."""
    models = [unflatten(rep.arrays["model"]) for rep in replies]
    buffers = {
        k: torch.stack([m["buffers"][k].float() for m in models]).mean(0).to(v.dtype)
        if v.is_floating_point()
        else v
        for k, v in models[0].get("buffers", {}).items()
    }
    return {"params": models[0]["params"], "buffers": buffers}


def mean_std(values: list[float], name: str) -> dict[str, float]:
    valid = [v for v in values if v >= 0]  # −1: the site's AUROC is undefined (one class)
    mean = float(np.mean(valid)) if valid else math.nan
    return {f"{name}_mean": mean, f"{name}_std": float(np.std(valid)) if valid else math.nan}


class RunOutputs:
    """The files in ``out-dir``: ``history.csv`` rows as evaluations come, models, the summary."""

    def __init__(self, cfg: FlowerConfig):
        self.cfg, self.out, self.fields = cfg, Path(cfg.deploy.out_dir), history_fields(cfg)
        self.history: list[dict[str, Any]] = []
        self._append: Callable[[dict[str, Any]], None] | None = None
        self._widen: Callable[[tuple[str, ...]], None] | None = None

    @contextmanager
    def open(self) -> Iterator[None]:
        """``history.csv`` with its header (replacing an old one), open for rows until the context ends."""
        with disk_errors(self.out, "nothing was written"):
            self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / HISTORY
        header = io.StringIO()
        csv.DictWriter(header, fieldnames=self.fields).writeheader()
        replace_atomic(path, lambda f: f.write(header.getvalue()))
        with open_append(path) as f:

            def append(row: dict[str, Any]) -> None:
                writer = csv.DictWriter(f, fieldnames=self.fields, extrasaction="ignore")
                with disk_errors(path):
                    writer.writerow({k: csv_cell(v) for k, v in row.items()})
                    f.flush()

            def widen(extra: tuple[str, ...]) -> None:  # before the first row: the header again
                self.fields = (*self.fields, *extra)
                with disk_errors(path):
                    f.truncate(0)  # appending: the next write starts the file
                    csv.DictWriter(f, fieldnames=self.fields).writeheader()
                    f.flush()

            self._append, self._widen = append, widen
            try:
                yield
            finally:
                self._append = self._widen = None

    def extend_fields(self, extra: tuple[str, ...]) -> None:
        """Columns known once the sites are (a personalized run's per-site columns), before any row."""
        if extra:
            assert self._widen is not None and not self.history, "before the first row of an open history"
            self._widen(extra)

    def add_row(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        assert self._append is not None, "RunOutputs.open() first"
        self._append(row)

    def save_model(self, model: dict[str, Tree], input_shape: tuple[int, ...], name: str = MODEL) -> None:
        data = io.BytesIO()
        torch.save({**model, "model": self.cfg.run.model, "input_shape": input_shape}, data)
        replace_atomic(self.out / name, lambda f: f.write(data.getvalue()), "wb")

    def test_metrics(self, problem: Any, model: dict[str, Tree], holdout: Any) -> dict[str, float]:
        """``test_auroc``, ``test_ap`` of ``model`` on the server's held-out set (NaN without one)."""
        if holdout is None:
            return {"test_auroc": math.nan, "test_ap": math.nan}
        scores = predict(problem, model["params"], model["buffers"], holdout[0])
        y = holdout[1].numpy()
        return {"test_auroc": auroc(y, scores), "test_ap": average_precision(y, scores)}

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.out / SUMMARY, json_safe(summary))

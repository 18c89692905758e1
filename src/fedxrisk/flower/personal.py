"""Personalization on Flower, the server's side: the global model it can form and the per-site numbers.

A site keeps its personal entries (``model.personal``: FedBN's BatchNorm layers, FedPer's head;
Ditto's v) to itself: its collective is :class:`~fedxrisk.algorithms.personal.SiteCollective`
and its evaluation report leaves them out (flower/site_personal.py), so the server never
receives one. The server's global model (``model.pt``, ``test_auroc``) is therefore the shared
entries with the personal ones at their starting values
(:func:`~fedxrisk.algorithms.personal.start_values`), where the simulation engines average the
sites' personal entries. Every site scores its own model and that global model on its own test
rows and reports the numbers (nothing under DP or SecAgg+); :class:`FlowerPersonal` turns them
into ``fedxrisk run``'s per-site columns (``run/personalize.py``: ``personal_fields``,
``personal_row``) and summary.json's ``personal`` block.

The coordinator calls it at set-up (:class:`FlowerPersonal`, ``fields``), at each evaluation
(``global_model``, ``row``) and for the summary, so the hook moves with the server loop.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.algorithms.personal import start_values
from fedxrisk.engines.personal import history_fields, history_row, site_columns
from fedxrisk.errors import ConfigError
from fedxrisk.flower.wire import Packet
from fedxrisk.problem import Problem
from fedxrisk.run.personalize import ends_personal
from fedxrisk.run.personalize import sites_differ as run_sites_differ

SITE_KEYS = ("auroc", "ap", "global_auroc")  # engines/personal.one_site's numbers
ROW, FINAL = "site-", "final-site-"  # reply metrics: at each evaluation; after fine-tuning (last round)
PRIVATE_NOTE = "per-site metrics are not sent under DP or SecAgg+ (as no site AUROC is)"


def personalized(cfg: Any) -> bool:
    """Whether the run ends with one model per site (``model.personal``, fine-tuning, Ditto), as
    for ``fedxrisk run`` (``run/personalize.ends_personal``)."""
    return ends_personal(cfg.run.personal, cfg.run.finetune_steps, ALGORITHMS.get(cfg.run.algorithm))


def sites_differ(cfg: Any) -> bool:
    """The sites' models differ during training (personal entries, Ditto): history.csv's per-site columns."""
    return run_sites_differ(cfg.run.personal, ALGORITHMS.get(cfg.run.algorithm))


def to_wire(numbers: dict[str, float], prefix: str) -> dict[str, float]:
    """A site's :func:`~fedxrisk.engines.personal.one_site` numbers as reply metrics (NaN → −1:
    a MetricRecord holds no NaN reliably; AUROC and AP lie in [0, 1])."""
    return {f"{prefix}{k.replace('_', '-')}": -1.0 if math.isnan(v) else float(v) for k, v in numbers.items()}


def from_wire(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """The inverse of :func:`to_wire` (a missing number, e.g. a site without test rows: absent)."""
    out = {}
    for key in SITE_KEYS:
        value = metrics.get(f"{prefix}{key.replace('_', '-')}")
        if value is not None:
            out[key] = math.nan if value < 0 else float(value)
    return out


def check_flower_personal(run: Any) -> None:
    """Personal entries with selection = 'best' / early stopping: refused by the app writers and the server."""
    if run.personal != "none" and (run.selection == "best" or run.early_stopping):
        raise ConfigError(
            f"personal = {run.personal!r} with selection = 'best' / early-stopping on Flower: they would "
            "choose on the server's global model, whose personal entries are untrained (the server never "
            "receives them); use selection = 'last' and read the sites' numbers"
        )
    if run.resolved_monitor().startswith("site_") and (run.selection == "best" or run.early_stopping):
        raise ConfigError(
            f"selection = 'best' / early-stopping on {run.resolved_monitor()!r} on Flower: the sites do not "
            "report their own models' validation yet; set experiment.monitor = 'val_auroc' (the global "
            "model) or selection = 'last'"
        )


class FlowerPersonal:
    """The server's view of a personalized run over ``num_sites`` sites (an empty view otherwise)."""

    def __init__(self, cfg: Any, problem: Problem, num_sites: int):
        self.cfg, self.num_sites = cfg, num_sites
        self.on = personalized(cfg)
        # the sites' Problem: its local_names say which entries the server never receives
        # (a model without BatchNorm under personal = "bn" is refused here, before any round)
        try:
            self.problem = dataclasses.replace(problem, personal=cfg.run.personal)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check_flower_personal(cfg.run)
        self.last: list[Packet] = []  # the last evaluation's replies
        self.final: list[Packet] = []  # the last round's replies (numbers after fine-tuning)

    def fields(self) -> tuple[str, ...]:
        """history.csv's extra columns (``run/personalize.personal_fields``)."""
        if not (self.on and sites_differ(self.cfg)):
            return ()
        return history_fields(self.num_sites)

    def global_model(self, model: dict[str, Any]) -> dict[str, Any]:
        """The sites' reported model (no personal entry) completed with the starting values."""
        params, buffers = start_values(self.problem, model["params"], model["buffers"])
        return {"params": params, "buffers": buffers}

    def _columns(self, replies: list[Packet], prefix: str) -> dict[str, float]:
        return site_columns([from_wire(r.metrics, prefix) for r in replies])

    def row(self, replies: list[Packet]) -> dict[str, float]:
        """An evaluation row's per-site numbers (``run/personalize.personal_row``), from the sites'
        replies in client order."""
        if not self.on:
            return {}
        self.last = replies
        if all(r.config.get("fine-tuned") for r in replies):  # the last round: after fine-tuning
            self.final = replies
        if not sites_differ(self.cfg):
            return {}
        return history_row(self._columns(replies, ROW))

    def summary(self) -> dict[str, Any]:
        """summary.json's ``personal`` block (``fedxrisk run``'s keys; the site models stay on the sites)."""
        if not self.on:
            return {}
        run = self.cfg.run
        replies, prefix = (self.final, FINAL) if self.final else (self.last, ROW)
        rows = [r.config.get("site-rows", "none") for r in replies]
        block: dict[str, Any] = {
            "personal": run.personal,
            "finetune_steps": run.finetune_steps if self.final else 0,
            "site_rows": rows[0] if len(set(rows)) == 1 else rows,
            **self._columns(replies, prefix),
            "site_models": {},  # no file on the server: each site writes its own (node config site-model)
        }
        if self.cfg.private_reports:
            block["note"] = PRIVATE_NOTE
        return {"personal": block}

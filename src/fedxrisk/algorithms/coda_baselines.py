"""CoDA and NPA (ALGORITHMS.md §2.2, §2.5): CODA+ with another stage end or window.

CoDA (Guo et al., ICML 2020) restarts each stage from the average iterate with a
closed-form α; NPA communicates every step. Both reuse
:class:`~fedxrisk.algorithms.coda.CODAPlus`'s local step and averaging unchanged
(:mod:`fedxrisk.algorithms.coda` describes the shared forms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedxrisk.algorithms.base import Batch, Collective, RoundContext, State, register
from fedxrisk.algorithms.coda import CODAPlus
from fedxrisk.algorithms.schedule import Schedule


@register
@dataclass
class CoDA(CODAPlus):
    """CoDA (Guo et al., ICML 2020): like CODA+, but each stage restarts from the average
    iterate and sets α in closed form, α = E[s | y=0] − E[s | y=1], from a large batch
    drawn on every client (``stage_batch_size`` samples each)."""

    name = "coda"
    couples_samples = (
        "its class sums of a sampled batch leave the client at stage ends, outside the local step"
    )
    communicates = ("w", "a", "b", "alpha", "class_score_sums")

    stage_batch_size: int = 256

    def check_hyperparameters(self) -> None:
        if self.restart not in (None, "average"):
            raise ValueError("CoDA always restarts a stage from the average iterate")
        super().check_hyperparameters()
        if self.loss != "square":
            raise ValueError("CoDA's closed-form α is the AUC square loss's; use loss='square'")
        if self.stage_batch_size < 1:
            raise ValueError(f"stage_batch_size must be ≥ 1, got {self.stage_batch_size}")

    def validate_schedule(self, schedule: Schedule) -> None:
        """CoDA's restarts and closed-form α happen at stage ends: one stage would make it CODA+."""
        if len(schedule.stages) < 2:
            raise ValueError(
                "coda needs stages ≥ 2: its restart from the average iterate and its closed-form α "
                "happen only at stage ends, so with stages = 1 it is exactly codaplus "
                "(set stages, e.g. --stages 3, or use --algorithm codaplus)"
            )

    def _class_score_sums(self, w, buffers, batch: Batch) -> dict[str, torch.Tensor]:
        s = torch.sigmoid(self.problem.logits(w, buffers, batch["x"])[0])
        y = batch["y"]
        return {  # sums per label (over the batch axis)
            "pos": (s * y).sum(0),
            "n_pos": y.sum(0),
            "neg": (s * (1 - y)).sum(0),
            "n_neg": (1 - y).sum(0),
        }

    def end_stage(self, state: State, avg: dict[str, Any], comm: Collective, ctx: RoundContext) -> State:
        state = super().end_stage(state, avg, comm, ctx)
        if ctx.next_plan is None or ctx.stage_batch is None:
            return state
        sums = comm.mean(
            comm.per_client(self._class_score_sums, state["w"], state["buffers"], ctx.stage_batch)
        )
        alpha = sums["neg"] / sums["n_neg"].clamp_min(1) - sums["pos"] / sums["n_pos"].clamp_min(1)
        return dict(state, alpha=alpha)


@register
@dataclass
class NPA(CODAPlus):
    """NPA: naive parallel PPD-SG with a large local mini-batch, communicating every step (I = 1)."""

    name = "npa"
    fixed_window = 1

"""What FeDXL1/2 (:mod:`~fedxrisk.algorithms.fedxl`) and Local Pair
(:mod:`~fedxrisk.algorithms.localpair`) share: sigmoid scores, class masks,
(momentum) SGD, model averaging, and the in-order update of FeDXL2's u.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fedxrisk.algorithms.base import Algorithm, Batch, Collective, State, model_payload, with_model
from fedxrisk.objectives.pairwise import check_surrogate, pairwise_surrogate
from fedxrisk.problem import Problem
from fedxrisk.tree import tmap, zeros_like

MOMENTUM_INITS = ("grad", "zero")
GRAD_SCALES = ("objective", "code")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def log_u_in_order(
    log_u: torch.Tensor, log_x: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Per slot, log u after u ← (1 − γ) u + γ x is applied once per valid copy of the slot's
    sample in this batch, in slot order (copies share ``idx``); ``log_u`` is the value before the
    step. For d copies with observations x_1..x_d: u' = (1−γ)^d u + Σ_c γ (1−γ)^(d−c) x_c.
    Computed in log space (``log_x`` = log x); invalid slots keep ``log_u``. Vectorized, vmap-safe.
    """
    log_keep = math.log1p(-gamma) if gamma < 1 else -math.inf  # log (1 − γ)
    ok = valid > 0
    same = (idx[:, None] == idx[None, :]) & ok[:, None] & ok[None, :]  # slot j is a copy of slot i's sample
    copies = same.sum(1)  # d, per slot
    rank = (same & torch.ones_like(same).tril()).sum(1)  # c of each slot among its copies (1-based)

    def decay(k: torch.Tensor) -> torch.Tensor:  # log (1 − γ)^k, with (1 − γ)^0 = 1 also for γ = 1
        return torch.where(k == 0, 0.0, k * log_keep)

    terms = math.log(gamma) + decay(copies[:, None] - rank[None, :]) + log_x[None, :]
    terms = torch.where(same, terms, -math.inf)
    new = torch.logsumexp(torch.cat([(decay(copies) + log_u)[:, None], terms], 1), 1)
    return torch.where(ok, new, log_u)


@dataclass
class PairwiseBase(Algorithm):
    """What FeDXL1/2 and Local Pair share: sigmoid scores, class masks, (momentum) SGD, averaging."""

    problem: Problem
    positives_per_batch: int = 16  # B1; the engine adds batch_size − B1 negatives
    surrogate: str = "squared_hinge"
    margin: float = 1.0
    beta: float = 1.0  # m ← (1 − β) m + β G, w ← w − η m; β = 1 is plain SGD (no momentum state)
    momentum_init: str = "grad"  # "grad": m = G on the first step (authors' code); "zero": m starts at 0

    def check_hyperparameters(self) -> None:
        check_surrogate(self.surrogate)
        if self.momentum_init not in MOMENTUM_INITS:
            raise ValueError(f"momentum_init must be one of {MOMENTUM_INITS}, got {self.momentum_init!r}")
        if self.positives_per_batch < 1:
            raise ValueError(f"positives_per_batch must be ≥ 1, got {self.positives_per_batch}")
        if not 0.0 < self.beta <= 1.0:
            raise ValueError(
                f"beta (momentum weight of the new gradient) must lie in (0, 1], got {self.beta}"
            )
        if self.margin < 0:
            raise ValueError(f"margin must be ≥ 0, got {self.margin}")

    @property
    def momentum(self) -> bool:
        return self.beta < 1.0

    def _init_model(self) -> State:
        w, buffers = self.problem.init_model()
        state = {"w": w, "buffers": buffers, "loss": torch.zeros(())}
        if self.momentum:
            state["m"] = zeros_like(w)
            if self.momentum_init == "grad":
                state["m_first"] = torch.ones(())  # 1 until the first step has set m = G
        return state

    def _scores(self, w, buffers, x: torch.Tensor, train: bool = True):
        logits, new_buffers = self.problem.logits(w, buffers, x, train)
        return torch.sigmoid(logits), new_buffers

    def _masks(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """1 where a positive slot holds a positive / a negative slot holds a negative."""
        b1 = self.positives_per_batch
        return batch["y"][:b1], 1.0 - batch["y"][b1:]

    def _pairs(self, s_pos: torch.Tensor, s_neg: torch.Tensor) -> torch.Tensor:
        return pairwise_surrogate(s_pos, s_neg, self.surrogate, self.margin)

    def _descend(self, state: State, g, lr: float) -> dict[str, Any]:
        if not self.momentum:
            return {"w": tmap(lambda w, gi: w - lr * gi, state["w"], g)}
        out = {}
        beta = self.beta
        if "m_first" in state:  # the first step's weight is 1 (m = G), then β; no branch on data (vmap)
            beta = state["m_first"].clamp(min=self.beta)
            out["m_first"] = torch.zeros_like(state["m_first"])
        m = tmap(lambda mi, gi: (1 - beta) * mi + beta * gi, state["m"], g)
        return {"w": tmap(lambda w, mi: w - lr * mi, state["w"], m), "m": m, **out}

    def _average(self, state: State, comm: Collective) -> State:
        """Average the model (and momentum: every tensor of it, unlike the authors' code)."""
        payload = model_payload(state, self.problem)
        if self.momentum:
            payload["m"] = state["m"]
        avg = comm.mean(payload)
        out = with_model(state, avg)
        if self.momentum:
            out["m"] = avg["m"]
        return out

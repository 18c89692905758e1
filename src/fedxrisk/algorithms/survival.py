"""Survival X-risks across sites: the Cox partial likelihood and Harrell's C-index (issue 35).

Risk scores are the model's logits η (one per patient; higher = earlier failure).
Batches carry ``y`` = the event indicator and ``time`` (:mod:`fedxrisk.data.readers.survival`);
they are ordinary uniform batches of a client's patients (no class-aware layout):
the patients with an event are S1, every patient is in S2.

- :class:`FedAvgCox` — FLamby's Fed-TCGA-BRCA baseline: local momentum SGD on the Cox
  loss of the local batch (:func:`~fedxrisk.objectives.survival.cox_partial_likelihood`
  on the batch; its risk sets never leave the batch), FedAvg of w and m.
- :class:`FeDXL2Cox` — the Cox partial likelihood as the compositional X-risk of
  FeDXL (paper problem (1), Alg. 2) with f = log and
  ℓ(η_i, η_j) = 1[T_j ≥ T_i]·exp(η_j − η_i) (:mod:`fedxrisk.objectives.survival`),
  risk sets spanning every site through the passive pools. Local step, z = own
  batch, ζ_j = (η, T) drawn from H2 (everyone), ξ_k = (η, T, u) from H1 (events):

      u_i ← (1 − γ) u_i + γ mean_j ℓ(η_i, ζ_j)                          (own events i)
      G1 = mean_i mean_j ℓ(η_i, ζ_j)/u_i · ∇ log ℓ(η_i, ζ_j) = −mean_i mean_j w_ij ∇η_i
      G2 = mean_j mean_k ℓ(ξ_k, η_j)/ũ_k · ∇ log ℓ(ξ_k, η_j)  =  mean_j mean_k w_kj ∇η_j  (own patients j)
      m ← (1 − β) m + β (G1 + G2);  w ← w − η m

  With pools holding every patient's current score and u the exact inner means,
  G1 + G2 is the gradient of the pooled Cox loss (tests/test_survival_algorithms.py).
- :class:`FeDXL1CIndex` — FeDXL1 (linear f) on the smoothed concordance
  E_{i∈events} E_{j} 1[(i, j) comparable]·ℓ(η_i − η_j), ℓ a pairwise surrogate
  (logistic by default: logits are unbounded); comparable = i's event precedes
  T_j, or T_j = T_i with j censored (:mod:`fedxrisk.stats.concordance`).

Pools are FIFO over the last ``tau`` rounds as in FeDXL (:mod:`fedxrisk.algorithms.fedxl`):
each round the server pools every client's recorded (η, T[, E, log u]) — valid
entries only, shuffled — and every client appends them. Pools reveal other sites'
patients' scores and times (and event flags for the C-index): docs/privacy.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.func import grad, grad_and_value

from fedxrisk.algorithms.base import (
    Batch,
    ClientInfo,
    Collective,
    RoundContext,
    State,
    StepContext,
    register,
)
from fedxrisk.algorithms.fedavg import LocalSGDM
from fedxrisk.algorithms.fedxl import _draw
from fedxrisk.algorithms.pairwise_base import MOMENTUM_INITS, PairwiseBase, _masked_mean, log_u_in_order
from fedxrisk.objectives.pairwise import SURROGATES, check_surrogate
from fedxrisk.objectives.survival import cox_partial_likelihood

SURVIVAL_ALGORITHMS: dict[str, type] = {}


def survival_algorithm(cls: type) -> type:
    """Registers a survival algorithm in :data:`ALGORITHMS` (``task = "survival"``: a run refuses
    it on binary data and binary algorithms on survival data) and in :data:`SURVIVAL_ALGORITHMS`."""
    cls.task = "survival"
    SURVIVAL_ALGORITHMS[cls.name] = cls
    return register(cls)


@survival_algorithm
@dataclass
class FedAvgCox(LocalSGDM):
    """FedAvg with local momentum SGD on the local-batch Cox loss (FLamby's baseline)."""

    name = "fedavg_cox"
    monitor = "val_cindex"
    default_lr = 0.1
    couples_samples = "its Cox loss couples the patients of a batch through their risk sets"

    def _loss(self, w, buffers, batch: Batch):
        logits, new_buffers = self.problem.logits(w, buffers, batch["x"])
        return cox_partial_likelihood(logits, batch["time"], batch["y"]), new_buffers


@dataclass
class _SurvivalPools(PairwiseBase):
    """FeDXL's pools, momentum and averaging for survival: pools of (η, T, …) instead of scores."""

    couples_samples = "its X-risk couples every patient with other sites' patients (risk sets, pairs)"
    needs_both_classes = False  # a site without an event still gives its patients to the risk sets
    collectives = ("mean", "pool")
    positives_per_batch: int = 0  # uniform batches: events are found by ``y``
    tau: int = 2
    passive_samples: int = 16  # S
    EVENT_FIELDS = ("score", "time")
    ALL_FIELDS = ("score", "time")

    def check_hyperparameters(self) -> None:
        if self.positives_per_batch != 0:
            raise ValueError("survival X-risks draw uniform batches: positives_per_batch must be 0")
        if self.momentum_init not in MOMENTUM_INITS:
            raise ValueError(f"momentum_init must be one of {MOMENTUM_INITS}, got {self.momentum_init!r}")
        if not 0.0 < self.beta <= 1.0:
            raise ValueError(f"beta must lie in (0, 1], got {self.beta}")
        if self.tau < 1 or self.passive_samples < 1:
            raise ValueError(f"tau and passive_samples must be ≥ 1, got {self.tau}, {self.passive_samples}")

    def __post_init__(self) -> None:
        self.check_hyperparameters()
        self.uniforms_per_step = 2 * self.passive_samples  # first S for H1 (events), next S for H2 (all)

    @property
    def idle_fill(self) -> dict[str, float]:  # type: ignore[override]
        """A client sitting a round out records nothing: its record slots are empty (valid 0)."""
        pools = (("ev", self.EVENT_FIELDS), ("all", self.ALL_FIELDS))
        return {f"rec_{pool}_{f}": 0.0 for pool, fields in pools for f in (*fields, "valid")}

    def init(self, client: ClientInfo) -> State:
        state = self._init_model()
        for pool, fields in (("ev", self.EVENT_FIELDS), ("all", self.ALL_FIELDS)):
            for f in fields:
                state[f"rec_{pool}_{f}"] = torch.zeros(0)
                state[f"pool_{pool}_{f}"] = torch.zeros(0)
            state[f"rec_{pool}_valid"] = torch.zeros(0)
            state[f"count_{pool}"] = torch.zeros(self.tau, dtype=torch.long)
        return state

    def _logits(self, w, buffers, x: torch.Tensor, train: bool = True):
        return self.problem.logits(w, buffers, x, train)

    def _drawn(self, state: State, batch: Batch, pool: str, uniform: torch.Tensor) -> dict | None:
        i = _draw(state[f"pool_{pool}_score"], uniform)
        if i is None:
            return None
        fields = self.EVENT_FIELDS if pool == "ev" else self.ALL_FIELDS
        return {f: state[f"pool_{pool}_{f}"][i] for f in fields}

    def _record(self, state: State, values: dict[str, dict[str, torch.Tensor]], valid: dict) -> dict:
        out = {}
        for pool, fields in values.items():
            for f, v in fields.items():
                out[f"rec_{pool}_{f}"] = torch.cat([state[f"rec_{pool}_{f}"], v])
            out[f"rec_{pool}_valid"] = torch.cat([state[f"rec_{pool}_valid"], valid[pool]])
        return out

    def _step_records(self, state, batch, scores, extra_ev=None) -> dict:
        ev = batch["y"]
        values = {
            "ev": {"score": scores, "time": batch["time"], **(extra_ev or {})},
            "all": {"score": scores, "time": batch["time"], **self._all_extra(batch)},
        }
        return self._record(state, values, {"ev": ev, "all": torch.ones_like(ev)})

    def _all_extra(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {}

    # -- communication (FeDXL's merge, with several fields per pool) ----------
    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        return self._merge(self._average(state, comm), comm, key=ctx.plan.round + 1)

    def begin(self, state: State, comm: Collective, batch: Batch) -> State:
        return self._merge({**state, **comm.per_client(self._seed_records, state, batch)}, comm, key=0)

    def _seed_records(self, state: State, batch: Batch) -> dict:
        scores, _ = self._logits(state["w"], state["buffers"], batch["x"], train=False)
        return self._step_records(state, batch, scores, self._seed_extra(state, batch))

    def _seed_extra(self, state: State, batch: Batch) -> dict | None:
        return None

    def _merge(self, state: State, comm: Collective, key: int) -> State:
        groups, masks = {}, {}
        for pool, fields in (("ev", self.EVENT_FIELDS), ("all", self.ALL_FIELDS)):
            valid = state[f"rec_{pool}_valid"] > 0
            groups[f"{pool}_pool"] = {f: torch.where(valid, state[f"rec_{pool}_{f}"], 0.0) for f in fields}
            masks[f"{pool}_pool"] = valid.to(torch.uint8)
        got = comm.pool(groups, masks, key)
        out = dict(state)
        for pool, fields in (("ev", self.EVENT_FIELDS), ("all", self.ALL_FIELDS)):
            counts = state[f"count_{pool}"]
            drop = int(counts[0, 0])
            entries = got[f"{pool}_pool"]
            if not bool(torch.isfinite(entries["score"]).all()):
                raise ValueError(f"pooled {pool} scores contain NaN or inf")
            for f in fields:
                out[f"pool_{pool}_{f}"] = torch.cat([state[f"pool_{pool}_{f}"][:, drop:], entries[f]], 1)
                out[f"rec_{pool}_{f}"] = state[f"rec_{pool}_{f}"][:, :0]
            out[f"rec_{pool}_valid"] = state[f"rec_{pool}_valid"][:, :0]
            width = torch.full_like(counts[:, :1], entries["score"].shape[1])
            out[f"count_{pool}"] = torch.cat([counts[:, 1:], width], 1)
        return out


@survival_algorithm
@dataclass
class FeDXL2Cox(_SurvivalPools):
    """FeDXL2 on the Cox partial likelihood (f = log, ℓ = 1[T_j ≥ T_i]·exp(η_j − η_i)); module doc."""

    name = "fedxl2_cox"
    monitor = "val_cindex"
    communicates = ("w", "m", "pool_ev_score", "pool_ev_time", "pool_ev_log_u", "pool_all_score",
                    "pool_all_time", "count_ev", "count_all")  # fmt: skip
    default_lr = 0.1
    EVENT_FIELDS = ("score", "time", "log_u")

    beta: float = 0.1
    gamma: float = 0.1  # moving-average rate of u

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma (u's moving-average rate) must lie in (0, 1], got {self.gamma}")

    def init(self, client: ClientInfo) -> State:
        state = super().init(client)
        state["log_u"] = torch.zeros(max(client.max_samples, client.num_samples))
        return state

    def _seed_extra(self, state: State, batch: Batch) -> dict:
        return {"log_u": state["log_u"][batch["local_index"]]}

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        s, cap = self.passive_samples, math.log(self.passive_samples / self.gamma)
        ev, t, idx = batch["y"], batch["time"], batch["local_index"]
        zeta = self._drawn(state, batch, "all", batch["uniform"][s:])
        xi = self._drawn(state, batch, "ev", batch["uniform"][:s])
        log_u_old = state["log_u"][idx]

        def surrogate(w):
            eta, buffers = self._logits(w, state["buffers"], batch["x"])
            log_u_new, g1, g2 = log_u_old, eta.new_zeros(()), eta.new_zeros(())
            if zeta is not None:  # active: own events i against the passive population ζ
                at_risk = zeta["time"][None, :] >= t[:, None]  # [B, S]
                diff = zeta["score"][None, :] - eta[:, None]  # log ℓ where at risk
                z = diff.detach().masked_fill(~at_risk, -math.inf)
                log_inner = torch.logsumexp(z, 1) - math.log(z.shape[1])
                log_u_new = log_u_in_order(log_u_old, log_inner, idx, ev, self.gamma)
                weights = torch.exp(z - log_u_new[:, None])  # 0 where not at risk
                g1 = _masked_mean((weights * diff).mean(1), ev)
            if xi is not None:  # passive: own patients j against the passive events ξ (with ũ)
                at_risk = t[None, :] >= xi["time"][:, None]  # [S, B]
                diff = eta[None, :] - xi["score"][:, None]
                z = (diff.detach() - xi["log_u"][:, None]).clamp(max=cap)
                weights = torch.exp(z).masked_fill(~at_risk, 0.0)
                g2 = (weights * diff).mean(0).mean()
            value = _masked_mean(log_u_new, ev)  # estimate of E_i log g_i (= Cox loss − log n)
            return g1 + g2, (value, eta, log_u_new, buffers)

        g, (value, eta, log_u_new, buffers) = grad(surrogate, has_aux=True)(state["w"])
        rec = self._step_records(state, batch, eta.detach(), {"log_u": log_u_new})
        return dict(
            state, **self._descend(state, g, ctx.lr), **rec, buffers=buffers, loss=value.detach(),
            log_u=state["log_u"].scatter(0, idx, torch.where(ev > 0, log_u_new, log_u_old)),
        )  # fmt: skip


@survival_algorithm
@dataclass
class FeDXL1CIndex(_SurvivalPools):
    """FeDXL1 on the smoothed C-index: pairwise surrogate over comparable pairs across sites."""

    name = "fedxl1_cindex"
    monitor = "val_cindex"
    communicates = ("w", "pool_ev_score", "pool_ev_time", "pool_all_score", "pool_all_time",
                    "pool_all_event", "count_ev", "count_all")  # fmt: skip
    default_lr = 1.0
    ALL_FIELDS = ("score", "time", "event")

    surrogate: str = "logistic"

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        check_surrogate(self.surrogate)

    def _all_extra(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {"event": batch["y"]}

    def _pair_loss(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """ℓ(η_first − η_second) for every pair: ``[len(first), len(second)]``."""
        return SURROGATES[self.surrogate].fn(first[:, None] - second[None, :], self.margin)

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        s = self.passive_samples
        ev, t = batch["y"], batch["time"]
        zeta = self._drawn(state, batch, "all", batch["uniform"][s:])
        xi = self._drawn(state, batch, "ev", batch["uniform"][:s])

        def surrogate(w):
            eta, buffers = self._logits(w, state["buffers"], batch["x"])
            act, pas = eta.new_zeros(()), eta.new_zeros(())
            if zeta is not None:  # own events i before passive patients ζ_j
                later = zeta["time"][None, :] > t[:, None]
                tie = (zeta["time"][None, :] == t[:, None]) & (zeta["event"][None, :] == 0)
                comparable = (later | tie).to(eta.dtype)
                act = _masked_mean((self._pair_loss(eta, zeta["score"]) * comparable).mean(1), ev)
            if xi is not None:  # passive events ξ_k before own patients j
                later = t[None, :] > xi["time"][:, None]
                tie = (t[None, :] == xi["time"][:, None]) & (ev[None, :] == 0)
                comparable = (later | tie).to(eta.dtype)
                pas = (self._pair_loss(xi["score"], eta) * comparable).mean(0).mean()
            return act + pas, (eta, buffers)

        g, (value, (eta, buffers)) = grad_and_value(surrogate, has_aux=True)(state["w"])
        rec = self._step_records(state, batch, eta.detach())
        return dict(state, **self._descend(state, g, ctx.lr), **rec, buffers=buffers, loss=value.detach())

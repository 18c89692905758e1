"""FeDXL: federated X-risk optimization with active and passive parts (ALGORITHMS.md §2.7).

The objective (FeDXL paper, problem (1)), S1 = positives and S2 = negatives
spread over K clients, h(w; z) = sigmoid(logit) ∈ [0, 1]:

    min_w  E_{z ∈ S1} f( E_{z' ∈ S2} ℓ(h(w; z), h(w; z')) )

- FeDXL1: f linear (pairwise AUROC, :func:`~fedxrisk.objectives.pairwise.pairwise_auc_loss`);
- FeDXL2: f(u) = λ log u and ℓ ← exp(ℓ/λ) (one-way pAUC, KL-DRO, :func:`pauc_kl_loss`).

No client holds the pairs it needs. The gradient is split into **active**
parts (h and ∇h of the client's own current samples under its current model)
and **passive** parts (scores of other clients' samples, and for FeDXL2 their
inner estimates u, computed with historical models). Every round each client
records the scores of the samples it used (and u); at the round's end the server
pools them (``comm.pool``: valid entries only, shuffled, so no score is attributable
to its client) and every client merges them into FIFO **pools** H1 (positives, with u)
and H2 (negatives) holding the last ``tau`` rounds of all clients; local steps
sample pools uniformly with replacement from ``batch["uniform"]``.

Design decisions (documented in docs/fedxl.md):

- Batches: ``positives_per_batch`` = B1 makes the engine draw B1 positives then
  B2 = batch_size − B1 negatives per client (class-aware sampler, LibAUC's
  DualSampler layout; rare classes are cycled). A client lacking a class gets
  those slots filled from the other class; every term is masked by ``y``, so
  such a client contributes only the active part of the class it holds (and
  still learns from the other clients' pooled scores), and records nothing for
  the missing class. Local Pair gets no gradient at all on such a client.
- Pools are flat tensors of valid scores; ``count_*`` holds how many entries
  each of the last ``tau`` rounds contributed (oldest first), so the FIFO drops
  exactly the oldest round. Pool size ≤ tau · K · I · B (B1 or B2). Pools are
  identical on all clients (they are built from the same server answer). A slot
  not of its pool's class is masked; the mask goes to the server only.
- Pools are seeded before the first round (:meth:`FeDXL1.begin`) with one batch
  of scores per client under the initial model; the seed is the first FIFO round.
- Pools are seeded in eval mode (BatchNorm uses its running statistics), as the
  authors score their seed batch; local steps score in train mode.
- Per-positive u (FeDXL2) is kept as log u (``log_u``: exp(ℓ/λ) overflows float32
  for small λ, e.g. λ = 0.01 and ℓ = 4), a per-client table of length ``max_samples``
  (the largest shard, so all clients have equal shapes under vmap), indexed by
  ``batch["local_index"]``, initialised to u = 1 (the authors' code), never averaged.
  A positive drawn d times in one batch is d observations: its u takes the d
  moving-average updates in slot order (:func:`log_u_in_order`).
- Scores are recorded with the model that computed the step's gradient
  (before its update); u is recorded after the step's update.
- Momentum (``beta < 1``) starts at m = G on the first step (``momentum_init = "grad"``,
  the authors' code), or from m = 0 (``"zero"``, the textbook EMA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.func import grad

from fedxrisk.algorithms.base import Batch, ClientInfo, Collective, RoundContext, State, StepContext, register
from fedxrisk.algorithms.pairwise_base import GRAD_SCALES, PairwiseBase, _masked_mean, log_u_in_order
from fedxrisk.objectives.pairwise import BOUNDED, check_lambda, check_scores

INVALID = -1.0  # marks a recorded slot whose sample is not of the slot's class (never pooled)
SCORE_KEYS = ("pos_pool", "neg_pool")  # what ``comm.pool`` sends (ledger names)


def _draw(pool: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor | None:
    """Positions of a uniform draw with replacement from a pool; None for an empty pool."""
    size = pool.shape[-1]
    if size == 0:
        return None
    return (uniform * size).long().clamp(max=size - 1)


@register
@dataclass
class FeDXL1(PairwiseBase):
    """FeDXL1 (linear f): pairwise AUROC with active local scores and passive pooled scores.

    Local step (§2.7; paper Alg. 1): B1 local positives z_i, B2 local negatives
    z'_j, S passive negatives ζ from H2 and S passive positives ξ from H1:

        G = mean_i mean_ζ ∂1ℓ(h(w;z_i), ζ) ∇h(w;z_i) + mean_j mean_ξ ∂2ℓ(ξ, h(w;z'_j)) ∇h(w;z'_j)
        w ← w − η G    (β < 1 adds momentum, not in the paper's FeDXL1)

    Every I steps: average w; pool the recorded scores into H1/H2 (server-side, shuffled).
    """

    name = "fedxl1"
    idle_fill = {"rec_pos": INVALID, "rec_neg": INVALID, "rec_log_u": 0.0}  # absent: nothing recorded
    couples_samples = "its pairwise loss couples positives and negatives of all clients"
    communicates = ("w", "m", "pool_pos", "pool_neg", "count_pos", "count_neg")  # m only if beta < 1
    collectives = ("mean", "pool")
    begin_batch = True
    default_lr = 1.0  # sigmoid scores make the pairwise gradients small

    tau: int = 2  # rounds kept in the pools
    passive_samples: int = 16  # S: scores drawn from each pool per step

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        if self.tau < 1:
            raise ValueError(f"tau (rounds kept in the score pools) must be ≥ 1, got {self.tau}")
        if self.passive_samples < 1:
            raise ValueError(f"passive_samples must be ≥ 1, got {self.passive_samples}")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.uniforms_per_step = 2 * self.passive_samples  # first S for H1, next S for H2

    # -- state ---------------------------------------------------------------
    def init(self, client: ClientInfo) -> State:
        state = self._init_model()
        for cls in ("pos", "neg"):
            state[f"rec_{cls}"] = torch.zeros(0)  # this round's recorded scores
            state[f"pool_{cls}"] = torch.zeros(0)  # the merged pool (identical on all clients)
            state[f"count_{cls}"] = torch.zeros(self.tau, dtype=torch.long)  # entries per pooled round
        return state

    def _passive(self, state: State, batch: Batch):
        """Passive positives ξ (positions into H1) and negatives ζ (scores from H2)."""
        s = self.passive_samples
        i_pos = _draw(state["pool_pos"], batch["uniform"][:s])
        i_neg = _draw(state["pool_neg"], batch["uniform"][s:])
        zeta = None if i_neg is None else state["pool_neg"][i_neg]
        return i_pos, zeta

    def _record(self, state: State, s_pos, s_neg, vpos, vneg) -> dict[str, torch.Tensor]:
        return {
            "rec_pos": torch.cat([state["rec_pos"], torch.where(vpos > 0, s_pos, INVALID)]),
            "rec_neg": torch.cat([state["rec_neg"], torch.where(vneg > 0, s_neg, INVALID)]),
        }

    # -- local step -----------------------------------------------------------
    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        b1 = self.positives_per_batch
        vpos, vneg = self._masks(batch)
        i_pos, zeta = self._passive(state, batch)
        xi = None if i_pos is None else state["pool_pos"][i_pos]

        def surrogate(w):
            scores, buffers = self._scores(w, state["buffers"], batch["x"])
            s_pos, s_neg = scores[:b1], scores[b1:]
            zero = scores.new_zeros(len(s_pos))
            act_pos = zero if zeta is None else self._pairs(s_pos, zeta).mean(1)  # active z vs passive ζ
            act_neg = s_neg.new_zeros(len(s_neg)) if xi is None else self._pairs(xi, s_neg).mean(0)
            value = ((act_pos * vpos).sum() + (act_neg * vneg).sum()) / (vpos.sum() + vneg.sum()).clamp_min(1)
            g_obj = _masked_mean(act_pos, vpos) + _masked_mean(act_neg, vneg)
            return g_obj, (value, s_pos, s_neg, buffers)

        g, (value, s_pos, s_neg, buffers) = grad(surrogate, has_aux=True)(state["w"])
        return dict(
            state, **self._descend(state, g, ctx.lr), **self._record(state, s_pos, s_neg, vpos, vneg),
            buffers=buffers, loss=value.detach(),
        )  # fmt: skip

    # -- communication --------------------------------------------------------
    def communicate(self, state: State, comm: Collective, ctx: RoundContext) -> State:
        """Average w (and m); pool this round's scores on the server and merge them into the pools."""
        return self._merge(self._average(state, comm), comm, key=ctx.plan.round + 1)

    def begin(self, state: State, comm: Collective, batch: Batch) -> State:
        """Seed the pools with one batch of scores per client under the initial model."""
        return self._merge({**state, **comm.per_client(self._seed_records, state, batch)}, comm, key=0)

    def _seed_records(self, state: State, batch: Batch) -> dict[str, torch.Tensor]:
        # eval mode (BatchNorm's running statistics), as the authors score their seed batch
        scores, _ = self._scores(state["w"], state["buffers"], batch["x"], train=False)
        vpos, vneg = self._masks(batch)
        b1 = self.positives_per_batch
        return self._record(state, scores[:b1], scores[b1:], vpos, vneg)

    def _records(self, state: State) -> dict[str, dict[str, torch.Tensor]]:
        """What goes up, per pool: the recorded values (0 in slots not of the pool's class)."""
        out = {}
        for cls in ("pos", "neg"):
            valid = state[f"rec_{cls}"] != INVALID
            out[f"{cls}_pool"] = {"scores": torch.where(valid, state[f"rec_{cls}"], 0.0)}
        if "rec_log_u" in state:
            out["pos_pool"]["log_u"] = torch.where(state["rec_pos"] != INVALID, state["rec_log_u"], 0.0)
        return out

    def _merge(self, state: State, comm: Collective, key: int) -> State:
        """One server-side pool of every client's records (valid entries only, shuffled, so no entry
        is attributable to its client); FIFO-append them, dropping the oldest round."""
        masks = {f"{cls}_pool": (state[f"rec_{cls}"] != INVALID).to(torch.uint8) for cls in ("pos", "neg")}
        got = comm.pool(self._records(state), masks, key)  # leaves [Kc, N]
        out = dict(state)
        for cls in ("pos", "neg"):
            entries = got[f"{cls}_pool"]["scores"]
            check_scores(entries, BOUNDED, f"pooled {cls} scores")
            counts = state[f"count_{cls}"]
            drop = int(counts[0, 0])
            out[f"pool_{cls}"] = torch.cat([state[f"pool_{cls}"][:, drop:], entries], 1)
            if cls == "pos" and "log_u" in got["pos_pool"]:
                out["pool_log_u"] = torch.cat([state["pool_log_u"][:, drop:], got["pos_pool"]["log_u"]], 1)
            new_count = torch.full_like(counts[:, :1], entries.shape[1])
            out[f"count_{cls}"] = torch.cat([counts[:, 1:], new_count], 1)
            out[f"rec_{cls}"] = state[f"rec_{cls}"][:, :0]
        if "rec_log_u" in state:
            out["rec_log_u"] = state["rec_log_u"][:, :0]
        return out


@register
@dataclass
class FeDXL2(FeDXL1):
    """FeDXL2 (nonlinear f = λ log): one-way pAUC in KL-DRO form with per-positive u and momentum.

    Local step (§2.7; paper Alg. 2), ℓ_ij = ℓ(h(w;z_i), ζ_j) with ζ_j from H2:

        u_i ← (1 − γ) u_i + γ mean_j exp(ℓ_ij / λ)                        (own positives)
        G1 = mean_i mean_j exp(ℓ_ij/λ) / u_i · ∂1ℓ_ij ∇h(w;z_i)           (active)
        G2 = mean_j mean_k exp(ℓ(ξ_k, h(w;z'_j))/λ) / ũ_k · ∂2ℓ ∇h(w;z'_j)  (passive ξ_k, ũ_k from H1)
        m ← (1 − β) m + β (G1 + G2);  w ← w − η m

    Every I steps: average w and m; pool the positives' scores and u and the
    negatives' scores into the pools. u is never averaged. With u equal to the
    true inner mean, G1 + G2 is the gradient of the KL-DRO objective
    F = mean_i λ log mean_j exp(ℓ_ij/λ) (``grad_scale = "objective"``, default);
    the authors' code drops the factor λ of f(u) = λ log u and so descends ∇F / λ
    (``grad_scale = "code"``; the same at their λ = 1; at λ ≠ 1 it equals
    "objective" with the learning rate divided by λ).

    Small λ: u is kept as log u and every weight exp(ℓ/λ)/u is formed as
    exp(ℓ/λ − log u), so nothing overflows. Active weights are ≤ S/γ per copy by
    construction (u is updated before use); a passive ũ_k is historical and may
    underestimate exp(ℓ/λ) by far when λ is small, so passive weights are capped
    at the same S/γ (S = ``passive_samples``). With ℓ ≤ 4 (squared hinge on
    sigmoid scores) the cap never binds at λ = 1: e⁴ ≈ 55 < S/γ.
    """

    name = "fedxl2"
    monitor = "val_pauc30_norm"  # the one-way pAUC objective
    communicates = ("w", "m", "pool_pos", "pool_neg", "pool_log_u", "count_pos", "count_neg")
    default_lr = 1.5  # the median of the rates selected on validation in docs/evidence.md (0.5–5)

    beta: float = 0.1
    lam: float = 1.0  # λ (code: 1)
    gamma: float = 0.1  # moving-average rate of u (code: 0.1)
    grad_scale: str = "objective"  # "objective": ∇F; "code": the authors' ∇F / λ

    def check_hyperparameters(self) -> None:
        super().check_hyperparameters()
        check_lambda(self.lam)
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma (u's moving-average rate) must lie in (0, 1], got {self.gamma}")
        if self.grad_scale not in GRAD_SCALES:
            raise ValueError(f"grad_scale must be one of {GRAD_SCALES}, got {self.grad_scale!r}")

    def init(self, client: ClientInfo) -> State:
        state = super().init(client)
        size = max(client.max_samples, client.num_samples)
        state.update(log_u=torch.zeros(size), rec_log_u=torch.zeros(0), pool_log_u=torch.zeros(0))
        return state

    def _seed_records(self, state: State, batch: Batch) -> dict[str, torch.Tensor]:
        rec = super()._seed_records(state, batch)
        seed_u = state["log_u"][batch["local_index"][: self.positives_per_batch]]
        rec["rec_log_u"] = torch.cat([state["rec_log_u"], seed_u])
        return rec

    def local_step(self, state: State, batch: Batch, ctx: StepContext) -> State:
        b1, lam = self.positives_per_batch, self.lam
        scale = lam if self.grad_scale == "objective" else 1.0
        cap = math.log(self.passive_samples / self.gamma)
        vpos, vneg = self._masks(batch)
        i_pos, zeta = self._passive(state, batch)
        idx = batch["local_index"][:b1]
        log_u_old = state["log_u"][idx]

        def surrogate(w):
            # value whose gradient is Σ weight · ∇(ℓ/λ) with detached weights exp(ℓ/λ − log u)
            scores, buffers = self._scores(w, state["buffers"], batch["x"])
            s_pos, s_neg = scores[:b1], scores[b1:]
            if zeta is None:
                log_u_new, g1 = log_u_old, scores.new_zeros(())
            else:
                z = self._pairs(s_pos, zeta) / lam  # [B1, S] = log exp(ℓ/λ)
                log_inner = torch.logsumexp(z.detach(), 1) - math.log(z.shape[1])
                log_u_new = log_u_in_order(log_u_old, log_inner, idx, vpos, self.gamma)
                weights = torch.exp(z.detach() - log_u_new[:, None])
                g1 = _masked_mean(scale * (weights * z).mean(1), vpos)
            if i_pos is None:
                g2 = scores.new_zeros(())
            else:
                xi, xi_log_u = state["pool_pos"][i_pos], state["pool_log_u"][i_pos]
                z = self._pairs(xi, s_neg) / lam  # [S, B2]
                weights = torch.exp((z.detach() - xi_log_u[:, None]).clamp(max=cap))
                g2 = _masked_mean(scale * (weights * z).mean(0), vneg)
            value = _masked_mean(lam * log_u_new, vpos)  # estimate of F from the u's
            return g1 + g2, (value, s_pos, s_neg, log_u_new, buffers)

        g, (value, s_pos, s_neg, log_u_new, buffers) = grad(surrogate, has_aux=True)(state["w"])
        rec = self._record(state, s_pos, s_neg, vpos, vneg)
        return dict(
            state, **self._descend(state, g, ctx.lr), **rec, buffers=buffers, loss=value.detach(),
            log_u=state["log_u"].scatter(0, idx, log_u_new),  # copies of a sample carry the same value
            rec_log_u=torch.cat([state["rec_log_u"], log_u_new]),
        )  # fmt: skip

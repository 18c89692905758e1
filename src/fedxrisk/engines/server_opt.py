"""Server optimizers on the round's mean of w: FedAvgM, FedAdam, FedYogi, FedAdagrad.

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2. The server treats the
pseudo-gradient g = x − mean_k(w_k) (x: the model every client started the round from; Reddi's
Δ = −g) as a gradient and steps x with an optimizer:

- ``sgd`` (server momentum, FedAvgM): m ← β₁m + g,  x ← x − η·m  (η = 1, β₁ = 0: FedAvg);
- ``adam``: m ← β₁m + (1 − β₁)g,  v ← β₂v + (1 − β₂)g²;
- ``yogi``: m as Adam,  v ← v − (1 − β₂)·g²·sign(v − g²);
- ``adagrad``: m as Adam,  v ← v + g²;

then x ← x − η·m̂/(√v̂ + τ), with Adam's bias correction m̂ = m/(1 − β₁ᵗ), v̂ = v/(1 − β₂ᵗ) for
``adam`` and ``yogi`` (``bias_correction``: FedAdam with one client is then ``torch.optim.Adam``
on g, eps = τ; off: Reddi's Algorithm 2 as printed) and none for ``adagrad`` (β₁ = 0: exactly
``torch.optim.Adagrad``).

:func:`with_server_optimizer` wraps an algorithm whose round averages w: its ``communicate``
sees a collective whose ``mean`` returns the optimizer's x instead of the plain mean of w
(everything else in the payload — a, b, α, momenta, control variates, stage averages — keeps the
paper's rule). The optimizer's state (x, m, v, t) lives in every client's state under
``server_opt``, identical on all clients like any averaged entry, so the loop, vmap and
distributed engines and a Flower site replaying ``communicate`` run it unchanged, checkpoints
hold it, and under client-level DP it acts on the privatized mean (the engine hands the
algorithm the private collective, which this one wraps). x is the client's w after the previous
round's ``communicate``, so CODASCA's η_g step is the next round's x. At the end of a stage of an
algorithm that restarts w there (``Algorithm.stage_restart``: the CODA family's restart from the
stage's average iterate), the step acts on the restart point instead of the round's mean (which the
restart discards): x ← step(x, restart point), so the server step survives every stage end.

Personal entries (``Problem.local_names``: FedPer's head, FedBN's BatchNorm layers) never pass
through the server step: the step and its state (x, m, v) cover the shared entries of w only, and
a personal entry leaves ``communicate`` as the site's own local result (at a CODA-family stage end:
the site's own restart point), exactly as without ``[server]``. A personal entry is no server
model, so it has no pseudo-gradient to step (and the distributed engine, which tracks the sites'
mean of personal entries before ``communicate``, then equals the loop engine's global model).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from fedxrisk.algorithms.personal import merge_personal, split_personal
from fedxrisk.engines.server_rules import DEFAULT_LR, OPTIMIZERS, value_error, wrap_reason
from fedxrisk.tree import Tree, tmap

KEY = "server_opt"
__all__ = [
    "DEFAULT_LR",
    "KEY",
    "OPTIMIZERS",
    "ServerOptimizer",
    "server_optimizer_reason",
    "with_server_optimizer",
]


@dataclass(frozen=True)
class ServerOptimizer:
    """``optimizer`` in :data:`OPTIMIZERS`, server step η (``lr``; None: :data:`DEFAULT_LR`), β₁, β₂, τ."""

    optimizer: str = "adam"
    lr: float | None = None
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    bias_correction: bool = True

    def __post_init__(self) -> None:
        for key in ("optimizer", "lr", "beta1", "beta2", "tau"):  # the run's checks call the same rule
            reason = value_error(key, getattr(self, key))
            if reason is not None:
                raise ValueError(reason)

    @property
    def step_size(self) -> float:
        return DEFAULT_LR[self.optimizer] if self.lr is None else self.lr

    def init_state(self, w: Tree) -> dict[str, Any]:
        """x = the starting model, m = v = 0, t = 0 (rounds taken)."""
        return {"x": tmap(torch.clone, w), "m": tmap(torch.zeros_like, w), "v": tmap(torch.zeros_like, w),
                "t": torch.zeros(())}  # fmt: skip

    def step(self, state: dict[str, Any], mean_w: Tree) -> tuple[Tree, dict[str, Any]]:
        """One server step from the mean of w: (the new x, the new optimizer state). Works on
        stacked trees (a leading client axis, ``t`` of shape ``[K]``) as on a single one."""
        t = state["t"] + 1
        b1, b2, eta, tau = self.beta1, self.beta2, self.step_size, self.tau
        g = tmap(lambda x, w: x - w, state["x"], mean_w)
        if self.optimizer == "sgd":
            m = tmap(lambda m, g: b1 * m + g, state["m"], g)
            x = tmap(lambda x, m: x - eta * m, state["x"], m)
            return x, {"x": x, "m": m, "v": state["v"], "t": t}
        m = tmap(lambda m, g: b1 * m + (1 - b1) * g, state["m"], g)
        if self.optimizer == "adam":
            v = tmap(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], g)
        elif self.optimizer == "yogi":
            v = tmap(lambda v, g: v - (1 - b2) * g * g * torch.sign(v - g * g), state["v"], g)
        else:
            v = tmap(lambda v, g: v + g * g, state["v"], g)
        corrected = self.bias_correction and self.optimizer != "adagrad"
        c1 = 1 - b1**t if corrected else torch.ones_like(t)
        c2 = 1 - b2**t if corrected else torch.ones_like(t)

        def update(x: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k1, k2 = _expand(c1, x), _expand(c2, x)
            return x - eta * (m / k1) / ((v / k2).sqrt() + tau)

        x = tmap(update, state["x"], m, v)
        return x, {"x": x, "m": m, "v": v, "t": t}


def _expand(count: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return count.reshape(count.shape + (1,) * (like.dim() - count.dim()))


def shared_step(
    optimizer: ServerOptimizer, state: dict[str, Any], w: Tree, personal: frozenset[str]
) -> tuple[Tree, dict[str, Any]]:
    """:meth:`ServerOptimizer.step` on the shared entries of ``w``; its ``personal`` entries as given."""
    x, new = optimizer.step(state, split_personal(w, personal))
    return merge_personal(w, x, personal), new


class ServerStepCollective:
    """The round's collective with the optimizer on the first ``mean`` that carries ``w`` (its
    shared entries: ``personal`` entries come back from the site's collective untouched)."""

    def __init__(
        self,
        comm: Any,
        optimizer: ServerOptimizer,
        state: dict[str, Any],
        personal: frozenset[str] = frozenset(),
    ):
        self.comm, self.optimizer, self.state, self.personal = comm, optimizer, state, personal

    def mean(self, tree: Tree) -> Tree:
        avg = self.comm.mean(tree)
        if isinstance(avg, dict) and "w" in avg and self.state is not None and not self.state.get("done"):
            w, self.state = shared_step(self.optimizer, self.state, avg["w"], self.personal)
            self.state["done"] = True
            avg = dict(avg, w=w)
        return avg

    def __getattr__(self, name: str) -> Any:  # gather, pool, per_client, and engine extras
        return getattr(self.comm, name)


def server_optimizer_reason(algorithm: Any) -> str | None:
    """Why a server optimizer cannot wrap ``algorithm`` (its round does not average w), or None."""
    return wrap_reason(getattr(algorithm, "name", algorithm), getattr(algorithm, "communicates", ()))


def with_server_optimizer(algorithm: Any, optimizer: ServerOptimizer) -> Any:
    """A copy of ``algorithm`` whose rounds apply ``optimizer`` to the mean of w (module docstring)."""
    reason = server_optimizer_reason(algorithm)
    if reason is not None:
        raise ValueError(f"[server] optimizer: {reason}")
    wrapped = copy.copy(algorithm)
    init, communicate = algorithm.init, algorithm.communicate
    personal = frozenset(getattr(getattr(algorithm, "problem", None), "local_names", ()))

    def shared_x(w: Tree) -> Tree:  # x: where the next round starts (shared entries only)
        return tmap(torch.clone, split_personal(w, personal))

    def init_with_server(client: Any) -> dict[str, Any]:
        state = init(client)
        return {**state, KEY: optimizer.init_state(split_personal(state["w"], personal))}

    restarts = type(algorithm).stage_restart(vars(algorithm)) is not None

    def communicate_with_server(state: dict[str, Any], comm: Any, ctx: Any) -> dict[str, Any]:
        inner = {k: v for k, v in state.items() if k != KEY}
        if restarts and ctx.stage_end:  # the step acts on the restart point, not the discarded mean
            out = communicate(inner, comm, ctx)
            w, new = shared_step(optimizer, dict(state[KEY]), out["w"], personal)
            return {**out, "w": w, KEY: dict(new, x=shared_x(w))}
        server = ServerStepCollective(comm, optimizer, dict(state[KEY]), personal)
        out = communicate(inner, server, ctx)
        new = {k: v for k, v in server.state.items() if k != "done"}
        return {**out, KEY: dict(new, x=shared_x(out["w"]))}

    wrapped.init, wrapped.communicate = init_with_server, communicate_with_server
    wrapped.communicates = (*algorithm.communicates, KEY)
    wrapped.server_optimizer = optimizer
    return wrapped

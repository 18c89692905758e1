"""Client-level DP (DP-FedAvg) around a round's collective: clip each client's update, add noise.

:class:`PrivateCollective` wraps the collective :meth:`Simulation._collective` makes, so no
algorithm file changes. For ``mean(tree)`` it

1. forms each participating client's *update*: every leaf minus its reference, the value the
   server last returned for that leaf (first use: the initial state every client starts from,
   else zero; a stage average ``stage_average.X`` is compared with the last answer for ``X``);
2. clips the updates of all leaves of the call *jointly* to L2 norm ``clip`` per client;
3. sums them, adds N(0, (σ·clip)²) to every coordinate of the sum, divides by the number of
   participants m (Poisson sampling: the expected number q·K), adds the reference back —
   the noise std on the mean is σ·clip/m; the noise comes from the run's
   :class:`~fedxrisk.engines.privacy.noise.NoiseSource` (secret by default; every engine and rank
   draws round r's noise from its sub-stream r, so in the reproducible test mode engines agree);
4. projects the answer to the variables' domains (post-processing, free in privacy):
   AUCM's α to the algorithm's own ``project_alpha`` (or α ≥ 0), BatchNorm running
   variances to ≥ 0; and returns the same answer to every client, sampled or not.

One ``mean`` per round is covered (what every supported algorithm does: model, momentum,
a, b, α, control variates, h/u/v estimators and stage averages travel together).
``gather``, ``pool`` and a second ``mean`` in a round raise :class:`ConfigError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.engines.privacy.sampling import ClientSampling
from fedxrisk.errors import ConfigError
from fedxrisk.tree import Tree, leaves

NOISE_STREAM = 0x4E4F4953
ALIASES = {"stage_average.": ""}  # a stage average is an iterate of the same variables


@dataclass(frozen=True)
class ClientDP:
    """Client-level DP settings: L2 clipping norm C of a client's joint round update, noise
    multiplier σ (noise std on the sum / C), client sampling, and ``noise_seed``: None (the
    default) draws the noise and the sampled sets from a fresh secret
    (:meth:`NoiseSource.secret`); an integer is the reproducible test mode — not private."""

    clip: float
    noise_multiplier: float
    sampling: ClientSampling = field(default_factory=ClientSampling)
    noise_seed: int | None = None

    def __post_init__(self) -> None:
        if not self.clip > 0 or math.isinf(self.clip):
            raise ConfigError(
                f"privacy clip (the L2 norm C of a client's update) must be > 0, got {self.clip}"
            )
        if not self.noise_multiplier >= 0 or math.isinf(self.noise_multiplier):
            raise ConfigError(
                f"privacy noise_multiplier must be a finite number ≥ 0, got {self.noise_multiplier}"
            )


def unsupported_reason(algorithm: Any) -> str | None:
    """Why client-level DP cannot cover ``algorithm``'s messages, or None when it can."""
    name = getattr(algorithm, "name", type(algorithm).__name__)
    collectives = getattr(algorithm, "collectives", ("mean",))
    if "pool" in collectives:
        return f"{name} sends per-sample score pools (collective 'pool'), which DP on the model update does not cover"
    if "gather" in collectives:
        return f"{name} gathers every client's values (collective 'gather'), which DP on the model update does not cover"
    if getattr(algorithm, "stage_batch_size", 0) or getattr(algorithm, "round_batch_size", 0):
        return (
            f"{name} sends per-client class sums and counts of a sampled batch (a second 'mean' per round), "
            "which client-level DP does not cover"
        )
    problem = getattr(algorithm, "problem", None)
    if problem is not None and problem.buffer_policy == "local":
        params, buffers = problem.init_model()
        if any(v.is_floating_point() for v in buffers.values()):
            return (
                f"{name} with buffer_policy 'local': the evaluated model averages the clients' BatchNorm "
                "statistics without noise; use buffer_policy 'average' (they are then clipped and noised)"
            )
    return None


def check_client_dp(algorithm: Any) -> None:
    """Raise :class:`ConfigError` (one line) when client-level DP cannot cover ``algorithm``."""
    reason = unsupported_reason(algorithm)
    if reason is not None:
        raise ConfigError(f"client-level DP: {reason}")


def default_projection(algorithm: Any) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """Leaf path, noised answer → the answer in its domain (α of AUCM ≥ 0; running variances ≥ 0)."""
    loss = getattr(algorithm, "loss", None)
    project_alpha = getattr(algorithm, "project_alpha", None)

    def project(path: str, value: torch.Tensor) -> torch.Tensor:
        last = path.rsplit(".", 1)[-1]
        if last == "alpha" and loss == "aucm":
            return project_alpha(value) if project_alpha is not None else value.clamp_min(0.0)
        if last.endswith("running_var"):
            return value.clamp_min(0.0)
        return value

    return project


class PrivateAggregator:
    """The server's side of client-level DP across rounds: the last answer per leaf (the
    references of the next updates) and the noise. One per run; engines build a
    :class:`PrivateCollective` from it every round."""

    def __init__(self, config: ClientDP, algorithm: Any, initial: Tree, seed: int, num_clients: int):
        """``initial``: one client's initial state (what every client starts from). ``seed``, the
        run seed, is not used for the noise: nothing in a run's files regenerates it."""
        check_client_dp(algorithm)
        self.config, self.num_clients = config, num_clients
        self.name = getattr(algorithm, "name", type(algorithm).__name__)
        self.source = (
            NoiseSource.secret() if config.noise_seed is None else NoiseSource.reproducible(config.noise_seed)
        )
        self.initial = {p: t.detach().clone() for p, t in leaves(initial)}
        self.last: dict[str, torch.Tensor] = {}
        self.project = default_projection(algorithm)
        self.norms: torch.Tensor | None = None  # the last round's update norms before clipping

    def reference(self, path: str, like: torch.Tensor) -> torch.Tensor:
        """What a client's value at ``path`` is compared with: the last answer for it (a stage
        average ``stage_average.X``: the last answer for ``X``, the global the stage ran from),
        else the initial state, else zero."""
        for prefix, target in ALIASES.items():
            if path.startswith(prefix):
                path = target + path[len(prefix) :]
        if path in self.last:
            return self.last[path]
        value = self.initial.get(path)
        if value is not None and value.shape == like.shape:
            return value.to(like.device, like.dtype)
        return torch.zeros_like(like)

    @property
    def private(self) -> bool:
        """False in the reproducible test mode (``ClientDP.noise_seed`` set)."""
        return self.source.private

    def share(self, gather_object: Callable[[Any], list[Any]]) -> None:
        """Use rank 0's source on every rank (distributed engine; in memory, never written)."""
        self.source = self.source.shared(lambda entropy: gather_object(entropy)[0])

    def noise(self, round_: int, shapes: list[tuple[str, torch.Size]]) -> dict[str, torch.Tensor]:
        """N(0, 1) per coordinate of every leaf, in float64 on the CPU: round ``round_``'s stream."""
        source = self.source.spawn(round_, NOISE_STREAM)
        return {p: source.gaussian(s, 1.0, dtype=torch.float64) for p, s in shapes}

    def clipped_sum(self, tree: Tree, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Σ over the clients in ``mask`` of their updates clipped jointly to C, per leaf path
        (float64). The distributed engine all-reduces these sums (and the participant count)
        over ranks, then calls :meth:`release` on every rank."""
        flat = dict(leaves(tree))
        rows = mask.nonzero().flatten().to(next(iter(flat.values())).device)
        updates = {
            p: t.index_select(0, rows).double() - self.reference(p, t[0]).double() for p, t in flat.items()
        }
        squares = [
            u.reshape(u.shape[0], u[0].numel() if len(u) else 0).pow(2).sum(1) for u in updates.values()
        ]
        norms = torch.stack(squares).sum(0).sqrt()
        self.norms = norms.cpu()
        scale = (self.config.clip / norms.clamp_min(1e-30)).clamp(max=1.0)
        return {p: (u * scale.reshape(-1, *[1] * (u.dim() - 1))).sum(0) for p, u in updates.items()}

    def release(
        self, sums: dict[str, torch.Tensor], like: Tree, round_: int, denominator: float
    ) -> dict[str, torch.Tensor]:
        """reference + (sum + N(0, (σC)²)) / denominator, projected; remembered as the next reference.
        ``like``: the stacked tree of the call (dtypes)."""
        flat = dict(leaves(like))
        noise = self.noise(round_, [(p, s.shape) for p, s in sums.items()])
        std = self.config.noise_multiplier * self.config.clip
        out = {}
        for p, s in sums.items():
            ref = self.reference(p, flat[p][0]).double()
            value = (ref + (s + std * noise[p].to(s.device)) / denominator).to(flat[p].dtype)
            out[p] = self.project(p, value)
        self.last.update({p: v.detach().clone() for p, v in out.items()})
        return out

    def aggregate(
        self, tree: Tree, mask: torch.Tensor, round_: int, denominator: float
    ) -> dict[str, torch.Tensor]:
        """Stacked contributions ``[K, ...]`` of the clients in ``mask`` → the noised mean per
        leaf path (a flat dict): :meth:`clipped_sum` then :meth:`release`."""
        return self.release(self.clipped_sum(tree, mask), tree, round_, denominator)

    def sampled(self, round_: int, clients: list[int]) -> torch.Tensor | None:
        """Bool mask over ``clients`` (global indices held by this process) of the round's
        participants, drawn from the noise source (secret: so is the sampled set); None when every
        client takes part."""
        sampling = self.config.sampling
        if sampling.everyone:
            return None
        return sampling.mask(self.source, round_, self.num_clients)[clients]

    def wrap(self, comm: Any, round_: int, mask: torch.Tensor | None) -> PrivateCollective:
        """The round's private collective around ``comm`` (``mask`` None: all clients take part)."""
        return PrivateCollective(comm, self, round_, mask)

    def state_dict(self) -> dict[str, Any]:
        return {"last": dict(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last = dict(state["last"])


def _unflatten(tree: Tree, flat: dict[str, torch.Tensor], k: int) -> Tree:
    """``flat`` path → value, placed in ``tree``'s structure with a leading axis of ``k`` copies."""

    def build(sub: Any, prefix: str) -> Any:
        if isinstance(sub, dict):
            return {key: build(v, f"{prefix}{key}.") for key, v in sub.items()}
        value = flat[prefix[:-1]]
        return value.unsqueeze(0).expand(k, *value.shape).clone()

    return build(tree, "")


class PrivateCollective:
    """A round's collective with client-level DP on ``mean`` (see the module docstring);
    ``mask``: bool over this process's clients taking part in the round (None: all)."""

    def __init__(self, inner: Any, aggregator: PrivateAggregator, round_: int, mask: torch.Tensor | None):
        self.inner, self.aggregator, self.round, self.mask = inner, aggregator, round_, mask
        self.num_clients = inner.num_clients
        self.calls = 0

    def _refuse(self, collective: str) -> ConfigError:
        return ConfigError(
            f"client-level DP: {self.aggregator.name} uses the collective '{collective}', which it cannot cover"
        )

    def mean(self, tree: Tree) -> Tree:
        self.calls += 1
        if self.calls > 1:
            raise self._refuse("mean (a second one in the round: the clipping budget covers one)")
        k = next(iter(leaves(tree)))[1].shape[0]
        mask = torch.ones(k, dtype=torch.bool) if self.mask is None else self.mask
        participants = int(mask.sum())  # a distributed engine sums this over ranks
        ledger = getattr(self.inner, "ledger", None)
        if ledger is not None:
            ledger.record("mean", tree, participants)
        sums = self.aggregator.clipped_sum(tree, mask)
        across = getattr(self.inner, "sum_over_ranks", None)  # the distributed engine's all_reduce
        if across is not None:
            sums, participants = across(sums, participants)
        denominator = self.aggregator.config.sampling.denominator(self.aggregator.num_clients, participants)
        return _unflatten(tree, self.aggregator.release(sums, tree, self.round, denominator), k)

    def gather(self, tree: Tree) -> Tree:
        raise self._refuse("gather")

    def pool(self, groups: dict[str, Tree], valid: dict[str, torch.Tensor], key: int) -> dict[str, Tree]:
        raise self._refuse("pool")

    def per_client(self, fn: Callable[..., Tree], *trees: Tree) -> Tree:
        return self.inner.per_client(fn, *trees)

    def __getattr__(self, name: str) -> Any:  # engine extras of the wrapped collective (e.g. ``finish``)
        return getattr(self.inner, name)

"""Secure aggregation on Flower, the parts that need no ``flwr``: refusals, quantization, wire codec.

With ``secure-aggregation = true`` every step exchange of a Flower run goes through Flower's
SecAgg+ (:mod:`fedxrisk.flower.secagg`): each site masks its ``mean`` payload, the server
learns only the sum, hence the mean. This module decides what can use it and how values are
quantized:

- **Refusals** (one line, before the run starts): algorithms whose collectives are not all
  ``mean`` (as each declares them: ``Algorithm.collectives``), ``buffer-policy = "local"`` (each site's own BatchNorm statistics reach the
  server at evaluation), fewer than 2 sites.
- **Client-level DP** under SecAgg+: the sites clip their own updates (:class:`SiteClip`), the
  server adds the noise to the secure mean; the quantization range is then C.
- **Quantization**: SecAgg+ sums integers modulo 2³². A site's value x ∈ [−R, R]
  (``secure-aggregation-range``) becomes ⌊(x + R)·L / 2R⌉ with stochastic rounding, L the
  levels; K sites' sums must stay below 2³², so L = 2^(31 − ⌈log₂ K⌉) (2³⁰ for 2 sites). The
  mean's error per coordinate is below one step 2R/L (R = 64, K = 2: 1.2·10⁻⁷). A value
  outside [−R, R] stops the run with a message naming the tensor (Flower would clip it
  silently).
"""

from __future__ import annotations

import io
import math
from typing import Any

import torch

from fedxrisk.errors import ConfigError
from fedxrisk.flower.wire import Packet, flatten, unflatten
from fedxrisk.tree import Tree, leaves, tmap

MODULUS = 2**32  # SecAgg+'s mask range (Flower's largest)


def levels(num_sites: int) -> int:
    """Quantization levels L for ``num_sites`` sites: their sum of values in [0, L] stays < 2³¹."""
    return 2 ** (31 - max(1, math.ceil(math.log2(max(num_sites, 2)))))


def step(value_range: float, num_sites: int) -> float:
    """The quantization step 2R/L: a bound on the error of the securely aggregated mean."""
    return 2 * value_range / levels(num_sites)


def collective_kinds(cfg: Any) -> set[str]:
    """The collectives ``cfg``'s algorithm calls (``mean``, ``gather``, ``pool``), as it declares
    them (``Algorithm.collectives``; tests/test_declared_support.py records every algorithm's)."""
    return set(cfg.algorithm_class.collectives)


def algorithm_refusal(cfg: Any) -> str | None:
    """Why ``cfg``'s algorithm cannot run under SecAgg+ (None: every collective is a mean)."""
    other = sorted(collective_kinds(cfg) - {"mean"})
    if not other:
        return None
    what = {
        "pool": "per-sample score pools the server merges",
        "gather": "per-site tensors every site receives",
    }
    return (
        f"secure-aggregation: {cfg.run.algorithm} calls collective(s) {other} ({'; '.join(what[k] for k in other)}), "
        "which a secure sum cannot carry; only algorithms whose every message is a mean can use SecAgg+"
    )


def check_secure_algorithm(cfg: Any) -> None:
    """With ``secure-aggregation``: a one-line :class:`ConfigError` from :func:`algorithm_refusal`."""
    if cfg.deploy.secure_aggregation and (refusal := algorithm_refusal(cfg)) is not None:
        raise ConfigError(refusal)


def check_secure_config(cfg: Any) -> None:
    """One-line :class:`ConfigError` for settings SecAgg+ cannot honour (no data needed)."""
    if not cfg.deploy.secure_aggregation:
        return
    if cfg.deploy.min_nodes < 2:
        raise ConfigError(
            f"secure-aggregation needs min-nodes ≥ 2 (SecAgg+ sums 2+ sites), got {cfg.deploy.min_nodes}"
        )
    if cfg.run.buffer_policy == "local":
        raise ConfigError(
            "secure-aggregation with buffer-policy 'local': each site's own BatchNorm statistics would reach "
            "the server in the clear at evaluation; use buffer-policy 'average'"
        )
    if not 0 < cfg.deploy.secure_aggregation_range < math.inf:
        raise ConfigError(
            f"secure-aggregation-range must be a finite number > 0, got {cfg.deploy.secure_aggregation_range}"
        )


VALIDATION = "fedxrisk.validation"  # a site's validation histogram inside its secure vector


def count_cap(num_sites: int) -> int:
    """The largest count M a site may put in a secure vector: values c·R/M quantized with K sites err by
    less than K·2R/L in the sum, i.e. K·2M/L counts; M = L/(8K) keeps that below 1/4, so rounding the
    dequantized sum gives the exact integer sum."""
    return levels(num_sites) // (8 * max(num_sites, 2))


def secure_counts(counts: torch.Tensor, cfg: Any, num_sites: int) -> torch.Tensor:
    """A site's integer histogram scaled into [0, R] for SecAgg+ (float64: exact)."""
    cap = count_cap(num_sites)
    if int(counts.max()) > cap:  # the message names no count (issue 40)
        raise ValueError(
            f"secure-aggregation: a bin holds more than {cap} validation scores, the most "
            f"{num_sites} sites' secure sum keeps exact; use fewer validation samples per site"
        )
    return counts.double() * (value_range(cfg) / cap)


def summed_counts(mean: torch.Tensor, cfg: Any, num_sites: int) -> torch.Tensor:
    """The sites' summed integer histogram from SecAgg+'s mean of :func:`secure_counts`."""
    return torch.round(mean.double() * num_sites * count_cap(num_sites) / value_range(cfg)).long()


VALIDATION_NOISY = "fedxrisk.validation-noisy"  # a site's noised validation share (DP, issue 40)


def secure_share(share: torch.Tensor, cfg: Any, cap: float) -> torch.Tensor:
    """A site's noised validation share (float counts, |count| ≤ ``cap``: beyond, clipped — a function
    of the noised share alone) scaled into [−R, R]; SecAgg+'s rounding then errs by < 2·cap/L counts."""
    return share.double().clamp(-cap, cap) * (value_range(cfg) / cap)


def summed_shares(mean: torch.Tensor, cfg: Any, num_sites: int, cap: float) -> torch.Tensor:
    """The sites' summed noised shares from SecAgg+'s mean of :func:`secure_share` (float64, not
    rounded: there is no exact sum to recover)."""
    return mean.double() * num_sites * cap / value_range(cfg)


def check_range(payload: dict[str, torch.Tensor], value_range: float) -> str | None:
    """Why the payload cannot be quantized (a value beyond ±R or not finite), or None."""
    for name, t in payload.items():
        if t.numel() and not torch.isfinite(t).all():
            return f"secure-aggregation: tensor {name!r} holds NaN/inf"
        if t.numel() and (big := float(t.abs().max())) > value_range:
            return (
                f"secure-aggregation: tensor {name!r} holds {big:.4g}, beyond secure-aggregation-range = "
                f"{value_range:g}; raise it (the error per coordinate grows with it: 2·range/levels)"
            )
    return None


def flat_vector(payload: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[list[Any]]]:
    """All tensors as one float64 vector (exact for float32) and their ``[name, shape, dtype]``."""
    layout = [[name, list(t.shape), str(t.dtype).removeprefix("torch.")] for name, t in payload.items()]
    parts = [t.detach().reshape(-1).double() for t in payload.values()]
    return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)), layout


def split_vector(vector: torch.Tensor, layout: list[list[Any]]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`flat_vector` (values cast back to each tensor's dtype)."""
    out, at = {}, 0
    for name, shape, dtype in layout:
        n = math.prod(shape)
        out[name] = vector[at : at + n].reshape(shape).to(getattr(torch, dtype))
        at += n
    if at != vector.numel():
        raise ValueError(f"secure aggregate has {vector.numel()} values, the layout {at}")
    return out


def packet_bytes(packet: Packet) -> bytes:
    """A packet as bytes (for a Flower ConfigRecord, which keeps what SecAgg+ does not mask)."""
    buffer = io.BytesIO()
    torch.save({"config": packet.config, "metrics": packet.metrics, "arrays": packet.arrays}, buffer)
    return buffer.getvalue()


def packet_from_bytes(data: bytes) -> Packet:
    d = torch.load(io.BytesIO(data), weights_only=True)
    return Packet(dict(d["config"]), dict(d["metrics"]), {g: dict(a) for g, a in d["arrays"].items()})


def secure_mean(
    federation: Any, replies: dict[int, Packet], round_: int, what: str
) -> dict[str, torch.Tensor]:
    """The server's side of a secure ``mean`` (:class:`~fedxrisk.flower.federation.Federation`):
    every reply carries the same aggregate (``arrays["mean"]``) and no site's own payload; bytes are
    counted as for a plain mean. With client-level DP the aggregate is the mean of the sites' clipped
    updates: the server adds the noise."""
    ordered = [replies[s.node] for s in federation.sites]
    if any("payload" in r.arrays for r in ordered) or not all("mean" in r.arrays for r in ordered):
        raise RuntimeError(
            f"{what}: secure-aggregation needs Flower's SecAgg+ (GridTransport); this transport "
            "delivered the sites' own payloads"
        )
    mean = unflatten(ordered[0].arrays["mean"])
    stacked = tmap(lambda t: t.unsqueeze(0), mean)  # the plain mean's shapes, for the ledger
    federation.ledger.record("mean", stacked if isinstance(stacked, dict) else {"": stacked}, len(ordered))
    return flatten(mean if federation.dp is None else federation.dp.release(mean, round_))


def value_range(cfg: Any) -> float:
    """The quantization range R: with client-level DP the sites send clipped updates, whose every
    coordinate lies in [−C, C], so R = C (+ 10⁻⁶ relative for float rounding); else
    ``secure-aggregation-range``."""
    clip = cfg.privacy["clip"] if cfg.privacy is not None else None
    return clip * (1 + 1e-6) if clip else cfg.deploy.secure_aggregation_range


class SiteClip:
    """Client-level DP under SecAgg+, the site's half: clip its own update (its ``mean`` payload
    minus the last answer for it, first round: the initial state) to L2 norm C, as
    :class:`~fedxrisk.engines.privacy.PrivateAggregator` does on a server that sees the values.
    The server adds the noise to the secure mean (:meth:`fedxrisk.flower.private.ServerDP.release`)."""

    def __init__(self, cfg: Any, algorithm: Any, initial: Tree, num_clients: int):
        from fedxrisk.engines.privacy import ClientDP, PrivateAggregator

        self.aggregator = PrivateAggregator(
            ClientDP(cfg.privacy["clip"], 0.0), algorithm, initial, 0, num_clients
        )

    def update(self, stacked: Tree) -> Tree:
        """The clipped update of this site's payload (leaves ``[1, ...]`` → ``[...]``, dtypes kept)."""
        clipped = iter(self.aggregator.clipped_sum(stacked, torch.ones(1, dtype=torch.bool)).values())
        return tmap(lambda t: next(clipped).to(t.dtype), stacked)  # leaves() and tmap share one order

    def answered(self, answer: Tree) -> None:
        """The server's (noised) answer: the next reference of the same leaves."""
        self.aggregator.last.update({p: t.detach().clone() for p, t in leaves(answer)})

    @property
    def last(self) -> dict[str, torch.Tensor]:
        return self.aggregator.last


def site_clip(cfg: Any, algorithm: Any, info: Any, num_clients: int) -> SiteClip | None:
    """The site's :class:`SiteClip` when client-level DP runs under SecAgg+, else None."""
    if cfg.privacy is None or not cfg.deploy.secure_aggregation:
        return None
    return SiteClip(cfg, algorithm, algorithm.init(info), num_clients)

"""Federated evaluation on Flower: pooled AUROC [DeLong CI], private by default; exact on request.

**Private (the default, issue 40)**: :func:`private_evaluation`, one model, one Gaussian-mechanism
release of the pooled per-class histogram (:mod:`fedxrisk.stats.dp_eval`, (ε, δ) =
:data:`DEFAULT_DP` unless given). The noise is added by the sites (distributed noise): under
SecAgg+ each of the K sites adds N(0, σ²/K) from a secret of its own before the secure sum, so the
server never holds an exact histogram sum; without SecAgg+ each site's histogram reaches the
server in clear, so each site adds the whole N(0, σ²) (every site's release is (ε, δ)-DP alone;
the sum carries σ√K, which the CI includes). **Exact** (``dp=None``; ``--exact`` on the command
line): the protocol below, whose result states what it discloses (:data:`EXACT_DISCLOSURE`).

Two exchanges over the sites' own test files (``test.npz`` / ``test.csv`` in the node config's
``data-dir``), the protocol of :mod:`fedxrisk.stats.federated`:

1. **histograms**: each site scores its test rows with each model the server sends (the
   federated model, and for ``--against`` a second one) and counts them per class in the fixed
   logit bins; the server obtains the **sum** only.
2. **moments**: the server sends the pooled histograms back; each site computes its patients'
   DeLong placement values against them and sends its shares of the pooled moments; the server
   obtains the sum, hence the pooled AUROC, DeLong's variance and CI, and the paired test.
   With one model (and no per-site release) this exchange is skipped: a binned placement value
   depends only on its bin, so the moments follow from the pooled histogram
   (:func:`fedxrisk.stats.federated.histogram_moments`).

With ``secure-aggregation = true`` both sums go through Flower's SecAgg+
(:func:`fedxrisk.flower.secagg.secure_exchange`, unchanged): the server holds masked vectors and
the aggregate, never a site's histogram, count or score. The sums are **exact**: with the
quantization range R' = the largest power of two ≤ the run's range and L levels, a site sends
a count c as c·2R'/L, which SecAgg+ quantizes to the integer c + L/2 with no rounding (counts up
to L/2 = 2²⁸ for ≤ 4 sites); a share v ∈ [0, 1] travels as two such integers (limbs)
⌊v·A⌋ and ⌊frac(v·A)·A⌋, A = L/4, so the summed moments are exact to K/A² (< 10⁻¹⁵). Without
secure aggregation each site's histogram reaches the server in the clear (as the training's
validation histograms do); the numbers are the same.

A site releases its own AUROC [CI] and class counts in clear only when the server asks
(``site_auroc``); docs/evaluation.md says what each party learns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.errors import ConfigError
from fedxrisk.flower import DEFAULT_EVAL_DP
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.secure import levels, value_range
from fedxrisk.flower.sitedata import SiteDataError, _find, read_table
from fedxrisk.flower.wire import Packet
from fedxrisk.stats import delong
from fedxrisk.stats.federated import (
    EVAL_BINS,
    EVAL_LIMIT,
    federated_delong,
    federated_paired,
    histogram_moments,
    placement_shares,
    site_histograms,
)
from fedxrisk.stats.histogram import logit_edges

OP = "evaluate"  # request.config["op"] of an evaluation exchange
DEFAULT_DP = DEFAULT_EVAL_DP  # (ε, δ) of the default private evaluation (docs/evaluation.md)
EXACT_DISCLOSURE = (
    "exact mode: the server learned the pooled per-class score histogram of every model exactly "
    "(fine logit bins: most patients are alone in their bin), so whoever holds a model and a patient's "
    "features learns that patient's label; use the default private evaluation to release only a "
    "Gaussian-noised histogram"
)
DP_UNITS = 2**10  # a noisy count travels as 1024 quantization steps: rounding adds < 1/1024 count


def _exchange_config(cfg: FlowerConfig, r: float) -> FlowerConfig:
    """``cfg`` for an evaluation exchange: SecAgg+'s range ``r`` and no training DP (the sites clip nothing)."""
    return replace(
        cfg, deploy=replace(cfg.deploy, secure_aggregation_range=r), run=replace(cfg.run, privacy=None)
    )


def fixed_point(cfg: FlowerConfig, sites: int) -> tuple[float, float, int]:
    """(R', step 2R'/L, limb base A): R' the largest power of two ≤ the run's quantization range."""
    r = 2.0 ** math.floor(math.log2(value_range(cfg)))
    return r, 2 * r / levels(sites), levels(sites) // 4


# -- the site -------------------------------------------------------------------------------


def site_test(node_config: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """This site's own test rows: ``test.npz`` / ``test.csv`` in its ``data-dir``."""
    if "data-dir" not in node_config:
        raise SiteDataError(
            "federated evaluation needs a site started with data-dir holding test.npz or test.csv"
        )
    folder = Path(str(node_config["data-dir"])).expanduser()
    path = _find(folder, "test") if folder.is_dir() else None
    if path is None:
        raise SiteDataError(f"data-dir {str(folder)!r} holds neither test.npz nor test.csv on this site")
    return read_table(path)


def _logits(cfg: FlowerConfig, state: dict[str, torch.Tensor], x: np.ndarray) -> np.ndarray:
    model = cfg.build_model(tuple(x.shape[1:]))
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(x)).reshape(len(x)).double().numpy()


def site_evaluate(node_config: Mapping[str, Any], run_config: Mapping[str, Any], request: Packet) -> Packet:
    """One site's answer to an evaluation exchange (``request.config['stage']``)."""
    c = request.config
    try:
        cfg = FlowerConfig.from_run_config(run_config)
        x, y = site_test(node_config)
        scores = [_logits(cfg, request.arrays[f"model{i}"], x) for i in range(int(c["models"]))]
    except (SiteDataError, ConfigError, RuntimeError, KeyError) as e:
        return Packet(config={"error": f"evaluation: {e}"})
    edges, secure = logit_edges(int(c["bins"]), float(c["limit"])), bool(c["secure"])
    if c["stage"] == "histograms":
        counts = site_histograms(y, scores, edges)
        if c.get("dp_sigma"):  # this site's share of the Gaussian noise, from a secret of its own
            if counts[:, :, -1].any():
                return Packet(config={"error": "evaluation: a NaN score; a private evaluation releases none"})
            draws = NoiseSource.secret().standard_normal(counts.size).reshape(counts.shape)
            noise = float(c["dp_sigma"]) * draws
            counts = counts + noise * (np.arange(counts.shape[-1]) < counts.shape[-1] - 1)
        if not secure:
            return Packet(arrays={OP: {"counts": torch.from_numpy(counts)}})
        units = float(
            c.get("units", 1)
        )  # quantization steps per count (> 1: noisy counts keep their fraction)
        if np.abs(counts).max() * units > int(c["limb"]) * 2:  # the message names no count (issue 40)
            most = int(c["limb"]) * 2 / units
            return Packet(
                config={
                    "error": f"evaluation: a bin holds more than {most:.0f} rows, the most SecAgg+ sums exactly"
                }
            )
        return Packet(arrays={"payload": {"counts": torch.from_numpy(counts * units * float(c["step"]))}})
    shares = placement_shares(request.arrays["totals"]["counts"].numpy(), y, scores, edges)
    reply = Packet()
    if c.get("site_auroc"):
        reply.config["site"] = json.dumps([asdict(delong(y, s)) | _classes(y) for s in scores])
    if not secure:
        reply.arrays[OP] = {"moments": torch.from_numpy(shares)}
        return reply
    base = float(c["limb"])
    high = np.floor(shares * base)
    low = np.floor((shares * base - high) * base)
    reply.arrays["payload"] = {"moments": torch.from_numpy(np.stack([high, low]) * float(c["step"]))}
    return reply


def _classes(y: np.ndarray) -> dict[str, int]:
    return {"positives": int(y.sum()), "negatives": int(len(y) - y.sum())}


# -- the server ------------------------------------------------------------------------------

Send = Callable[[dict[int, Packet], FlowerConfig], dict[int, Packet]]


def _summed(
    replies: dict[int, Packet], key: str, secure: bool, step: float, exact: bool = True
) -> np.ndarray:
    errors = [f"site {n}: {r.error}" for n, r in replies.items() if r.error]
    if errors:
        raise RuntimeError("; ".join(errors))
    if not secure:
        return sum(r.arrays[OP][key].numpy() for r in replies.values())
    mean = next(iter(replies.values())).arrays["mean"][key].double().numpy()
    total = mean * len(replies) / step
    return np.rint(total) if exact else total  # exact: the integer sum (module docstring)


def federated_evaluation(
    send: Send, nodes: Sequence[int], cfg: FlowerConfig, models: Sequence[dict[str, torch.Tensor]],
    site_auroc: bool = False, bins: int = EVAL_BINS, limit: float = EVAL_LIMIT,
) -> dict[str, Any]:  # fmt: skip
    """The two exchanges over ``nodes``; ``send(requests, cfg)`` delivers them (SecAgg+ or plain)
    and returns each node's reply. Pooled AUROC [CI] of each model, the paired test of models
    0 − 1 when there are two, and the sites' own AUROCs when ``site_auroc``."""
    secure = cfg.deploy.secure_aggregation
    r, step, limb = fixed_point(cfg, len(nodes))
    sent_cfg = _exchange_config(cfg, r)
    config = {"op": OP, "models": len(models), "bins": bins, "limit": limit, "secure": secure, "step": step,
              "limb": limb, "site_auroc": site_auroc}  # fmt: skip
    arrays = {f"model{i}": dict(m) for i, m in enumerate(models)}
    first = send(
        {n: Packet(config={**config, "stage": "histograms"}, arrays=dict(arrays)) for n in nodes}, sent_cfg
    )
    totals = _summed(first, "counts", secure, step).astype(np.int64)
    second: dict[int, Packet] = {}
    if len(models) == 1 and not site_auroc:  # the moments follow from the pooled histogram: no round 2
        moments = histogram_moments(totals)
    else:
        request = {**arrays, "totals": {"counts": torch.from_numpy(totals)}}
        stage = {n: Packet(config={**config, "stage": "moments"}, arrays=dict(request)) for n in nodes}
        limbs = _summed(second := send(stage, sent_cfg), "moments", secure, step)
        moments = limbs if not secure else (limbs[0] + limbs[1] / limb) / limb
    out: dict[str, Any] = {
        "mode": "exact",
        "disclosure": EXACT_DISCLOSURE,
        "sites": len(nodes),
        "secure_aggregation": secure,
        "bins": bins,
        "models": [asdict(federated_delong(totals, moments, i)) for i in range(len(models))],
        "totals": totals,
        "moments": moments,
    }
    if len(models) == 2:
        out["paired"] = asdict(federated_paired(totals, moments))
    if site_auroc:
        out["site_auroc"] = {n: json.loads(second[n].config["site"]) for n in nodes}
    return out


def private_evaluation(
    send: Send, nodes: Sequence[int], cfg: FlowerConfig, model: dict[str, torch.Tensor], epsilon: float, delta: float
) -> dict[str, Any]:  # fmt: skip
    """One model's AUROC [CI] from one (ε, δ)-DP release (:mod:`fedxrisk.stats.dp_eval`), the noise
    added by the sites: under SecAgg+ each of the K sites adds N(0, σ²/K), so the server holds the
    pooled histogram plus N(0, σ²) per cell and nothing less noisy; without SecAgg+ each site adds
    N(0, σ²) to the histogram it sends in clear, and the sum carries σ√K. The CI is
    √(DeLong SE² + the noise's SE²) at the released noise (:func:`~fedxrisk.stats.dp_eval.dp_auroc`).
    The paired test and per-site releases are not available (the exact mode has them)."""
    from fedxrisk.stats.dp_eval import DP_BINS, DP_LIMIT, DPTooNoisy, dp_auroc, noise_sigma

    secure, k = cfg.deploy.secure_aggregation, len(nodes)
    sigma = noise_sigma(epsilon, delta)
    site_sigma = sigma / math.sqrt(k) if secure else sigma
    released = site_sigma * math.sqrt(k)  # the noise of the summed histogram
    r, step, limb = fixed_point(cfg, k)
    config = {"op": OP, "models": 1, "bins": DP_BINS, "limit": DP_LIMIT, "secure": secure, "step": step,
              "limb": limb, "dp_sigma": site_sigma, "units": DP_UNITS, "stage": "histograms"}  # fmt: skip
    replies = send({n: Packet(config=dict(config), arrays={"model0": dict(model)}) for n in nodes},
                   _exchange_config(cfg, r))  # fmt: skip
    noisy = _summed(replies, "counts", secure, step, exact=False)[0] / (DP_UNITS if secure else 1)
    out = {
        "mode": "private", "sites": k, "secure_aggregation": secure, "bins": DP_BINS,
        "noise_added_by": "sites", "sigma_per_site": site_sigma, "sigma": released,
        "released": (
            f"the pooled per-class histogram ({DP_BINS} logit bins over ±{DP_LIMIT:g}) plus N(0, {released:.4g}²) "
            "per count, added by the sites" + ("" if secure else "; each site's own histogram plus "
            f"N(0, {site_sigma:.4g}²), in clear (no SecAgg+)")
        ),
        "totals": noisy,
    }  # fmt: skip
    try:
        return out | {"private": asdict(dp_auroc(noisy, released, epsilon, delta))}
    except DPTooNoisy as e:
        return out | {"private": {"epsilon": epsilon, "delta": delta, "sigma": released, "refused": str(e)}}


def evaluation_app_module(
    models: Sequence[str], site_auroc: bool, dp: tuple[float, float] | None = DEFAULT_DP
) -> str:
    """``fedxrisk_app.py`` of an evaluation app: the usual ClientApp, the evaluation ServerApp
    (``dp`` = (ε, δ) of the private release; None: the exact mode)."""
    paths = [str(Path(m).expanduser().resolve()) for m in models]
    return (
        '"""fedxrisk federated evaluation (python -m fedxrisk.flower evaluate): two secure sums."""\n\n'
        "from fedxrisk.flower.app import client_app\n"
        "from fedxrisk.flower.evaluate_app import evaluation_server_app\n\n"
        f"server_app = evaluation_server_app({paths!r}, site_auroc={site_auroc!r}, dp={dp!r})\n\n"
        '__all__ = ["client_app", "server_app"]\n'
    )

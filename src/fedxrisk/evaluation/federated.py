"""``fedxrisk evaluate`` on data with sites: every AUROC [CI] computed both ways, pooled and federated.

*Pooled exact*: one party holds every score (:func:`fedxrisk.stats.delong`, R's pROC to 4e-16).
*Federated*: what a network learns when no site reveals a score — the two secure sums of
:mod:`fedxrisk.stats.federated` (pooled per-class histograms, then each site's placement-value
moments), simulated here in one process; ``python -m fedxrisk.flower evaluate`` runs the same two
sums through SecAgg+. A site's own AUROC [CI] is computed by that site on its own scores
(exactly; released only if asked), so its two columns agree by construction. The pooled
difference is the binning error, within the printed bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from fedxrisk.evaluation.data import Scored
from fedxrisk.stats import delong, delong_paired, logit_edges
from fedxrisk.stats.federated import EVAL_BINS, EVAL_LIMIT, federated_delong, federated_paired, simulate

PAUC_FPR = 0.3


def has_sites(data: Scored) -> bool:
    """Groups that partition the evaluated rows (sites, or clients on their own test portions)."""
    return bool(data.groups) and not (data.group_kind == "client" and data.groups_split == "train")


def _known(y: np.ndarray, *scores: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    keep = ~np.isnan(y)
    return y[keep].astype(bool), [s[keep] for s in scores]


def _interval(d: Any) -> dict[str, float]:
    return {"auroc": d.auroc, "low": d.low, "high": d.high, "se": d.se}


def label_sites(
    groups: Sequence[tuple[str, np.ndarray, Sequence[np.ndarray]]], edges: np.ndarray
) -> dict[str, Any]:
    """One label: ``groups`` = (site, labels with NaN unknown, [scores of each model]) → pooled exact vs
    federated AUROC [CI] of model 0 (and the paired test of models 0 − 1 when there are two), per site
    the site's own DeLong."""
    sites = [(name, *_known(y, *ss)) for name, y, ss in groups]
    totals, moments = simulate([(y, ss) for _, y, ss in sites], edges)
    y = np.concatenate([y for _, y, _ in sites])
    pooled = [np.concatenate([ss[i] for _, _, ss in sites]) for i in range(len(sites[0][2]))]
    exact, fed = delong(y, pooled[0]), federated_delong(totals, moments, 0, max_fpr=PAUC_FPR)
    out: dict[str, Any] = {
        "positives": fed.positives,
        "negatives": fed.negatives,
        "exact": _interval(exact),
        "federated": _interval(fed)
        | {
            k: getattr(fed, k)
            for k in ("auroc_bound", "se_bound", "ci_bound", "ap", "ap_bound", "pauc", "pauc_bound")
        },
        "difference": {k: _interval(fed)[k] - _interval(exact)[k] for k in ("auroc", "low", "high", "se")},
        "sites": {},
    }
    for name, sy, ss in sites:
        own = delong(sy, ss[0])  # computed by the site on its own scores: what it would release
        out["sites"][name] = {"positives": int(sy.sum()), "negatives": int((~sy).sum()), **_interval(own)}
    if len(pooled) == 2:
        ep, fp = delong_paired(y, *pooled), federated_paired(totals, moments)
        out["paired"] = {
            "exact": {k: getattr(ep, k) for k in ("auroc1", "auroc2", "difference", "se", "z", "p_value")},
            "federated": {
                k: getattr(fp, k)
                for k in (
                    "auroc1",
                    "auroc2",
                    "difference",
                    "se",
                    "z",
                    "p_value",
                    "difference_bound",
                    "se_bound",
                    "p_low",
                    "p_high",
                )
            },
        }
    return out


def private_auroc(
    groups: Sequence[tuple[str, np.ndarray, Sequence[np.ndarray]]], epsilon: float, delta: float, seed: int,
    noise: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """Model 0's AUROC [CI] from one Gaussian-noised release of the pooled histogram
    (:mod:`fedxrisk.stats.dp_eval`), or the refusal. The noise comes from the secret
    :class:`~fedxrisk.engines.privacy.noise.NoiseSource` (``noise``: another source, for tests),
    never from ``seed``, which only seeds the bootstrap that re-noises the released histogram."""
    from fedxrisk.stats.dp_eval import DP_BINS, DP_LIMIT, DPTooNoisy, dp_auroc, noise_sigma, release

    sites = [_known(y, ss[0]) for _, y, ss in groups]
    totals, _ = simulate([(y, ss) for y, ss in sites], logit_edges(DP_BINS, DP_LIMIT))
    sigma = noise_sigma(epsilon, delta)
    try:
        noisy = release(totals[0], sigma, noise)
        return asdict(dp_auroc(noisy, sigma, epsilon, delta, seed=seed))
    except (DPTooNoisy, ValueError) as e:
        return {"epsilon": epsilon, "delta": delta, "sigma": sigma, "refused": str(e)}


def federated_report(
    data: Scored, names: Sequence[str], other: Scored | None = None, edges: np.ndarray | None = None,
    dp: tuple[float, float] | None = None, seed: int = 0,
) -> dict[str, Any] | None:  # fmt: skip
    """Per label, :func:`label_sites` over ``data``'s sites (``other``: a second model's scores of the
    same rows and groups, for the paired test; ``dp`` = (ε, δ): also :func:`private_auroc`); None
    without sites."""
    if not has_sites(data):
        return None
    edges = logit_edges(EVAL_BINS, EVAL_LIMIT) if edges is None else edges
    labels = {}
    for j, name in enumerate(names):
        groups = []
        for i, (site, gy, gs) in enumerate(data.groups):
            scores = [gs[:, j]] + ([other.groups[i][2][:, j]] if other is not None else [])
            groups.append((site, gy[:, j], scores))
        labels[name] = label_sites(groups, edges)
        if dp is not None:
            labels[name]["private"] = private_auroc(groups, *dp, seed)
    return {
        "method": (
            "two secure sums (pooled per-class score histograms, then each site's DeLong placement-value "
            "moments), simulated in one process; per site: the site's own exact DeLong"
        ),
        "bins": len(edges) + 1,
        "logit_limit": float(-edges[0]),
        "sites": len(data.groups),
        "labels": labels,
    }


# ---- output -------------------------------------------------------------------------------------


def _f(x: float | None, digits: int = 4) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ci(d: dict[str, float]) -> str:
    return f"{_f(d['auroc'])} [{_f(d['low'])}, {_f(d['high'])}]"


def _p(x: float) -> str:
    return "–" if x is None or math.isnan(x) else (f"{x:.2e}" if x < 1e-3 else f"{x:.4f}")


def markdown_lines(result: dict[str, Any]) -> list[str]:
    """The evaluation.md section: per site and pooled AUROC [95% CI], pooled exact vs federated."""
    fed = result.get("federated")
    if not fed:
        return []
    kind = result["group_kind"]
    lines = [
        "## Pooled and federated",
        "",
        f"Federated: {fed['method']}; {fed['bins']} logit bins over ±{fed['logit_limit']:g}. "
        "The bound is the worst case the binning can cause (AUROC; CI ends: bound + 1.96·SE bound).",
        "",
    ]
    for label, m in fed["labels"].items():
        if len(fed["labels"]) > 1:
            lines += [f"### {label}", ""]
        lines += [
            f"| {kind} | n+/n− | AUROC [95% CI] pooled exact | AUROC [95% CI] federated | difference | bound |",
            "|---|---:|---|---|---:|---:|",
        ]
        for site, s in m["sites"].items():
            lines.append(
                f"| {site} | {s['positives']}/{s['negatives']} | {_ci(s)} | {_ci(s)} (the site's own) | 0 | 0 |"
            )
        f, e = m["federated"], m["exact"]
        lines.append(
            f"| **pooled** | {m['positives']}/{m['negatives']} | {_ci(e)} | {_ci(f)} | "
            f"{m['difference']['auroc']:+.1e} | {_f(f['auroc_bound'], 5)} (CI {_f(f['ci_bound'], 5)}) |"
        )
        lines.append("")
        if "private" in m:
            dp = m["private"]
            if "refused" in dp:
                lines += [
                    f"Differentially private release (ε = {dp['epsilon']:g}, δ = {dp['delta']:g}): refused — {dp['refused']}.",
                    "",
                ]
            else:
                lines += [
                    f"Differentially private release (ε = {dp['epsilon']:g}, δ = {dp['delta']:g}, σ = {dp['sigma']:.3g} "
                    f"per bin): AUROC {_ci(dp)} (DeLong SE {dp['se']:.4f} and the noise's {dp['noise_se']:.4f} combined).",
                    "",
                ]
        if "paired" in m:
            pe, pf = m["paired"]["exact"], m["paired"]["federated"]
            lines += [
                f"Paired DeLong test (this run − the other, same patients): difference {pe['difference']:+.4f}, "
                f"p = {_p(pe['p_value'])} pooled exact; federated {pf['difference']:+.4f}, p = {_p(pf['p_value'])} "
                f"(exact p within [{_p(pf['p_low'])}, {_p(pf['p_high'])}]).",
                "",
            ]
    return lines


def console_table(result: dict[str, Any]) -> Any | None:
    """A rich table of the same numbers (first label; 80 columns)."""
    from rich import box
    from rich.table import Table

    fed = result.get("federated")
    if not fed:
        return None
    label, m = next(iter(fed["labels"].items()))
    table = Table(
        title=f"AUROC [95% CI]: pooled exact vs federated (secure sums){'' if len(fed['labels']) == 1 else ', ' + label}",
        box=box.SIMPLE_HEAD,
    )
    for name in (result["group_kind"], "pooled exact", "federated", "diff"):
        table.add_column(name, justify="left" if name != "diff" else "right")
    for site, s in m["sites"].items():
        table.add_row(site[:14], _ci(s), "(site's own)", "0")
    table.add_row("pooled", _ci(m["exact"]), _ci(m["federated"]), f"{m['difference']['auroc']:+.1e}")
    table.caption = f"binning bound: AUROC ±{_f(m['federated']['auroc_bound'], 5)}, CI ends ±{_f(m['federated']['ci_bound'], 5)}"
    return table

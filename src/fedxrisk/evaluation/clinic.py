"""What a clinician asks after the AUROC: operating points with CIs, and whether scores are risks.

**Operating points** (``--at-specificity s`` / ``--at-sensitivity t``): over the thresholds
"positive when logit ≥ c" (every distinct score), the highest sensitivity among thresholds
whose specificity is ≥ s (resp. the highest specificity with sensitivity ≥ t) — a threshold one
can deploy, no interpolation. 95% CI: stratified percentile bootstrap re-choosing the threshold
in every resample (as pROC's ``ci.se``/``ci.sp``), widened to contain the estimate
(:mod:`fedxrisk.stats.bootstrap`).

**Calibration**: σ(logit) is a risk estimate only for models trained on unweighted binary
cross-entropy (FedAvg = ``localsgdm``, ``fedprox``, ``scaffold``). AUC-type objectives
(CODA+, CODASCA, FCSG, FeDXL, …, and CE with ratio weights ``localsgdm_rl``) only rank: their
σ(logit) is not a probability. Reported either way: Brier score mean (σ − y)², the expected
calibration error ECE = Σ_b (n_b/N)·|mean y_b − mean σ_b| over 10 equal-width probability bins,
the reliability diagram (reliability.png), and the same after temperature scaling (Guo et al.,
ICML 2017): σ(logit/T) with T > 0 minimizing the cross-entropy on the run's validation data.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

CALIBRATED_ALGORITHMS = ("localsgdm", "fedprox", "scaffold")  # unweighted binary cross-entropy
ECE_BINS = 10


# ---- operating points ---------------------------------------------------------------------------


def _rates(y: np.ndarray, scores: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from fedxrisk.stats.bootstrap import _curves

    tp, fp = _curves(y, scores, counts)
    return tp / tp[:, -1:], 1.0 - fp / fp[:, -1:]  # sensitivity, specificity per threshold (highest first)


def sensitivity_at(y: np.ndarray, scores: np.ndarray, counts: np.ndarray, specificity: float) -> np.ndarray:
    """Highest sensitivity over thresholds with specificity ≥ ``specificity`` (0 if none), per row of counts."""
    sens, spec = _rates(y, scores, counts)
    return np.max(np.where(spec >= specificity - 1e-12, sens, 0.0), axis=1)


def specificity_at(y: np.ndarray, scores: np.ndarray, counts: np.ndarray, sensitivity: float) -> np.ndarray:
    """Highest specificity over thresholds with sensitivity ≥ ``sensitivity``, per row of counts."""
    sens, spec = _rates(y, scores, counts)
    return np.max(np.where(sens >= sensitivity - 1e-12, spec, 0.0), axis=1)


def _threshold(y: np.ndarray, s: np.ndarray, kind: str, target: float) -> float:
    """The logit c of the chosen operating point (positive when score ≥ c)."""
    sens, spec = (r[0] for r in _rates(y, s, np.ones((1, len(y)))))
    ok = spec >= target - 1e-12 if kind == "sensitivity" else sens >= target - 1e-12
    value = np.where(ok, sens if kind == "sensitivity" else spec, -1.0)
    distinct = np.unique(s)[::-1]
    return float(distinct[int(np.argmax(value))]) if ok.any() else math.inf


def rates_at(y: np.ndarray, s: np.ndarray, threshold: float, resamples: int, seed: int) -> dict[str, Any]:
    """Sensitivity and specificity [bootstrap CIs] of "positive when logit ≥ ``threshold``", a
    threshold chosen elsewhere (held fixed in every resample: the intervals are the test patients')."""
    from fedxrisk.stats import bootstrap_intervals

    y = y.astype(bool)
    called = s >= threshold

    def sensitivity(y_: np.ndarray, s_: np.ndarray, c: np.ndarray) -> np.ndarray:
        return (c * (y_ & (s_ >= threshold))).sum(1) / (c * y_).sum(1)

    def specificity(y_: np.ndarray, s_: np.ndarray, c: np.ndarray) -> np.ndarray:
        return (c * (~y_ & (s_ < threshold))).sum(1) / (c * ~y_).sum(1)

    ci = bootstrap_intervals(
        y, s, {"sensitivity": sensitivity, "specificity": specificity}, resamples, [seed, 8]
    )
    both = 0 < y.sum() < len(y)
    return {
        "sensitivity": float((called & y).sum() / y.sum()) if both else math.nan,
        "sensitivity_ci": list(ci["sensitivity"]),
        "specificity": float((~called & ~y).sum() / (~y).sum()) if both else math.nan,
        "specificity_ci": list(ci["specificity"]),
    }


def operating_points(
    y: np.ndarray,
    s: np.ndarray,
    at_specificity: float | None,
    at_sensitivity: float | None,
    resamples: int,
    seed: int,
    validation: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Sensitivity at the given specificity and/or specificity at the given sensitivity, with CIs.

    ``validation`` (labels, logits): the threshold is chosen there and the test's sensitivity and
    specificity at it are reported (out of sample); without it the threshold is chosen on the
    evaluated data itself (in-sample: optimistic on small sets)."""
    from fedxrisk.stats import bootstrap_intervals

    y = y.astype(bool)
    out: dict[str, Any] = {}
    asks = [("sensitivity", at_specificity, sensitivity_at), ("specificity", at_sensitivity, specificity_at)]
    for kind, target, fn in asks:
        if target is None:
            continue
        if validation is not None:
            vy, vs = validation
            threshold = _threshold(vy.astype(bool), vs, kind, target)
            test = rates_at(y, s, threshold, resamples, seed)
            out[f"{kind}_at"] = {
                "target": target, "chosen_on": "validation", "threshold": threshold,
                "value": test[kind], "ci": test[f"{kind}_ci"],
                "validation_value": float(fn(vy.astype(bool), vs, np.ones((1, len(vy))), target)[0]),
                "achieved": test,  # both rates on the test patients at the validation's threshold
            }  # fmt: skip
            continue
        if not 0 < y.sum() < len(y):
            out[f"{kind}_at"] = {
                "target": target,
                "value": math.nan,
                "ci": [math.nan, math.nan],
                "threshold": math.nan,
            }
            continue
        value = float(fn(y, s, np.ones((1, len(y))), target)[0])
        ci = bootstrap_intervals(
            y, s, {kind: lambda y_, s_, c, t=target, f=fn: f(y_, s_, c, t)}, resamples, [seed, 7]
        )
        out[f"{kind}_at"] = {
            "target": target,
            "chosen_on": "test (in-sample)",
            "value": value,
            "ci": list(ci[kind]),
            "threshold": _threshold(y, s, kind, target),
        }
    return out


# ---- calibration --------------------------------------------------------------------------------


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for logits of ±1000


def brier(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean((p - y) ** 2))


def reliability(y: np.ndarray, p: np.ndarray, bins: int = ECE_BINS) -> tuple[float, list[dict[str, float]]]:
    """ECE and the reliability diagram's bins (count, mean predicted, observed rate) over [0, 1]."""
    index = np.minimum((p * bins).astype(int), bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        member = index == b
        n = int(member.sum())
        if n:
            predicted, observed = float(p[member].mean()), float(y[member].mean())
            ece += n / len(y) * abs(observed - predicted)
            table.append(
                {
                    "low": b / bins,
                    "high": (b + 1) / bins,
                    "n": n,
                    "predicted": predicted,
                    "observed": observed,
                }
            )
    return float(ece), table


def fit_temperature(y: np.ndarray, logits: np.ndarray) -> float:
    """T > 0 minimizing the cross-entropy of σ(logit/T) on (y, logits) (a 1-D convex problem in 1/T)."""
    from scipy.optimize import minimize_scalar

    z = np.clip(logits.astype(np.float64), -1e4, 1e4)

    def nll(inv_t: float) -> float:
        a = inv_t * z
        return float(np.mean(np.logaddexp(0.0, a) - y * a))  # −log σ(a) for y=1, −log(1−σ(a)) for y=0

    best = minimize_scalar(nll, bounds=(1e-4, 1e2), method="bounded", options={"xatol": 1e-10})
    return float(1.0 / best.x)


def calibration_report(
    y: np.ndarray, logits: np.ndarray, validation: tuple[np.ndarray, np.ndarray] | None, algorithm: str
) -> dict[str, Any]:
    """Brier, ECE and the reliability bins of σ(logit) on (y, logits), before and after temperature
    scaling fitted on ``validation`` (labels, logits); ``probabilities`` says whether σ(logit) is one."""
    keep = ~np.isnan(y) & np.isfinite(logits)
    y, z = y[keep].astype(np.float64), logits[keep]
    p = _sigmoid(z)
    ece, table = reliability(y, p)
    out: dict[str, Any] = {
        "probabilities": algorithm in CALIBRATED_ALGORITHMS,
        "meaning": (
            f"{algorithm} trains on binary cross-entropy: σ(logit) estimates the risk"
            if algorithm in CALIBRATED_ALGORITHMS
            else f"{algorithm} optimizes a ranking (AUC-type) objective: σ(logit) orders patients, it is not a risk"
        ),
        "brier": brier(y, p),
        "ece": ece,
        "bins": table,
        "temperature": None,
    }
    if validation is not None:
        vy, vz = validation
        vkeep = ~np.isnan(vy) & np.isfinite(vz)
        if vkeep.any() and 0 < vy[vkeep].sum() < vkeep.sum():
            t = fit_temperature(vy[vkeep], vz[vkeep])
            scaled = _sigmoid(z / t)
            ece_t, table_t = reliability(y, scaled)
            out |= {
                "temperature": t,
                "brier_scaled": brier(y, scaled),
                "ece_scaled": ece_t,
                "bins_scaled": table_t,
            }
    return out


def reliability_png(cal: dict[str, Any]) -> bytes:
    """The reliability diagram: observed rate against mean predicted per bin, before/after scaling."""
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 4.5))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    for key, label in (
        ("bins", "σ(logit)"),
        ("bins_scaled", f"σ(logit / {cal.get('temperature') or 0:.3g})"),
    ):
        if cal.get(key):
            pts = cal[key]
            ece = cal["ece"] if key == "bins" else cal["ece_scaled"]
            ax.plot(
                [b["predicted"] for b in pts],
                [b["observed"] for b in pts],
                marker="o",
                label=f"{label}: ECE {ece:.3f}",
            )
    title = "reliability" + ("" if cal["probabilities"] else " (AUC-trained: not probabilities)")
    ax.set(xlabel="mean predicted", ylabel="observed positive rate", title=title, xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def markdown_lines(result: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for label, ops in (result.get("operating_points") or {}).items():
        for kind, m in ops.items():
            other = "specificity" if kind.startswith("sensitivity") else "sensitivity"
            line = (
                f"- {label}: {kind.removesuffix('_at')} {m['value']:.4f} [{m['ci'][0]:.4f}, {m['ci'][1]:.4f}] at "
                f"{other} ≥ {m['target']:g} (positive when logit ≥ {m['threshold']:.4g}; bootstrap CI)"
            )
            if m.get("chosen_on") == "validation":
                got = m["achieved"][other]
                line = (
                    f"{line[:-1]}; threshold chosen on the validation data, where {other} ≥ {m['target']:g} gave "
                    f"{kind.removesuffix('_at')} {m['validation_value']:.4f}; on the test patients {other} is "
                    f"{got:.4f} [{m['achieved'][other + '_ci'][0]:.4f}, {m['achieved'][other + '_ci'][1]:.4f}])"
                )
            elif m.get("chosen_on"):
                line = f"{line[:-1]}; threshold chosen on these patients: in-sample)"
            lines.append(line)
    if lines:
        lines = ["## Operating points", "", *lines, ""]
    for label, cal in (result.get("calibration") or {}).items():
        lines += [f"## Calibration ({label})", "", f"{cal['meaning']}.", ""]
        lines.append(f"Brier {cal['brier']:.4f}, ECE {cal['ece']:.4f} (10 bins)")
        if cal.get("temperature"):
            lines[-1] += (
                f"; after temperature scaling on the validation data (T = {cal['temperature']:.4g}): "
                f"Brier {cal['brier_scaled']:.4f}, ECE {cal['ece_scaled']:.4f}"
            )
        else:
            lines[-1] += "; no temperature scaling (the run has no validation data: set data.validation)"
        lines[-1] += "."
        lines.append("")
    return lines

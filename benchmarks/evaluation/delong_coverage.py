"""Coverage of fedxrisk's 95% intervals on binormal scores with known true values (docs/cli.md).

Positives score N(μ, 1), negatives N(0, 1): the true AUROC is Φ(μ/√2), the true
normalized partial AUROC at FPR ≤ 0.3 is (1/0.3)∫₀^0.3 Φ(μ − Φ⁻¹(1 − t)) dt and the
true AP (positive share π = m/(m+n)) is ∫₀¹ precision d recall of the population
curve, both by numerical integration. For each setting, ``draws`` seeded samples;
the coverage is the share of intervals holding the true value (Monte Carlo SE
√(c(1−c)/draws)).

    python benchmarks/evaluation/delong_coverage.py                # ≈ 1-2 CPU-minutes
    python benchmarks/evaluation/delong_coverage.py --render-only  # tables from the committed JSON

Writes benchmarks/results/delong_coverage.json and delong_coverage_{delong,bootstrap}.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import integrate
from scipy.stats import norm

from fedxrisk.metrics import average_precision, partial_auroc
from fedxrisk.stats import bootstrap_intervals, delong, weighted_ap, weighted_partial_auroc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.results import RESULTS, measured  # noqa: E402

NAME = "delong_coverage"
FPR = 0.3
DELONG_SETTINGS = [
    (auc, m, n) for auc in (0.6, 0.75, 0.9) for m, n in ((15, 60), (50, 50), (100, 400), (300, 300))
]
BOOT_SETTINGS = [(auc, m, n) for auc in (0.75, 0.9) for m, n in ((50, 50), (100, 400))]


def shift(auc: float) -> float:
    """μ with Φ(μ/√2) = auc."""
    return math.sqrt(2) * norm.ppf(auc)


def true_pauc(mu: float, fpr: float = FPR) -> float:
    return integrate.quad(lambda t: norm.cdf(mu - norm.ppf(1 - t)), 0, fpr)[0] / fpr


def true_ap(mu: float, pi: float) -> float:
    """∫ precision d recall over thresholds c: recall = 1 − Φ(c − μ), FPR = 1 − Φ(c)."""

    def integrand(c: float) -> float:
        tpr, fpr = norm.sf(c - mu), norm.sf(c)
        return pi * tpr / (pi * tpr + (1 - pi) * fpr) * norm.pdf(c - mu)  # d recall = φ(c − μ) dc

    return integrate.quad(integrand, -12 + mu, 12 + mu, limit=200)[0]


def draw(rng: np.random.Generator, mu: float, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    y = np.r_[np.ones(m, bool), np.zeros(n, bool)]
    return y, np.r_[rng.normal(mu, 1, m), rng.normal(0, 1, n)]


def delong_study(draws: int, seed: int) -> list[dict]:
    rows = []
    for i, (auc, m, n) in enumerate(DELONG_SETTINGS):
        rng, mu = np.random.default_rng([seed, i]), shift(auc)
        hits, widths = 0, []
        for _ in range(draws):
            d = delong(*draw(rng, mu, m, n))
            hits += d.low <= auc <= d.high
            widths.append(d.high - d.low)
        rows.append({"auroc": auc, "m": m, "n": n, "draws": draws, "coverage": hits / draws,
                     "mean_width": float(np.mean(widths))})  # fmt: skip
    return rows


def bootstrap_study(draws: int, resamples: int, seed: int) -> list[dict]:
    metrics = {"ap": weighted_ap, "pauc30": lambda y, s, c: weighted_partial_auroc(y, s, c, FPR)}
    rows = []
    for i, (auc, m, n) in enumerate(BOOT_SETTINGS):
        rng, mu = np.random.default_rng([seed, 100 + i]), shift(auc)
        truth = {"ap": true_ap(mu, m / (m + n)), "pauc30": true_pauc(mu)}
        hits = {k: 0 for k in truth}
        estimate = {k: [] for k in truth}
        for r in range(draws):
            y, s = draw(rng, mu, m, n)
            ci = bootstrap_intervals(y, s, metrics, resamples, [seed, i, r])
            estimate["ap"].append(average_precision(y.astype(float), s))
            estimate["pauc30"].append(partial_auroc(y.astype(float), s, FPR))
            for k in truth:
                hits[k] += ci[k][0] <= truth[k] <= ci[k][1]
        for k in truth:
            rows.append({"metric": k, "auroc": auc, "m": m, "n": n, "draws": draws, "resamples": resamples,
                         "true": truth[k], "mean_estimate": float(np.mean(estimate[k])),
                         "coverage": hits[k] / draws})  # fmt: skip
    return rows


def _se(c: float, draws: int) -> str:
    return f"{math.sqrt(c * (1 - c) / draws):.3f}"


def render(results: dict) -> dict[str, str]:
    d = ["| true AUROC | m | n | draws | DeLong 95% coverage | MC SE | mean width |",
         "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results["delong"]:
        d.append(f"| {r['auroc']} | {r['m']} | {r['n']} | {r['draws']} | {r['coverage']:.3f} | "
                 f"{_se(r['coverage'], r['draws'])} | {r['mean_width']:.3f} |")  # fmt: skip
    b = ["| metric | true AUROC | m | n | true value | mean estimate | draws × resamples | 95% coverage | MC SE |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results["bootstrap"]:
        b.append(f"| {r['metric']} | {r['auroc']} | {r['m']} | {r['n']} | {r['true']:.4f} | "
                 f"{r['mean_estimate']:.4f} | {r['draws']} × {r['resamples']} | {r['coverage']:.3f} | "
                 f"{_se(r['coverage'], r['draws'])} |")  # fmt: skip
    return {"delong": "\n".join(d) + "\n", "bootstrap": "\n".join(b) + "\n"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=2000, help="samples per DeLong setting")
    ap.add_argument("--boot-draws", type=int, default=300, help="samples per bootstrap setting")
    ap.add_argument("--resamples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--render-only", action="store_true", help="re-write the .md from the committed JSON")
    args = ap.parse_args()

    def measure() -> dict:
        start = time.perf_counter()
        results = {"seed": args.seed, "delong": delong_study(args.draws, args.seed),
                   "bootstrap": bootstrap_study(args.boot_draws, args.resamples, args.seed)}  # fmt: skip
        results["seconds"] = round(time.perf_counter() - start, 1)
        return results

    results = measured(RESULTS / f"{NAME}.json", measure, args.render_only, indent=2)
    for part, text in render(results).items():
        (RESULTS / f"{NAME}_{part}.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()

"""Binning error of the histogram metrics (federated validation) against the exact metrics.

Six seeded logit distributions (20,000 samples each, see ``SHAPES``): four as trained
models produce them, and two adversarial ones — logits crowded within about half a logit
(as digits early in training) and scores on a coarse grid (ties across classes) — at
256 … 16384 bins over ±16 logits (the default: 4096): the largest measured
|histogram − exact| over ``--seeds`` draws for AUROC, AP and pAUC(FPR ≤ 0.3), the largest
worst-case bound :func:`fedxrisk.stats.histogram_bounds` reported (what every histogram
engine logs as ``val_*_bound``), and how many draws had every exact metric within its bound.

    python benchmarks/evaluation/histogram_error.py                # ≈ 20 s
    python benchmarks/evaluation/histogram_error.py --render-only  # the table from the committed JSON

Writes benchmarks/results/histogram_error.json and histogram_error.md (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fedxrisk.metrics import auroc, average_precision, partial_auroc
from fedxrisk.stats import histogram_ap, histogram_auroc, histogram_bounds, histogram_pauc, score_histogram

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.results import RESULTS, measured  # noqa: E402

NAME = "histogram_error"
BINS = (256, 1024, 4096, 16384)
N = 20_000
SHAPES = {
    "binormal": "10 % positives; N(0, 1) vs N(1.5, 1)",
    "ce_saturated": "5 % positives; negatives N(−9, 3), positives N(1, 4) (CE-trained, beyond ±8)",
    "auc_loss": "20 % positives; N(0, 0.8) vs N(0.9, 0.8) in float32 (narrow, sigmoid-score objectives)",
    "rare": "1 % positives; Student t₃ vs t₃ + 2 (heavy tails)",
    "crowded": "20 % positives; N(0, 0.08) vs N(0.06, 0.08): all logits within about ±0.3",
    "ties": "10 % positives; N(0, 1) vs N(1, 1) rounded to 0.25 (few distinct scores, ties across classes)",
}


def draw(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    share = {
        "binormal": 0.1,
        "ce_saturated": 0.05,
        "auc_loss": 0.2,
        "rare": 0.01,
        "crowded": 0.2,
        "ties": 0.1,
    }
    y = rng.random(N) < share[kind]
    if kind == "binormal":
        s = rng.normal(0, 1, N) + 1.5 * y
    elif kind == "ce_saturated":
        s = np.where(y, rng.normal(1, 4, N), rng.normal(-9, 3, N))
    elif kind == "auc_loss":
        s = (rng.normal(0, 0.8, N) + 0.9 * y).astype(np.float32).astype(np.float64)
    elif kind == "rare":
        s = rng.standard_t(3, N) + 2 * y
    elif kind == "crowded":
        s = rng.normal(0, 0.08, N) + 0.06 * y
    else:
        s = np.round((rng.normal(0, 1, N) + 1.0 * y) * 4) / 4
    return y, s


def study(seeds: int) -> list[dict]:
    rows = []
    for kind in SHAPES:
        for bins in BINS:
            err = {"auroc": 0.0, "ap": 0.0, "pauc": 0.0}
            bound = dict(err)
            held = 0
            for seed in range(seeds):
                y, s = draw(kind, np.random.default_rng([seed, BINS.index(bins), list(SHAPES).index(kind)]))
                counts, yf = score_histogram(s, y, bins=bins), y.astype(float)
                exact = {
                    "auroc": auroc(yf, s),
                    "ap": average_precision(yf, s),
                    "pauc": partial_auroc(yf, s, 0.3),
                }
                got = {"auroc": histogram_auroc(counts), "ap": histogram_ap(counts),
                       "pauc": histogram_pauc(counts, 0.3)}  # fmt: skip
                b = histogram_bounds(counts, 0.3)
                held += all(abs(got[k] - exact[k]) <= b[k] + 1e-12 for k in err)
                for k in err:
                    err[k] = max(err[k], abs(got[k] - exact[k]))
                    bound[k] = max(bound[k], b[k])
            rows.append(
                {"shape": kind, "bins": bins, "seeds": seeds, "error": err, "bound": bound, "within": held}
            )
    return rows


def render(rows: list[dict]) -> str:
    out = [
        f"{N:,} samples per draw, {rows[0]['seeds']} draws per row; bins over ±16 logits; "
        "largest |histogram − exact| (measured), largest stated bound, and the draws whose exact "
        "AUROC, AP and pAUC₀.₃ all lay within their bounds.",
        "",
        "| scores | bins | AUROC error | AUROC bound | AP error | AP bound | pAUC₀.₃ error | pAUC₀.₃ bound "
        "| within |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        e, b = r["error"], r["bound"]
        out.append(
            f"| {r['shape']} | {r['bins']} | {e['auroc']:.1e} | {b['auroc']:.1e} | {e['ap']:.1e} | {b['ap']:.1e} | "
            f"{e['pauc']:.1e} | {b['pauc']:.1e} | {r['within']}/{r['seeds']} |"
        )
    out += ["", "Scores: " + "; ".join(f"**{k}** {v}" for k, v in SHAPES.items()) + ".", ""]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--render-only", action="store_true", help="only re-render the table from the JSON")
    args = p.parse_args()
    path = RESULTS / f"{NAME}.json"
    rows = measured(path, lambda: study(args.seeds), args.render_only)
    (RESULTS / f"{NAME}.md").write_text(render(rows))
    print(render(rows))


if __name__ == "__main__":
    main()

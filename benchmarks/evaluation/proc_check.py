"""fedxrisk's paired DeLong test against R's pROC ``roc.test(r1, r2, method = "delong", paired = TRUE)``.

Twelve seeded random test sets with ties (within and across classes, two correlated
models), plus pROC's own worked example (aSAH: s100b vs wfns, the example of
roc.test's help page). Each case is written to a CSV, pROC reads it through
``Rscript`` (``direction = "<"`` fixed, so pROC does not flip a curve), and z, the
p-value, the AUROC difference and its 95 % interval are compared with
:func:`fedxrisk.stats.delong_paired`.

    python benchmarks/evaluation/proc_check.py                # needs Rscript with pROC (Debian: r-cran-proc)
    python benchmarks/evaluation/proc_check.py --render-only  # the table from the committed JSON

Writes benchmarks/results/proc_check.json and proc_check.md (shown in docs/benchmarks.md).
Without Rscript it says so and only re-renders the committed JSON.
The test suite does not need R: tests/test_stats_paired.py checks the same function
against the definition and against pROC's published aSAH numbers.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from fedxrisk.stats import delong_paired

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.results import RESULTS, measured  # noqa: E402

NAME = "proc_check"
CASES = 12

R_SCRIPT = r"""
suppressMessages(library(pROC))
args <- commandArgs(trailingOnly = TRUE)
cat(as.character(packageVersion("pROC")), "\n", sep = "")
for (path in args) {
  d <- read.csv(path)
  r1 <- roc(d$y, d$s1, levels = c(0, 1), direction = "<", quiet = TRUE)
  r2 <- roc(d$y, d$s2, levels = c(0, 1), direction = "<", quiet = TRUE)
  t <- roc.test(r1, r2, method = "delong", paired = TRUE)
  v <- c(unname(t$statistic), t$p.value, unname(t$estimate), t$conf.int[1], t$conf.int[2])
  cat(sprintf("%.17g", v), sep = " ")
  cat("\n")
}
"""


def case(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A test set of 20–400 samples, 10–60 % positives, integer-valued scores (many ties)."""
    rng = np.random.default_rng([2026, seed])
    n = int(rng.integers(20, 400))
    y = rng.random(n) < rng.uniform(0.1, 0.6)
    y[:2], y[2:4] = True, False
    levels = int(rng.integers(4, 30))
    s1 = rng.integers(0, levels, n) + np.round(y * rng.uniform(0.5, 4))
    s2 = np.round(rng.uniform(0.2, 1.0) * s1 + rng.normal(0, rng.uniform(0.5, 3), n))
    return y, s1.astype(float), s2.astype(float)


ASAH_SCRIPT = r"""
suppressMessages(library(pROC))
data(aSAH)
d <- data.frame(y = as.integer(aSAH$outcome == "Poor"), s1 = aSAH$s100b, s2 = as.numeric(as.character(aSAH$wfns)))
write.csv(d, commandArgs(trailingOnly = TRUE)[1], row.names = FALSE)
"""


def asah(rscript: str, tmp: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """pROC's own aSAH data (poor outcome; s100b, wfns), read from the installed package."""
    (tmp / "asah.R").write_text(ASAH_SCRIPT)
    subprocess.run([rscript, str(tmp / "asah.R"), str(tmp / "asah.csv")], check=True)
    rows = np.loadtxt(tmp / "asah.csv", delimiter=",", skiprows=1)
    return rows[:, 0].astype(bool), rows[:, 1], rows[:, 2]


def run() -> dict:
    rscript = shutil.which("Rscript")
    assert rscript is not None
    with tempfile.TemporaryDirectory() as tmp:
        cases = {f"random {i}": case(i) for i in range(CASES)} | {
            "aSAH s100b vs wfns": asah(rscript, Path(tmp))
        }
        paths = []
        for i, (y, s1, s2) in enumerate(cases.values()):
            path = Path(tmp) / f"case{i}.csv"
            np.savetxt(path, np.c_[y, s1, s2], delimiter=",", header="y,s1,s2", comments="", fmt="%.17g")
            paths.append(str(path))
        script = Path(tmp) / "check.R"
        script.write_text(R_SCRIPT)
        out = subprocess.run([rscript, str(script), *paths], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    version, rows = lines[0].strip(), []
    for (name, (y, s1, s2)), line in zip(cases.items(), lines[1:]):
        z, p, auc1, auc2, lo, hi = (float(v) for v in line.split())
        ours = delong_paired(y, s1, s2)
        rows.append({
            "case": name, "n": int(len(y)), "positives": int(y.sum()),
            "proc": {"z": z, "p": p, "difference": auc1 - auc2, "low": lo, "high": hi},
            "ours": {"z": ours.z, "p": ours.p_value, "difference": ours.difference, "low": ours.low,
                     "high": ours.high},
        })  # fmt: skip
    return {"proc_version": version, "rows": rows}


def render(result: dict) -> str:
    lines = [
        f'pROC {result["proc_version"]} `roc.test(r1, r2, method = "delong", paired = TRUE)` '
        "against `fedxrisk.stats.delong_paired`; |Δ| = largest absolute difference over z, p, "
        "the AUROC difference and both interval ends.",
        "",
        "| case | n | positives | z (pROC) | z (ours) | p (pROC) | p (ours) | AUROC₁ − AUROC₂ | 95 % CI | max abs Δ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for r in result["rows"]:
        a, b = r["proc"], r["ours"]
        gap = max(abs(a[k] - b[k]) for k in a)
        worst = max(worst, gap)
        lines.append(
            f"| {r['case']} | {r['n']} | {r['positives']} | {a['z']:.6f} | {b['z']:.6f} | {a['p']:.6g} | "
            f"{b['p']:.6g} | {b['difference']:.6f} | [{b['low']:.4f}, {b['high']:.4f}] | {gap:.1e} |"
        )
    lines += ["", f"Largest absolute difference over all cases: {worst:.1e}.", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--render-only", action="store_true", help="only re-render the table from the JSON")
    args = p.parse_args()
    RESULTS.mkdir(exist_ok=True)
    json_path = RESULTS / f"{NAME}.json"
    if not args.render_only and shutil.which("Rscript") is None:
        print("Rscript not found: the committed results are kept (Debian: apt-get install r-cran-proc)")
        args.render_only = True
    result = measured(json_path, run, args.render_only)
    (RESULTS / f"{NAME}.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()

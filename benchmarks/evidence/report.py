"""Tables, figures and paired tests of the evidence study (``benchmarks/evidence/study.py``).

Everything here reads the committed raw results (``evidence_v2.json``) only; nothing trains.
Each row of a regime is compared per seed with two references: CE FedAvg from scratch and
CE → CE (CE continued from its own model with the two-stage rows' extra steps, schedule and
selection rule). The test on the per-seed differences is a two-sided paired t-test; its
p-values are Holm-adjusted within a family: one regime, reference, metric and start (the
from-scratch rows, or the two-stage rows),
and the exact sign test is printed next to it (it cannot fall below 0.05 with fewer than 6
seeds). A row "beats" a reference only if the Holm-adjusted p < 0.05 and the mean difference
is positive; the verdict lines in the docs are generated from exactly that rule.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks.evidence import study as E

ALPHA = 0.05
METRIC_NAMES = {"auroc": "AUROC", "ap": "AP", "pauc": "pAUC₀.₃"}
REFERENCES = (("ce", False, "CE FedAvg"), ("ce", True, "CE → CE"))
MIN_SEEDS = 3


def label(method: str, two: bool) -> str:
    if not two:
        return E.LABELS[method]
    return "CE → " + {"ce": "CE", "ce_ca": "class-aware CE"}.get(method, E.LABELS[method])


def rows(regime: str) -> list[tuple[str, bool]]:
    """The regime's rows in table order: from scratch, then two-stage (CE → CE first)."""
    return E.variants(regime)


def metrics_of_row(method: str) -> list[str]:
    """AUROC for every row, plus the row's own target when it is another metric."""
    own = E.METHODS[method][3]
    return ["auroc"] if own == "auroc" else ["auroc", own]


def _finite(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def paired(runs: list[dict], ref_runs: list[dict], metric: str) -> dict[str, Any] | None:
    """Per-seed differences run − reference on the seeds both have; t-test and sign test."""
    from scipy import stats

    ref = {r["seed"]: r["test"][metric] for r in ref_runs if _finite(r["test"][metric])}
    pairs = sorted((r["seed"], r["test"][metric] - ref[r["seed"]]) for r in runs
                   if r["seed"] in ref and _finite(r["test"][metric]))  # fmt: skip
    if not pairs:
        return None
    d = np.array([x for _, x in pairs])
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    if len(d) < 2 or np.all(d == d[0]):
        p = 1.0 if np.all(d == 0) else math.nan
    else:
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    sign = float(stats.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0
    return {"seeds": [s for s, _ in pairs], "diffs": d.tolist(), "mean": float(d.mean()), "p": p,
            "sign_p": sign, "wins": wins, "losses": losses}  # fmt: skip


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment (NaN stays NaN and is not counted)."""
    idx = [i for i, p in enumerate(ps) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: ps[i])
    out, running = list(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * ps[i]))
        out[i] = running
    return out


def comparisons(results: dict[str, Any], regime: str) -> list[dict[str, Any]]:
    """Every (row, metric, reference) comparison of a regime, with Holm-adjusted p and verdict."""
    out = []
    for ref_method, ref_two, ref_label in REFERENCES:
        ref_runs = E.final_runs(results, regime, ref_method, ref_two)
        family = []
        for method, two in rows(regime):
            if (method, two) == (ref_method, ref_two):
                continue
            runs = E.final_runs(results, regime, method, two)
            for metric in metrics_of_row(method):
                stat = paired(runs, ref_runs, metric) if runs and ref_runs else None
                if stat is not None:
                    family.append({"regime": regime, "method": method, "two": two, "metric": metric,
                                   "reference": ref_label, **stat})  # fmt: skip
        for metric in METRIC_NAMES:  # one family per start (scratch / two-stage) and metric
            for two in (False, True):
                fam = [c for c in family if c["metric"] == metric and c["two"] == two]
                for c, adj in zip(fam, holm([c["p"] for c in fam])):
                    c["p_holm"] = adj
                    c["verdict"] = verdict(c)
        out += family
    return out


def verdict(c: dict[str, Any]) -> str:
    if len(c["diffs"]) < MIN_SEEDS:
        return f"fewer than {MIN_SEEDS} seeds"
    if not math.isnan(c["p_holm"]) and c["p_holm"] < ALPHA:
        return "better" if c["mean"] > 0 else "worse"
    return "no difference shown"


def _p(p: float) -> str:
    return "–" if math.isnan(p) else f"{p:.2g}" if p >= 0.001 else "<0.001"


def _diffs(c: dict[str, Any]) -> str:
    return f"{c['mean']:+.4f} (" + ", ".join(f"{x:+.3f}" for x in c["diffs"]) + ")"


def _ms(values: list[float]) -> str:
    v = [x for x in values if _finite(x)]
    if not v:
        return "–"
    return f"{np.mean(v):.4f} ± {np.std(v):.4f}" if len(v) > 1 else f"{v[0]:.4f}"


def regimes_with_data(results: dict[str, Any]) -> list[str]:
    return [r for r in E.REGIMES if E.final_runs(results, r, "ce", False)]


def results_table(results: dict[str, Any]) -> str:
    """Per regime and row: selected lr, local steps, test metrics over seeds."""
    lines = ["| regime | row | lr | local steps | test AUROC | test AP | test pAUC₀.₃ | seeds |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for regime in E.REGIMES:
        for method, two in rows(regime):
            runs = E.final_runs(results, regime, method, two)
            if not runs:
                continue
            steps = runs[0]["steps"] + (E.REGIMES[regime]["rounds"] * E.LOCAL_STEPS if two else 0)
            cols = [_ms([r["test"][m] for r in runs]) for m in ("auroc", "ap", "pauc")]
            seeds = ",".join(str(r["seed"]) for r in runs)
            lines.append(f"| {regime} | {label(method, two)} | {runs[0]['lr']:g} | {steps:,} | "
                         + " | ".join(cols) + f" | {seeds} |")  # fmt: skip
    head = ("Test metrics at the learning rate selected on validation (seed 0), mean ± std over the "
            "seeds listed. Local steps count both stages of a two-stage row (CE's, then its own). "
            "pAUC₀.₃ = normalized partial AUROC at FPR ≤ 0.3.\n\n")  # fmt: skip
    return head + "\n".join(lines) + "\n"


def paired_table(results: dict[str, Any]) -> str:
    lines = ["| regime | row | metric | reference | Δ mean (per seed) | t-test p | Holm p | sign test p (+/−) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for regime in regimes_with_data(results):
        for c in comparisons(results, regime):
            lines.append(
                f"| {regime} | {label(c['method'], c['two'])} | {METRIC_NAMES[c['metric']]} | {c['reference']} "
                f"| {_diffs(c)} | {_p(c['p'])} | {_p(c['p_holm'])} | {_p(c['sign_p'])} ({c['wins']}/{c['losses']}) "
                f"| {c['verdict']} |"
            )
    head = ("Per-seed paired differences (row − reference, test set, seeds in order) against CE FedAvg "
            "and against CE → CE. t-test: two-sided paired t-test over seeds; Holm: adjusted within "
            f"regime, reference, metric and start (scratch rows / two-stage rows); verdict: better / worse when Holm p < {ALPHA}, else no "
            f"difference shown (fewer than {MIN_SEEDS} seeds: no verdict). The sign test cannot reach "
            "0.05 with fewer than 6 seeds.\n\n")  # fmt: skip
    return head + "\n".join(lines) + "\n"


KEY_ROWS = [("ce", False), ("ce_long", False), ("ce", True), ("codasca_code", True), ("ce_ca", True),
            ("fedxl2", True), ("fcsg_m", True), ("codasca_paper", True)]  # fmt: skip


def summary_table(results: dict[str, Any]) -> str:
    """The README's table: the controls and the two-stage rows on their target metric."""
    lines = ["| regime | row | metric | test (mean ± std) | seeds | vs CE FedAvg | vs CE → CE |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for regime in regimes_with_data(results):
        if regime in E.SANITY:
            continue
        comps = comparisons(results, regime)
        for method, two in KEY_ROWS:
            runs = E.final_runs(results, regime, method, two)
            if not runs:
                continue
            metric = E.METHODS[method][3]
            cells = []
            for ref in ("CE FedAvg", "CE → CE"):
                c = next((c for c in comps if (c["method"], c["two"], c["metric"], c["reference"])
                          == (method, two, metric, ref)), None)  # fmt: skip
                cells.append(
                    "" if c is None else f"{c['mean']:+.4f}, Holm p {_p(c['p_holm'])}: {c['verdict']}"
                )
            test = _ms([r["test"][metric] for r in runs])
            lines.append(f"| {regime} | {label(method, two)} | {METRIC_NAMES[metric]} | {test} | {len(runs)} | "
                         + " | ".join(cells) + " |")  # fmt: skip
    head = ("Test means over the seeds run and the paired verdicts (full table with per-seed "
            "differences: docs/evidence.md). Each row on its own target metric.\n\n")  # fmt: skip
    return head + "\n".join(lines) + "\n"


def verdict_lines(results: dict[str, Any]) -> str:
    """One generated sentence per regime and reference: which rows are better / worse."""
    out = []
    for regime in regimes_with_data(results):
        comps = comparisons(results, regime)
        for ref in ("CE FedAvg", "CE → CE"):  # the controls and two-stage rows, and any other verdict
            mine = [c for c in comps if c["reference"] == ref and
                    ((c["method"], c["two"]) in KEY_ROWS or c["verdict"] in ("better", "worse"))]  # fmt: skip
            if not mine:
                continue
            parts = []
            for kind in ("better", "worse", "no difference shown"):
                names = [f"{label(c['method'], c['two'])} ({METRIC_NAMES[c['metric']]} {c['mean']:+.4f})"
                         for c in mine if c["verdict"] == kind]  # fmt: skip
                if names:
                    parts.append(f"{kind}: " + "; ".join(names))
            few = [label(c["method"], c["two"]) for c in mine if c["verdict"].startswith("fewer")]
            if few:
                parts.append(f"fewer than {MIN_SEEDS} seeds, no verdict: " + ", ".join(sorted(set(few))))
            out.append(f"- **{regime}, against {ref}** — " + ". ".join(parts) + ".")
    head = (f"Generated from the paired tests (Holm p < {ALPHA}): the controls, the two-stage rows, and "
            "any other row with a verdict. This list is the study's claim, nothing beyond it.\n\n")  # fmt: skip
    return head + "\n".join(out) + "\n"


def selection_table(results: dict[str, Any]) -> str:
    lines = ["| regime | row (target) | lr 1 | lr 2 | lr 3 | edge extension | selected lr |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for regime in E.REGIMES:
        if "select_on" in E.REGIMES[regime]:
            continue
        for method, two in rows(regime):
            runs = [results.get(E.key(regime, method, two, lr, 0)) for lr in E.lr_grid(method)]
            if all(r is None for r in runs):
                continue
            cells = []
            extra = E.extra_lr(results, regime, method, two)
            for lr in [*E.lr_grid(method), extra]:
                r = None if lr is None else results.get(E.key(regime, method, two, lr, 0))
                t = None if r is None else E.target(r)
                cells.append("" if lr is None else "–" if r is None else f"{lr:g}: NaN" if t == -math.inf
                             else f"{lr:g}: {t:.4f}")  # fmt: skip
            sel = E.selected_lr(results, regime, method, two)
            lines.append(f"| {regime} | {label(method, two)} ({METRIC_NAMES[E.METHODS[method][3]]}) | "
                         + " | ".join(cells) + f" | {'–' if sel is None else f'{sel:g}'} |")  # fmt: skip
    head = ("Validation target (seed 0) for each learning rate (lr: value); the test set is not "
            "read. NaN: diverged or refused.\n\n")  # fmt: skip
    return head + "\n".join(lines) + "\n"


def coverage_table(results: dict[str, Any]) -> str:
    """What the plan asked for and what ran: selection runs and final seeds per row."""
    want: dict[tuple[str, str, bool], set[int]] = {}
    for group, two, names, _, seeds in E.PLAN:
        for regime in group:
            for method, t in E.variants(regime):
                if t == two and method in names:
                    want.setdefault((regime, method, two), set()).update(seeds)
    lines = [
        "| regime | row | selection runs (seed 0) | final seeds run | planned seeds |",
        "|---|---|---|---|---|",
    ]
    missing = 0
    for (regime, method, two), seeds in want.items():
        source = E.REGIMES[regime].get("select_on", regime)
        cands = E.candidates(results, source, method, two)
        done = sum(E.key(source, method, two, lr, 0) in results for lr in cands)
        got = sorted(r["seed"] for r in E.final_runs(results, regime, method, two))
        planned = sorted(seeds | {0})
        if done == len(cands) and not set(planned) - set(got):
            continue
        missing += 1
        lines.append(f"| {regime} | {label(method, two)} | {done}/{len(cands)} | "
                     f"{','.join(map(str, got)) or '–'} | {','.join(map(str, planned))} |")  # fmt: skip
    head = (f"The study's plan (`PLAN` in benchmarks/evidence.py, in priority order): {len(want) - missing} "
            f"of {len(want)} rows complete"
            + (", every row ran.\n" if not missing else "; the rows still missing cells, in plan order:\n\n"))  # fmt: skip
    return head + ("\n".join(lines) + "\n" if missing else "")


def render(results: dict[str, Any]) -> list[str]:
    """Write every table (the figures: plots.py); returns the file names written."""
    tables = {
        "evidence.md": results_table(results),
        "evidence_paired.md": paired_table(results),
        "evidence_summary.md": summary_table(results),
        "evidence_verdicts.md": verdict_lines(results),
        "evidence_selection.md": selection_table(results),
        "evidence_coverage.md": coverage_table(results),
    }
    for name, text in tables.items():
        (E.RESULTS / name).write_text(text)
    return list(tables)

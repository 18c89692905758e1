"""Tables, paired tests and figures of the real-data study (benchmarks/real_data/study.py) from its JSON.

Every number of docs/real-data.md and README's "On real data" comes from here:
``python benchmarks/real_data/run.py --render-only`` writes ``benchmarks/results/real_data_*.md``,
``docs/figures/real_data_*.png`` and re-renders the generated regions of the docs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from typing import Any

import numpy as np

from benchmarks.real_data.study import (
    HOSPITALS,
    LABELS,
    LOCAL_STEPS,
    LR_GRIDS,
    METHODS,
    PLAN,
    REGIMES,
    RESULTS,
    ROOT,
    candidates,
    key,
    selected_lr,
    target,
)

FIGURES = ROOT / "docs" / "figures"
RESAMPLES = 1000  # paired bootstrap draws for AP and pAUC
PAIRED_CACHE = RESULTS / "real_data_paired.json"  # pair of score digests → (difference, p) per metric
PAIRED: dict[str, dict[str, Any]] = {}
# FLamby's Fed-Heart-Disease table (Ogier du Terrail et al. 2022): accuracy at 0.5, pooled test, 5 seeds
FLAMBY = {
    "central": 0.795,
    "scratch": 0.748,
    "local0": 0.784,
    "local1": 0.727,
    "local2": 0.483,
    "local3": 0.611,
}
DOCS_GROUPS = {  # results file → regimes it shows
    "heart": ("heart", "heart draw2", "heart mlp"),
    "image": ("breast", "retina rare"),
    "campaign": ("campaign class", "campaign dirichlet"),
}


def row_label(method: str, setting: str) -> str:
    if setting == "two":
        return f"CE → {'CE' if method == 'ce' else LABELS[method]}"
    if setting == "central":
        return f"centralized {'CE' if method == 'ce' else LABELS[method]} (K = 1)"
    if setting.startswith("local"):
        return f"local CE, {HOSPITALS[int(setting[5:])]} only"
    return LABELS[method]


def rows_of(regime: str) -> list[tuple[str, str]]:
    out = []
    for r, setting, methods in PLAN:
        if r == regime:
            out += [(m, setting) for m in methods if (m, setting) not in out]
    order = {"scratch": 0, "two": 1, "central": 2}
    return sorted(out, key=lambda ms: (order.get(ms[1], 3), ms[1]))


def final_runs(results, regime: str, method: str, setting: str) -> list[dict[str, Any]]:
    lr = selected_lr(results, regime, method, setting)
    if lr is None:
        return []
    runs = [results.get(key(regime, method, setting, lr, s)) for s in REGIMES[regime]["seeds"]]
    return [r for r in runs if r is not None]


def scores(record: dict[str, Any]) -> np.ndarray | None:
    if "scores" not in record:
        return None
    return np.frombuffer(base64.b64decode(record["scores"]), dtype=np.float32).astype(np.float64)


def ms(values: list[float], digits: int = 3) -> str:
    v = [x for x in values if x is not None and not math.isnan(x)]
    if not v:
        return "–"
    return f"{np.mean(v):.{digits}f} ± {np.std(v):.{digits}f}" if len(v) > 1 else f"{v[0]:.{digits}f}"


# -- paired comparisons ----------------------------------------------------------------------
def compare(results, regime: str, runs, ref_runs) -> dict[str, Any] | None:
    """Per seed: test differences and the paired tests (DeLong AUROC, bootstrap AP and pAUC)."""
    from fedxrisk.stats import compare_models

    y = np.asarray(results["_labels"][regime])
    ref = {r["seed"]: r for r in ref_runs}
    per_seed = []
    for r in runs:
        other = ref.get(r["seed"])
        if other is None or r["status"] != "ok" or other["status"] != "ok":
            continue
        pair = "~".join([digest(r["scores"]), digest(other["scores"]), str(r["seed"]), str(RESAMPLES)])
        if pair not in PAIRED:  # the bootstrap is slow on the larger test sets: computed once per pair
            c = compare_models(y, scores(r), scores(other), resamples=RESAMPLES, seed=[r["seed"], 21])
            PAIRED[pair] = {m: (c[m]["difference"], c[m]["p_value"]) for m in ("auroc", "ap", "pauc")}
        per_seed.append({m: tuple(v) for m, v in PAIRED[pair].items()})
    return {"seeds": per_seed} if per_seed else None


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def diff_cell(cmp: dict[str, Any], metric: str) -> str:
    d = [s[metric][0] for s in cmp["seeds"]]
    wins = sum(x > 0 for x in d)
    return f"{np.mean(d):+.3f} ± {np.std(d):.3f} ({wins}/{len(d)})"


def seed_p(cmp: dict[str, Any] | None, metric: str) -> str:
    """Paired t-test over seeds of the per-seed differences (two-sided; needs 3 seeds)."""
    from scipy.stats import ttest_1samp

    d = [s[metric][0] for s in cmp["seeds"]] if cmp else []
    if len(d) < 3:
        return "–"
    if np.std(d) == 0:
        return "1" if np.mean(d) == 0 else "0"
    return f"{ttest_1samp(d, 0.0).pvalue:.2g}"


def p_cell(cmp: dict[str, Any], metric: str) -> str:
    """The per-seed p-values; bold when p < 0.05 (a sign shows the direction of such a seed)."""
    parts = []
    for s in cmp["seeds"]:
        d, p = s[metric]
        parts.append(f"**{p:.2f}{'+' if d > 0 else '−'}**" if p < 0.05 else f"{p:.2f}")
    return " ".join(parts)


def comparison_rows(results, regime: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(row label, reference label, comparison) for every row against CE FedAvg and CE → CE."""
    ce = final_runs(results, regime, "ce", "scratch")
    ce_ce = final_runs(results, regime, "ce", "two")
    out = []
    for method, setting in rows_of(regime):
        if (method, setting) == ("ce", "scratch"):
            continue
        runs = final_runs(results, regime, method, setting)
        if not runs:
            continue
        for ref_label, ref_runs in (("CE FedAvg", ce), ("CE → CE", ce_ce)):
            if ref_label == "CE → CE" and (setting != "two" or method == "ce"):
                continue
            cmp = compare(results, regime, runs, ref_runs)
            if cmp is not None:
                out.append((row_label(method, setting), ref_label, cmp))
    return out


# -- tables ----------------------------------------------------------------------------------
def metrics_table(results, regime: str) -> str:
    lines = [
        "| method | lr | test AUROC | test AP | test pAUC₀.₃ | accuracy at 0.5 | seeds | selected round per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, setting in rows_of(regime):
        runs = final_runs(results, regime, method, setting)
        if not runs:
            continue
        ok = [r for r in runs if r["status"] == "ok"]
        cols = [ms([r["test"][m] for r in ok]) for m in ("auroc", "ap", "pauc", "acc")]
        failed = len(runs) - len(ok)
        seeds = f"{len(ok)}" + (f" (+{failed} NaN)" if failed else "")
        rounds = ", ".join("–" if r.get("round") is None else str(r["round"]) for r in runs)
        lines.append(
            f"| {row_label(method, setting)} | {runs[0]['lr']:g} | " + " | ".join(cols) + f" | {seeds} | "
            f"{rounds} of {runs[0]['steps'] // LOCAL_STEPS} |"
        )
    return "\n".join(lines) + "\n"


def paired_table(results, regime: str) -> str:
    rows = comparison_rows(results, regime)
    if not rows:
        return "(no paired comparison yet)\n"
    lines = [
        "| method | against | Δ AUROC | DeLong p per seed | Δ AP | bootstrap p per seed | Δ pAUC₀.₃ | bootstrap p per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, ref, cmp in rows:
        cells = []
        for metric in ("auroc", "ap", "pauc"):
            cells += [diff_cell(cmp, metric), p_cell(cmp, metric)]
        lines.append(f"| {label} | {ref} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def regime_section(results, regime: str) -> str:
    r = REGIMES[regime]
    head = (
        f"**{regime}** ({r['model']}, K = {r['clients']}, partition `{r['partition']}`, "
        f"{r['rounds']} rounds × 8 local steps, batch {r['batch']}; seeds {', '.join(map(str, r['seeds']))})\n\n"
    )
    paired_head = (
        "\nPaired against the reference on the same test set, per seed: Δ = method − reference "
        "(mean ± std over seeds, seeds where the method is higher); p-values two-sided, one per seed "
        "(bold: p < 0.05, + method higher, − lower).\n\n"
    )
    return head + metrics_table(results, regime) + paired_head + paired_table(results, regime)


def flamby_table(results) -> str:
    lines = ["| training | accuracy at 0.5 (ours, linear) | test AUROC (ours) | FLamby's accuracy |",
             "|---|---|---|---|"]  # fmt: skip
    for setting, name in [("central", "pooled (centralized)"), ("scratch", "FedAvg (ours: CE FedAvg)"),
                          *[(f"local{h}", f"local {HOSPITALS[h]}") for h in range(4)]]:  # fmt: skip
        runs = [r for r in final_runs(results, "heart", "ce", setting) if r["status"] == "ok"]
        lines.append(f"| {name} | {ms([r['test']['acc'] for r in runs])} | "
                     f"{ms([r['test']['auroc'] for r in runs])} | {FLAMBY[setting]:.3f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def selection_table(results) -> str:
    lines = [
        "| regime | method | target | lr: validation target / test AUROC (seed 0) | selected |",
        "|---|---|---|---|---|",
    ]
    for regime in REGIMES:
        for method, setting in rows_of(regime):
            cells = []
            for lr in candidates(results, regime, method, setting):
                rec = results.get(key(regime, method, setting, lr, 0))
                if rec is None:
                    cells.append(f"{lr:g}: –")
                else:
                    t = target(rec)
                    bad = "one class" if rec["status"] == "ok" else rec["status"][:7]  # ok but NaN: undefined
                    test = rec["test"]["auroc"]
                    shown = f"{t:.3f}" if t > -math.inf else bad
                    cells.append(f"{lr:g}: {shown}" + ("" if math.isnan(test) else f" / {test:.3f}")
                                 + ("" if rec.get("round") is None else f" (r{rec['round']})"))  # fmt: skip
            if all(c.endswith("–") for c in cells):
                continue
            sel = selected_lr(results, regime, method, setting)
            lines.append(f"| {regime} | {row_label(method, setting)} | {METHODS[method][2]} | "
                         + "; ".join(cells) + f" | {sel if sel is not None else '–'} |")  # fmt: skip
    head = ("Every selection run (seed 0): its validation target, the value the learning rate is chosen on, "
            "and, after the slash, its test AUROC (rN: the round of the model selected on validation, "
            "`selection = \"best\"`; 0 in a two-stage row is the CE model it started from), shown after the fact to expose how much the choice matters "
            "(the test value is never used to choose). nan: the loss diverged; one class: the validation set "
            "holds one class, the target is undefined.\n\n")  # fmt: skip
    return head + "\n".join(lines) + "\n"


def status_table(results) -> str:
    """Which planned rows are complete, so a rendered doc says what is missing."""
    missing, cells, seconds = [], 0, 0.0
    for k, rec in results.items():
        if k.startswith("_"):
            continue
        cells += 1
        seconds += rec.get("seconds", 0.0)
    for regime, setting, methods in PLAN:
        for method in methods:
            n = len(final_runs(results, regime, method, setting))
            want = len(REGIMES[regime]["seeds"])
            if n < want:
                missing.append(f"{regime}: {row_label(method, setting)} ({n}/{want} seeds)")
    sources = [rec["source"] for k, rec in results.items() if not k.startswith("_")]
    digests = sorted({s["files"] for s in sources})
    dirty = any(s["src_dirty"] for s in sources)
    known = json.loads((RESULTS / "real_data_sources.json").read_text()) if digests else {}
    versions: dict[str, set[str]] = {}
    for d in digests:
        for path, sha in known.get(d, {}).items():
            versions.setdefault(path, set()).add(sha)
    clash = sorted(p for p, v in versions.items() if len(v) > 1)
    same = f"differing in {', '.join(clash)}" if clash else "no file differs between them"
    text = (f"{cells} cells, {seconds / 60:.0f} minutes of training (wall clock, 2 shared cores); "
            f"fedxrisk source digest(s) {', '.join(digests) or '–'} ({same}; real_data_sources.json)"
            f"{'; some with uncommitted src/ changes' if dirty else ''}. ")  # fmt: skip
    text += ("All planned rows are complete.\n" if not missing else
             "Not run yet (the study was cut here; rows below are missing or have fewer seeds): "
             + "; ".join(missing) + ".\n")  # fmt: skip
    return text


def summary_table(results) -> str:
    """README: CE FedAvg against each AUC method, from scratch and two-stage, per regime (AUROC)."""
    lines = ["| data | CE FedAvg | method | its AUROC | Δ vs CE (wins) | seeds t p | DeLong p < 0.05 (+/−) "
             "| Δ vs CE → CE | seeds t p |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for regime in REGIMES:
        ce = final_runs(results, regime, "ce", "scratch")
        if not ce:
            continue
        ce_auc = ms([r["test"]["auroc"] for r in ce if r["status"] == "ok"])
        by_row = {(lab, ref): cmp for lab, ref, cmp in comparison_rows(results, regime)}
        for method, setting in rows_of(regime):
            if method == "ce" or setting not in ("scratch", "two"):
                continue
            runs = [r for r in final_runs(results, regime, method, setting) if r["status"] == "ok"]
            label = row_label(method, setting)
            cmp = by_row.get((label, "CE FedAvg"))
            if not runs or cmp is None:
                continue
            sig = [s["auroc"] for s in cmp["seeds"] if s["auroc"][1] < 0.05]
            ctrl = by_row.get((label, "CE → CE"))
            lines.append(f"| {regime} | {ce_auc} | {label} | {ms([r['test']['auroc'] for r in runs])} | "
                         f"{diff_cell(cmp, 'auroc')} | {seed_p(cmp, 'auroc')} | {sum(d > 0 for d, _ in sig)}/"
                         f"{sum(d < 0 for d, _ in sig)} of {len(cmp['seeds'])} | "
                         f"{diff_cell(ctrl, 'auroc') if ctrl else ''} | {seed_p(ctrl, 'auroc') if ctrl else ''} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# -- figures ---------------------------------------------------------------------------------
def plot(results, group: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = [r for r in DOCS_GROUPS[group] if final_runs(results, r, "ce", "scratch")]
    if not regimes:
        return
    FIGURES.mkdir(parents=True, exist_ok=True)
    shown = {r: [ms_ for ms_ in rows_of(r) if final_runs(results, r, *ms_)] for r in regimes}
    heights = [len(shown[r]) + 1 for r in regimes]
    fig, axes = plt.subplots(len(regimes), 2, figsize=(11, 1.0 + 0.32 * sum(heights)), squeeze=False,
                             sharex="col", gridspec_kw={"height_ratios": heights})  # fmt: skip
    for row, regime in zip(axes, regimes):
        labels = []
        for i, (method, setting) in enumerate(shown[regime]):
            runs = [r for r in final_runs(results, regime, method, setting) if r["status"] == "ok"]
            labels.append(row_label(method, setting))
            color = "tab:blue" if method == "ce" else "tab:red"
            for ax, metric in zip(row, ("auroc", "ap")):
                vals = [r["test"][metric] for r in runs]
                if not vals:
                    continue
                ax.plot(vals, [i] * len(vals), "o", color=color, alpha=0.4, ms=4)
                ax.errorbar(np.mean(vals), i, xerr=np.std(vals), fmt="D", color=color, ms=6, capsize=3)
        ce = [r["test"] for r in final_runs(results, regime, "ce", "scratch") if r["status"] == "ok"]
        for ax, metric, title in zip(row, ("auroc", "ap"), ("test AUROC", "test AP")):
            if ce:
                ax.axvline(np.mean([t[metric] for t in ce]), color="tab:blue", ls=":", lw=1)
            ax.set_yticks(range(len(labels)), labels, fontsize=8)
            ax.invert_yaxis()
            ax.set_title(f"{regime}: {title}", fontsize=9)
            ax.grid(alpha=0.3)
        row[1].set_yticklabels([])
    fig.suptitle("dots: seeds; diamond ± bar: mean ± std; dotted: CE FedAvg's mean (blue: CE, red: AUC losses)",
                 fontsize=8)  # fmt: skip
    fig.tight_layout()
    fig.savefig(FIGURES / f"real_data_{group}.png", dpi=100)
    plt.close(fig)


def render(results: dict[str, Any]) -> None:
    from benchmarks import docs

    if not any(not k.startswith("_") for k in results):
        print("real_data: no results yet")
        return
    if PAIRED_CACHE.exists():
        PAIRED.update(json.loads(PAIRED_CACHE.read_text()))
    for group, regimes in DOCS_GROUPS.items():
        text = "\n".join(
            regime_section(results, r) for r in regimes if final_runs(results, r, "ce", "scratch")
        )
        (RESULTS / f"real_data_{group}.md").write_text(text or "(not run yet)\n")
        plot(results, group)
    (RESULTS / "real_data_flamby.md").write_text(flamby_table(results))
    (RESULTS / "real_data_selection.md").write_text(selection_table(results))
    (RESULTS / "real_data_status.md").write_text(status_table(results))
    (RESULTS / "real_data_summary.md").write_text(summary_table(results))
    PAIRED_CACHE.write_text(json.dumps(PAIRED, indent=0, sort_keys=True) + "\n")
    docs.render(ROOT)
    print(f"real_data: rendered {len(results) - 1} cells; lr grids {LR_GRIDS}")

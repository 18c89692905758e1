"""Figures of the evidence study (docs/figures/evidence_*.png) from the committed raw results."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks.evidence import report as R
from benchmarks.evidence import study as E


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(results: dict[str, Any]) -> None:
    E.FIGURES.mkdir(parents=True, exist_ok=True)
    regimes = R.regimes_with_data(results)
    if not regimes:
        return
    metrics_figure(results, regimes)
    paired_figure(results, [r for r in regimes if r not in E.SANITY])
    curve_figure(results, [r for r in E.MAIN if r in regimes])


def metrics_figure(results: dict[str, Any], regimes: list[str]) -> None:
    """Test AUROC / AP / pAUC per row, mean ± std over seeds."""
    plt = _plt()
    allrows = [(m, False) for m in E.METHODS] + [(m, True) for m in E.TWO_STAGE]
    fig, axes = plt.subplots(1, 3, figsize=(15, 1.2 + 1.0 * len(regimes)), sharey=True)
    colors = plt.get_cmap("tab10")
    for ax, metric in zip(axes, ("auroc", "ap", "pauc")):
        for j, regime in enumerate(regimes):
            for i, (method, two) in enumerate(allrows):
                runs = E.final_runs(results, regime, method, two)
                vals = [r["test"][metric] for r in runs if not math.isnan(r["test"][metric])]
                if not vals:
                    continue
                off = (i - len(allrows) / 2) * 0.05
                c = colors(list(E.METHODS).index(method) % 10)
                ax.errorbar(np.mean(vals), j + off, xerr=np.std(vals), fmt="s" if two else "o", color=c,
                            mfc="none" if two else c, ms=5, label=R.label(method, two) if j == 0 else None)  # fmt: skip
        ax.set_yticks(range(len(regimes)), regimes)
        ax.set_title(f"test {R.METRIC_NAMES[metric]}")
        ax.grid(alpha=0.3)
    axes[0].invert_yaxis()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.savefig(E.FIGURES / "evidence_metrics.png", dpi=110)
    plt.close(fig)


def paired_figure(results: dict[str, Any], regimes: list[str]) -> None:
    """Per-seed Δ (row's target metric) against CE FedAvg and against CE → CE, per regime."""
    if not regimes:
        return
    plt = _plt()
    fig, axes = plt.subplots(len(regimes), 2, figsize=(12, 0.6 + 2.8 * len(regimes)), squeeze=False)
    for row_axes, regime in zip(axes, regimes):
        comps = R.comparisons(results, regime)
        for ax, ref in zip(row_axes, ("CE FedAvg", "CE → CE")):
            mine = [c for c in comps if c["reference"] == ref and (c["method"], c["two"]) in R.KEY_ROWS
                    and c["metric"] == E.METHODS[c["method"]][3]]  # fmt: skip
            for y, c in enumerate(mine):
                ax.plot(c["diffs"], [y] * len(c["diffs"]), "o", color="tab:blue", alpha=0.6, ms=4)
                ax.plot([c["mean"]], [y], "|", color="k", ms=14, mew=2)
            ax.axvline(0, color="k", lw=0.8)
            ax.set_yticks(range(len(mine)), [f"{R.label(c['method'], c['two'])} ({R.METRIC_NAMES[c['metric']]})"
                                             for c in mine], fontsize=8)  # fmt: skip
            ax.invert_yaxis()
            ax.set_title(f"{regime}: Δ vs {ref} (dots: seeds, bar: mean)", fontsize=9)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(E.FIGURES / "evidence_paired.png", dpi=110)
    plt.close(fig)


def curve_figure(results: dict[str, Any], regimes: list[str]) -> None:
    """Seed 0 validation AUROC: CE at every lr, CE long, and CE → CE continuing after CE."""
    if not regimes:
        return
    plt = _plt()
    fig, axes = plt.subplots(1, len(regimes), figsize=(5 * len(regimes), 3.4), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        ce_steps = E.REGIMES[regime]["rounds"] * E.LOCAL_STEPS
        for lr in E.lr_grid("ce"):
            r = results.get(E.key(regime, "ce", False, lr, 0))
            if r and r["curve"]:
                c = np.array(r["curve"])
                ax.plot(c[:, 0], c[:, 1], lw=1, label=f"CE lr {lr:g}")
        for method, two, style, shift in (("ce_long", False, "k--", 0), ("ce", True, "r:", ce_steps)):
            lr = E.selected_lr(results, regime, method, two)
            r = None if lr is None else results.get(E.key(regime, method, two, lr, 0))
            if r and r["curve"]:
                c = np.array(r["curve"])
                ax.plot(c[:, 0] + shift, c[:, 1], style, lw=1.5, label=f"{R.label(method, two)} lr {lr:g}")
        ax.set_ylim(bottom=max(0.5, ax.get_ylim()[0]))
        ax.set_title(regime, fontsize=9)
        ax.set_xlabel("local step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation AUROC (seed 0)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(E.FIGURES / "evidence_ce_curve.png", dpi=110)
    plt.close(fig)

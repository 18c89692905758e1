"""The files and tables of ``fedxrisk evaluate``: evaluation.md, evaluation.json, roc.png, pr.png.

Split from :mod:`fedxrisk.evaluation`, which computes the numbers; this module only shows them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedxrisk.evaluation.against import console_table as against_table
from fedxrisk.evaluation.against import markdown_lines as against_lines
from fedxrisk.evaluation.clinic import markdown_lines as clinic_lines
from fedxrisk.evaluation.clinic import reliability_png
from fedxrisk.evaluation.federated import console_table, markdown_lines
from fedxrisk.evaluation.personal import markdown_lines as personal_lines

if TYPE_CHECKING:
    from fedxrisk.evaluation import Scored

PAUC_FPR = 0.3  # the partial AUROC reported: FPR ≤ 0.3
FILES = ("evaluation.json", "evaluation.md", "roc.png", "pr.png")


# ---- output -------------------------------------------------------------------------------------


def _num(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


def _ci(pair: Sequence[float]) -> str:
    lo, hi = pair
    return "" if lo is None or math.isnan(lo) else f"[{lo:.4f}, {hi:.4f}]"


def markdown(result: dict[str, Any]) -> str:
    """evaluation.md: the data, how intervals were computed, one table overall and one per group."""
    boot = result["bootstrap"]
    lines = [
        f"# Evaluation of {result['run']}",
        "",
        f"Data: {result['data']}; {result['samples']} samples. {int(result['level'] * 100)}% intervals: "
        f"AUROC by DeLong's method; AP and pAUC (FPR ≤ {result['pauc_max_fpr']}, normalized) by a stratified "
        f"percentile bootstrap ({boot['resamples']} resamples, seed {boot['seed']}).",
        "",
    ]
    positive = (result.get("positive_class") or {}).get("names")
    if positive:
        lines += [f"Positive class: {', '.join(positive)}.", ""]
    lines += [f"**Warning:** {w}" for w in result.get("warnings", [])] + (
        [""] if result.get("warnings") else []
    )
    header = "| {} | n+ | n− | prevalence | AUROC [95% CI] | AP [95% CI] | pAUC30 [95% CI] |"
    rule = "|---|---:|---:|---:|---|---|---|"

    def row(first: str, m: dict[str, Any]) -> str:
        return (
            f"| {first} | {m['positives']} | {m['negatives']} | {_num(m['prevalence'])} | "
            f"{_num(m['auroc'])} {_ci(m['auroc_ci'])} | "
            f"{_num(m['ap'])} {_ci(m['ap_ci'])} | {_num(m['pauc30'])} {_ci(m['pauc30_ci'])} |"
        )

    lines += [header.format("label"), rule, *(row(k, m) for k, m in result["overall"].items()), ""]
    if result["groups"]:
        lines += [f"## Per {result['group_kind']}{_in_sample(result)}", ""]
        multi = len(result["labels"]) > 1
        lines += [header.format(result["group_kind"] + (" / label" if multi else "")), rule]
        for g, labels in result["groups"].items():
            lines += [row(f"{g} / {k}" if multi else g, m) for k, m in labels.items()]
        lines.append("")
    personal = personal_lines(result)
    return "\n".join(lines + markdown_lines(result) + against_lines(result) + personal + clinic_lines(result))


def _plot(result: dict[str, Any], data: Scored, names: Sequence[str]) -> dict[str, bytes]:
    """roc.png and pr.png (name → PNG bytes): one curve per label on the evaluated data."""
    import io

    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed
    from sklearn.metrics import precision_recall_curve, roc_curve

    from fedxrisk.metrics import _rankable

    images = {}
    subject = plot_subject(result)
    for filename, kind in (("roc.png", "roc"), ("pr.png", "pr")):
        fig = Figure(figsize=(5, 4.5))
        ax = fig.add_subplot()
        for j, name in enumerate(names):
            known = ~np.isnan(data.y[:, j])
            y, s = data.y[known, j], _rankable(data.scores[known, j])
            m = result["overall"][name]
            if s is None or not 0 < y.sum() < len(y):
                continue
            label = "" if len(names) == 1 else f"{name}: "
            if kind == "roc":
                fpr, tpr, _ = roc_curve(y, s)
                ax.plot(fpr, tpr, label=f"{label}AUROC {_num(m['auroc'])} {_ci(m['auroc_ci'])}")
            else:
                precision, recall, _ = precision_recall_curve(y, s)
                line = ax.plot(
                    recall,
                    precision,
                    drawstyle="steps-post",
                    label=f"{label}AP {_num(m['ap'])} {_ci(m['ap_ci'])}",
                )[0]
                ax.axhline(  # a random ranking's precision: AP's baseline
                    m["prevalence"], color=line.get_color(), linestyle=":", linewidth=1,
                    label=f"{label}prevalence {_num(m['prevalence'])} (random ranking)",
                )  # fmt: skip
        if kind == "roc":
            ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
            ax.axvline(
                PAUC_FPR, color="grey", linestyle="--", linewidth=0.8, label=f"FPR {PAUC_FPR} (pAUC30)"
            )
            ax.set(xlabel="false positive rate", ylabel="true positive rate", title=f"ROC — {subject}")
        else:
            ax.set(xlabel="recall", ylabel="precision", title=f"precision-recall — {subject}")
        ax.title.set_fontsize(8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.legend(loc="lower right" if kind == "roc" else "lower left", fontsize=7)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        images[filename] = buffer.getvalue()
    return images


def plot_subject(result: dict[str, Any]) -> str:
    """``run NAME, positive: lesion`` for the plots' titles (the class named when the run records it)."""
    from pathlib import Path

    names = (result.get("positive_class") or {}).get("names") or []
    ids = (result.get("positive_class") or {}).get("ids") or []
    positive = "+".join(map(str, names or ids)) or "label 1"
    return f"run {Path(str(result.get('run', ''))).name}, positive: {positive}"


def write_files(result: dict[str, Any], data: Scored, names: Sequence[str], folder: Path) -> None:
    """The four files, together (all written to temporary names, then renamed) or none of them."""
    import json

    from fedxrisk.outfiles import bytes_writer, make_folder, text_writer, write_together
    from fedxrisk.run.folder import json_safe

    extra = (
        {"reliability.png": reliability_png(next(iter(result["calibration"].values())))}
        if result.get("calibration")
        else {}
    )
    result["files"] = [str(folder / f) for f in (*FILES, *extra)]
    texts = {
        "evaluation.json": json.dumps(json_safe(_tuples_to_lists(result)), indent=2, allow_nan=False) + "\n",
        "evaluation.md": markdown(result),
    }
    files = {folder / name: text_writer(text) for name, text in texts.items()}
    files |= {
        folder / name: bytes_writer(data) for name, data in (_plot(result, data, names) | extra).items()
    }
    make_folder(folder)
    write_together(files, "no evaluation file was written or replaced")


def _tuples_to_lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tuples_to_lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tuples_to_lists(v) for v in value]
    return value


def _in_sample(result: dict[str, Any]) -> str:
    """How the group rows differ from the overall table when they are not its data."""
    if result.get("groups_split") == "train" and result["group_kind"] == "client":
        return ": its TRAINING shard (in-sample, not test data; not comparable with the table above)"
    if result["group_kind"] == "client":
        return ": its own test portion (its site's rows of the test set above)"
    return ": training split" if result.get("groups_split") == "train" else ""


def console_tables(result: dict[str, Any]) -> list[Any]:
    """Rich tables that fit 80 columns: one row per label and metric, then one row per group."""
    from rich import box
    from rich.table import Table

    from fedxrisk.metrics import _nanmean

    overall = Table(title=f"{result['data']}"[:76], box=box.SIMPLE_HEAD)
    for name, justify in (
        ("label", "left"),
        ("metric", "left"),
        ("value", "right"),
        ("95% CI", "left"),
        ("n+/n−", "right"),
    ):
        overall.add_column(name, justify=justify)  # type: ignore[arg-type]
    for label, m in result["overall"].items():
        counts = f"{m['positives']}/{m['negatives']}"
        overall.add_row(label[:18], "AUROC", _num(m["auroc"]), _ci(m["auroc_ci"]) + " DeLong", counts)
        overall.add_row("", f"AP (prev. {m['prevalence']:.3f})", _num(m["ap"]), _ci(m["ap_ci"]), "")
        overall.add_row("", "pAUC30", _num(m["pauc30"]), _ci(m["pauc30_ci"]), "", end_section=True)
    if result.get("positive_class") and result["positive_class"].get("names"):
        overall.caption = f"positive class: {', '.join(result['positive_class']['names'])}"
    tables = [overall]
    if result["groups"]:
        multi = len(result["labels"]) > 1
        kind = result["group_kind"]
        title = f"per {kind}{_in_sample(result)}"
        per = Table(title=title + (", mean over labels" if multi else ""), box=box.SIMPLE_HEAD)
        for name in (result["group_kind"], "n+/n−", "AUROC", "95% CI", "AP", "pAUC30"):
            per.add_column(name, justify="left" if name in (result["group_kind"], "95% CI") else "right")
        for g, labels in result["groups"].items():
            ms = list(labels.values())
            if multi:
                per.add_row(g[:16], "", _num(_nanmean([m["auroc"] for m in ms])), "",
                            _num(_nanmean([m["ap"] for m in ms])), _num(_nanmean([m["pauc30"] for m in ms])))  # fmt: skip
            else:
                m = ms[0]
                per.add_row(g[:16], f"{m['positives']}/{m['negatives']}", _num(m["auroc"]), _ci(m["auroc_ci"]),
                            _num(m["ap"]), _num(m["pauc30"]))  # fmt: skip
        tables.append(per)
    tables += [t for t in (console_table(result), against_table(result)) if t is not None]
    return tables

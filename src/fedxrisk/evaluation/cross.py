"""``fedxrisk cross-site RUN ...``: every model at every site, AUROC [DeLong 95% CI] per cell.

NVFlare's cross-site evaluation matrix, with intervals: rows are models (typically the federated
run and each site's local-only run), columns the sites of the evaluation data plus the pooled
test set. The evaluation data is the first run's test set (rebuilt from its config; its sites are
its clients' own test portions under ``partition = 'source'``, or the reader's ``source`` column),
or ``--dataset``'s split. Every model scores the same raw inputs through its own feature
standardization (:meth:`~fedxrisk.inference.TrainedModel.logits`), so a local run trained on a
table holding one site's rows is scored as it was trained. Make sure no model trained on these
test rows. Writes cross_site.json, cross_site.md and cross_site.png (a heatmap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.data.types import site_name
from fedxrisk.inference import InputError, TrainedModel, load_trained

FILES = ("cross_site.json", "cross_site.md", "cross_site.png")


def _sites_of_run(first: TrainedModel) -> tuple[Any, np.ndarray, list[tuple[str, np.ndarray]]]:
    from fedxrisk.evaluation.data import client_test_portions
    from fedxrisk.run.build import build_data

    try:
        fed, _ = build_data(first.config)
    except ValueError as e:
        raise InputError(f"{first.run_dir}: cannot rebuild the run's data ({e})") from e
    d = fed.data
    portions = client_test_portions(first.config.partition, d, fed.shards)
    if portions is not None:
        return d.x_test, d.y_test.numpy(), [(site_name(d.source_names, site), m) for site, m in portions]
    return (
        d.x_test,
        d.y_test.numpy(),
        _source_groups(d.groups_test.get("source"), first.run_dir, d.source_names),
    )


def _source_groups(source: Any, where: Any, names: Sequence[str] = ()) -> list[tuple[str, np.ndarray]]:
    """(site name, its rows) of every site among the evaluated rows (``site K`` where unnamed)."""
    if source is None:
        raise InputError(f"{where}: the evaluation data has no sites (a 'source' column); nothing to cross")
    source = np.asarray(source)
    return [(site_name(names, v), source == v) for v in np.unique(source)]


def _sites_of_dataset(first: TrainedModel, dataset: str, data_dir: str | None, split: str):
    from fedxrisk.evaluation.data import read_for_model

    d = read_for_model(first, dataset, data_dir)
    x, y = (d.x_test, d.y_test) if split == "test" else (d.x_train, d.y_train)
    groups = (d.groups_test if split == "test" else d.groups_train).get("source")
    return torch.as_tensor(x), np.asarray(y), _source_groups(groups, dataset, d.source_names)


def _raw(first: TrainedModel, x: torch.Tensor) -> torch.Tensor:
    """Inputs in the first run's model space back to raw features (undo its standardization)."""
    if first.standardize is None:
        return x
    mean, std = first.standardize
    return x * torch.from_numpy(std) + torch.from_numpy(mean)


def cell(y: np.ndarray, s: np.ndarray) -> dict[str, float]:
    """AUROC [DeLong CI] of one model at one site (NaN when a class is missing there)."""
    from fedxrisk.stats import delong

    d = delong(y, s)
    return {
        "auroc": d.auroc,
        "low": d.low,
        "high": d.high,
        "positives": int(y.sum()),
        "negatives": int((~y).sum()),
    }


def cross_site(
    runs: Sequence[str | Path], *, dataset: str | None = None, data_dir: str | None = None, split: str = "test",
    out: str | Path, overwrite: bool = False, device: str = "cpu", site_names: Sequence[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The matrix (models × sites + pooled) of AUROC [95% CI]; writes :data:`FILES` into ``out``.

    ``site_names``: shown instead of ``site K``, in the sites' order. Models are named by their run folder."""
    from fedxrisk.outfiles import check_folder, make_folder, same_file

    if len(runs) < 1:
        raise InputError("cross-site needs at least one run")
    if split not in ("test", "train"):  # a reader's validation split is not a site table
        raise InputError(f"--split must be 'test' or 'train', got {split!r}")
    for i, run in enumerate(runs):
        twice = [str(r) for r in runs[:i] if same_file(Path(r), Path(run))]
        if twice:  # its row would replace the first one's: a shorter table, no word
            raise InputError(f"{run} is the run {twice[0]} named again; name each run once")
    folder = Path(out)
    ours = lambda p: (p / "summary.json").exists() or any((p / f).exists() for f in FILES)  # noqa: E731
    check_folder(folder, ours, "fedxrisk run or cross-site output")  # a user's folder is never written into
    taken = [f for f in FILES if (folder / f).exists()]
    if taken and not overwrite:
        raise InputError(
            f"{folder}: already holds {', '.join(taken)}; pass --overwrite to replace, or another --out"
        )
    models = [load_trained(r, device) for r in runs]
    from fedxrisk.evaluation.survival import is_survival_run

    if any(is_survival_run(m) for m in models):
        raise InputError(
            "cross-site tabulates AUROC; a survival run's per-site C-index is `fedxrisk evaluate RUN` "
            "(Harrell's C per site and pooled, patient-bootstrap CIs)"
        )
    first = models[0]
    for m in models[1:]:
        if m.input_shape != first.input_shape or m.num_labels != 1:
            raise InputError(f"{m.run_dir}: inputs {list(m.input_shape)}, {m.num_labels} label(s); the first run "
                             f"takes {list(first.input_shape)} (cross-site compares single-label models on one input)")  # fmt: skip
    if first.num_labels != 1:
        raise InputError(
            f"{first.run_dir}: cross-site compares single-label models; this one has {first.num_labels}"
        )
    if dataset is None:
        x, y, sites = _sites_of_run(first)
    else:
        x, y, sites = _sites_of_dataset(first, dataset, data_dir, split)
    if site_names is not None:
        if len(site_names) != len(sites):
            raise InputError(f"{len(site_names)} site names for {len(sites)} sites")
        sites = [(name, mask) for name, (_, mask) in zip(site_names, sites)]
    raw, y = _raw(first, x), np.asarray(y).reshape(-1).astype(bool)
    names = _unique_names(models)
    matrix: dict[str, dict[str, Any]] = {}
    for name, model in zip(names, models):
        s = model.logits(raw).reshape(-1).astype(np.float64)
        row = {site: cell(y[mask], s[mask]) for site, mask in sites}
        matrix[name] = row | {"pooled": cell(y, s)}
    result = {
        "runs": {n: str(m.run_dir) for n, m in zip(names, models)},
        "data": f"{dataset or first.config.dataset}, {split if dataset else 'the first run'}'s test set",
        "sites": [s for s, _ in sites] + ["pooled"],
        "matrix": matrix,
        "interval": "DeLong 95% (Wald, clipped to [0, 1])",
    }
    make_folder(folder)
    _write(result, folder)
    result["files"] = [str(folder / f) for f in FILES]
    return result


def _unique_names(models: Sequence[TrainedModel]) -> list[str]:
    names = [m.run_dir.name for m in models]
    return [n if names.count(n) == 1 else str(m.run_dir) for n, m in zip(names, models)]


def _text(c: dict[str, float]) -> str:
    if math.isnan(c["auroc"]):
        return "–"
    ci = "" if math.isnan(c["low"]) else f" [{c['low']:.3f}, {c['high']:.3f}]"
    return f"{c['auroc']:.3f}{ci}"


def markdown(result: dict[str, Any]) -> str:
    cols = result["sites"]
    lines = [
        f"AUROC [{result['interval']}] of each model (row) at each site (column); data: {result['data']}.",
        "",
        "| model | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    lines += [
        f"| {name} | " + " | ".join(_text(row[c]) for c in cols) + " |"
        for name, row in result["matrix"].items()
    ]
    return "\n".join(lines) + "\n"


def heatmap_png(result: dict[str, Any]) -> bytes:
    """Rows models, columns sites: AUROC as colour, value and CI written in each cell."""
    import io

    from matplotlib.figure import Figure

    cols, rows = result["sites"], list(result["matrix"])
    values = np.array([[result["matrix"][r][c]["auroc"] for c in cols] for r in rows], dtype=float)
    fig = Figure(figsize=(1.6 + 1.45 * len(cols), 0.9 + 0.6 * len(rows)))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", vmin=0.5, vmax=1.0, aspect="auto")
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            text = _text(result["matrix"][r][c]).replace(" [", "\n[")
            dark = not math.isnan(values[i, j]) and values[i, j] < 0.8
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(cols)), cols, fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title("cross-site AUROC [95% CI]", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _write(result: dict[str, Any], folder: Path) -> None:
    import json

    from fedxrisk.outfiles import bytes_writer, text_writer, write_together
    from fedxrisk.run.folder import json_safe

    files = {
        folder / "cross_site.json": text_writer(
            json.dumps(json_safe(result), indent=2, allow_nan=False) + "\n"
        ),
        folder / "cross_site.md": text_writer(markdown(result)),
        folder / "cross_site.png": bytes_writer(heatmap_png(result)),
    }
    write_together(files, "no cross-site file was written or replaced")

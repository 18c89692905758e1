"""Test AUROC versus rounds and versus bytes communicated, one line per run group.

Runs whose *effective* configs (hyperparameters left at their defaults
filled in) differ only in the seed form one group: one line, the mean over
its distinct seeds with a band of ± one standard deviation; a seed run twice
counts once, and the legend gives n, the seeds per line. Labels name the
algorithm and the settings that differ between groups; the title names what
they share (dataset, imratio, K clients, window I). Lines differ in colour
and, past ten, in line style; the legend sits beside the axes (never over a curve), long labels wrapped. Every
PNG comes with ``curves.csv``, the per-run numbers behind it. Reading runs
never builds or launches anything.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.errors import ConfigError
from fedxrisk.outfiles import (
    bytes_writer,
    check_folder,
    make_folder,
    text_writer,
    write_together,
)
from fedxrisk.run.folder import RunResult, load_run
from fedxrisk.run.spec import RunConfig

# Settings that do not change the numbers (or are the repetition itself).
NOT_COMPARED = ("seed", "checkpoint_every", "tensorboard", "dist_timeout")
SHORT = {"local_steps": "I", "clients": "K"}
CURVE_FIELDS = ("label", "seed", "round", "bytes_per_client", "test_auroc", "test_ap", "run_dir")
PLOTS = ("auroc_vs_rounds.png", "auroc_vs_bytes.png")


def setting(key: str, value: Any) -> str:
    """``local_steps=8`` → ``I=8``; other keys keep their name."""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{SHORT.get(key, key)}={text}"


@dataclass
class Group:
    """Runs of one setting (possibly several seeds), drawn as one line."""

    label: str
    runs: list[RunResult] = field(default_factory=list)

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0].summary["config"]

    def curve(self, metric: str = "test_auroc") -> dict[str, np.ndarray]:
        """Per evaluated round: mean and std over runs of ``metric`` and of bytes per client."""
        by_round: dict[int, list[tuple[float, float]]] = {}
        for run in self.runs:
            for row in run.history:
                nbytes = row["bytes_up_per_client"] + row["bytes_down_per_client"]
                by_round.setdefault(int(row["round"]), []).append((float(row[metric]), float(nbytes)))
        rounds = sorted(by_round)
        vals = [np.array(by_round[r]) for r in rounds]
        return {
            "round": np.array(rounds),
            "mean": np.array([v[:, 0].mean() for v in vals]),
            "std": np.array([v[:, 0].std(ddof=1) if len(v) > 1 else 0.0 for v in vals]),
            "bytes": np.array([v[:, 1].mean() for v in vals]),
            "n": np.array([len(v) for v in vals]),
        }


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders: each path itself if it is one, else every run folder below it."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise ConfigError(f"{path} is not a folder")
        if (path / "history.csv").exists():
            found.append(path)
            continue
        below = sorted(p.parent for p in path.rglob("history.csv"))
        if not below:
            raise ConfigError(f"{path} holds no run (no history.csv in it or below it)")
        found += below
    return found


def _flat(cfg: dict[str, Any]) -> dict[str, Any]:
    """The effective run config: the algorithm's hyperparameters (defaults filled in) and a first
    stage's settings (as ``pretrain.KEY``) as keys of their own, settings missing from an older run's
    config at RunConfig's defaults."""
    alg = ALGORITHMS.get(cfg.get("algorithm"))
    skip = ("options", "lr", "pretrain", "privacy")
    defaults = {k: v for k, v in dataclasses.asdict(RunConfig()).items() if k not in skip}
    hyper = {**(alg.hyperparameters() if alg else {}), **cfg.get("options", {})}
    stage1 = {f"pretrain.{k}": v for k, v in (cfg.get("pretrain") or {}).items()}
    private = {f"privacy.{k}": v for k, v in (cfg.get("privacy") or {}).items() if v is not None}
    return {
        **defaults,
        **{k: v for k, v in cfg.items() if k not in ("options", "pretrain", "privacy")},
        **hyper,
        **stage1,
        **private,  # one key per DP setting: a legend names the ones that differ, never the whole table
    }


def config_key(cfg: dict[str, Any]) -> str:
    """Equal for runs that differ only in the seed (or in settings that do not change the numbers)."""
    return repr(
        sorted(
            (k, repr(list(v) if isinstance(v, tuple) else v))
            for k, v in _flat(cfg).items()
            if k not in NOT_COMPARED
        )
    )


def _default(cfg: dict[str, Any], key: str) -> Any:
    alg = ALGORITHMS.get(cfg.get("algorithm"))
    return alg.hyperparameters().get(key) if alg else None


def variant_labels(configs: Sequence[dict[str, Any]]) -> list[str]:
    """One label per config: the algorithm plus the settings that differ between configs.

    A run setting (or a first stage's) is named when it differs between configs; a hyperparameter when
    it differs between configs of its algorithm, or from its default (a default
    written out explicitly is not named). The seed is left out (runs
    differing only in it form one line), and so is the learning rate when every
    config uses its algorithm's default."""
    flats = [_flat(c) for c in configs]
    keys = [k for k in dict.fromkeys(k for f in flats for k in f) if k not in (*NOT_COMPARED, "algorithm")]
    fields = {f.name for f in dataclasses.fields(RunConfig)} | {
        k for k in keys if k.startswith(("pretrain.", "privacy."))
    }
    differs = {k: len({repr(f.get(k)) for f in flats}) > 1 for k in keys if k in fields}
    if all(f["lr"] == getattr(ALGORITHMS.get(f["algorithm"]), "default_lr", None) for f in flats):
        differs["lr"] = False

    def named(k: str, f: dict[str, Any]) -> bool:
        if k == "lr":  # an algorithm's own default step size is not a setting that differs
            return differs[k] and f[k] not in (
                None,
                getattr(ALGORITHMS.get(f["algorithm"]), "default_lr", None),
            )
        if k in fields:
            return differs[k]
        same_algorithm = {repr(g[k]) for g in flats if g["algorithm"] == f["algorithm"] and k in g}
        return len(same_algorithm) > 1 or repr(f[k]) != repr(_default(f, k))

    return [
        " ".join([f["algorithm"], *(setting(k, f[k]) for k in keys if k in f and named(k, f))]) for f in flats
    ]


def group_runs(runs: Sequence[RunResult]) -> list[Group]:
    """Group runs whose effective configs differ only in the seed, one run per seed (the one with
    the longest history); label groups by what differs between them."""
    by_key: dict[str, dict[Any, RunResult]] = {}
    for run in runs:
        seeds = by_key.setdefault(config_key(run.summary["config"]), {})
        seed = run.summary["config"].get("seed")
        if seed not in seeds or len(run.history) > len(seeds[seed].history):
            seeds[seed] = run
    members = [list(seeds.values()) for seeds in by_key.values()]
    labels = variant_labels([m[0].summary["config"] for m in members])
    return [Group(label, m) for label, m in zip(labels, members, strict=True)]


def title_suffix(groups: Sequence[Group]) -> str:
    """The settings all groups share, e.g. ``digits, imratio=0.1, K=8, I=8 (mean ± std over the n seeds of each line)``."""
    configs = [g.config for g in groups]
    parts = []
    for key in ("dataset", "imratio", "clients", "local_steps"):
        values = {repr(c.get(key)) for c in configs}
        if len(values) == 1:
            value = configs[0].get(key)
            parts.append(str(value) if key == "dataset" else setting(key, value))
    if len({repr(c.get("local_steps")) for c in configs}) > 1:
        parts.append("I: see legend")
    several = max(len(g.runs) for g in groups) > 1
    return ", ".join(parts) + (" (mean ± std over the n seeds of each line)" if several else "")


LINE_STYLES = ("-", "--", ":", "-.")
LEGEND_INSIDE = 5  # more lines than this: the legend goes to the right of the axes


def line_styles(n: int) -> list[dict[str, Any]]:
    """Distinct (colour, line style) for ``n`` lines: the ten tab10 colours, then the next line style."""
    from matplotlib import colormaps

    colours = colormaps["tab10"].colors
    return [
        {"color": colours[i % len(colours)], "linestyle": LINE_STYLES[(i // len(colours)) % len(LINE_STYLES)]}
        for i in range(n)
    ]


def legend_labels(groups: Sequence[Group]) -> list[str]:
    """The group labels, with ``(n=…)`` seeds per line when any line averages several."""
    if max(len(g.runs) for g in groups) == 1:
        return [g.label for g in groups]
    return [f"{g.label} (n={len(g.runs)})" for g in groups]


LEGEND_WRAP = 36  # characters per legend line; longer labels (runs with different settings) wrap


def _wrapped(ax) -> tuple[list, list[str]]:
    """The axes' legend handles and their labels wrapped at :data:`LEGEND_WRAP` characters."""
    import textwrap

    handles, labels = ax.get_legend_handles_labels()
    return handles, ["\n".join(textwrap.wrap(label, LEGEND_WRAP)) or label for label in labels]


def _byte_unit(largest: float) -> tuple[float, str]:
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if largest >= scale:
            return scale, unit
    return 1.0, "bytes"


def plot_groups(
    groups: Sequence[Group], out_dir: str | Path, metric: str = "test_auroc", extra: Mapping[str, str] = {}
) -> list[Path]:
    """Write ``auroc_vs_rounds.png``, ``auroc_vs_bytes.png`` and ``curves.csv`` (and ``extra``: file
    name → text) into ``out_dir``, together: all of them or none."""
    out = Path(out_dir)
    files = {name: bytes_writer(data) for name, data in render_groups(groups, metric).items()}
    files["curves.csv"] = text_writer(curves_text(groups))
    files |= {name: text_writer(text) for name, text in extra.items()}
    make_folder(out)
    return write_together({out / name: w for name, w in files.items()})


def render_groups(groups: Sequence[Group], metric: str = "test_auroc") -> dict[str, bytes]:
    """The two PNGs (file name → bytes) of :func:`plot_groups`."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed
    from matplotlib.ticker import MaxNLocator

    if not groups:
        raise ConfigError("nothing to plot: no runs")
    curves = [g.curve(metric) for g in groups]
    largest = max((float(c["bytes"].max()) for c in curves if len(c["bytes"])), default=0.0)
    scale, unit = _byte_unit(largest)
    suffix = title_suffix(groups)
    name = metric.replace("test_", "test ").replace("auroc", "AUROC").replace("ap", "AP")
    axes = {
        "auroc_vs_rounds.png": ("round", 1.0, "communication rounds"),
        "auroc_vs_bytes.png": ("bytes", scale, f"bytes communicated per client, up + down ({unit})"),
    }
    styles, labels = line_styles(len(groups)), legend_labels(groups)
    outside = len(groups) > LEGEND_INSIDE
    images = {}
    for filename, (xkey, xscale, xlabel) in axes.items():
        longest = max(min(len(label), LEGEND_WRAP) for label in labels)
        fig = Figure(figsize=(7.5 + 0.075 * longest, 4.8 if not outside else 5.4), layout="constrained")
        ax = fig.subplots()
        for c, style, label in zip(curves, styles, labels):
            x = c[xkey] / xscale
            marker = "o" if len(x) <= 30 else None
            ax.plot(x, c["mean"], marker=marker, markersize=3, label=label, **style)
            if (c["n"] > 1).any():
                ax.fill_between(
                    x, c["mean"] - c["std"], c["mean"] + c["std"], color=style["color"], alpha=0.2
                )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{name} (global model, test set)")
        vs = "rounds" if xkey == "round" else "bytes communicated"
        ax.set_title(f"{name[0].upper()}{name[1:]} vs {vs}\n{suffix}", fontsize=11)
        if xkey == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        # beside the axes, never over a curve; placed by the layout, so never cut at the edge
        fig.legend(*_wrapped(ax), loc="outside right upper", fontsize=9)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=120)
        images[filename] = buffer.getvalue()
    return images


def curves_text(groups: Sequence[Group]) -> str:
    """The per-run numbers behind the plots, one row per run and evaluated round."""
    with io.StringIO(newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CURVE_FIELDS)
        writer.writeheader()
        for g in groups:
            for run in g.runs:
                for row in run.history:
                    auroc, ap = row["test_auroc"], row["test_ap"]
                    writer.writerow(
                        {
                            "label": g.label,
                            "seed": run.summary["config"]["seed"],
                            "round": row["round"],
                            "bytes_per_client": row["bytes_up_per_client"] + row["bytes_down_per_client"],
                            "test_auroc": "" if math.isnan(auroc) else auroc,
                            "test_ap": "" if math.isnan(ap) else ap,
                            "run_dir": str(run.out_dir),
                        }
                    )
        return f.getvalue()


def is_plot_folder(folder: Path) -> bool:
    """A folder fedxrisk writes plots into: a run, a comparison, a folder of runs, or earlier plots."""
    marks = ("summary.json", "config.toml", "compare.json")
    if any((folder / name).exists() for name in marks):
        return True
    if any(any((child / name).exists() for name in marks) for child in folder.iterdir() if child.is_dir()):
        return True
    try:
        with open(folder / "curves.csv", newline="") as f:
            return next(csv.reader(f), None) == list(CURVE_FIELDS)
    except (OSError, UnicodeDecodeError, csv.Error):
        return False


def plot_runs(paths: Iterable[str | Path], out_dir: str | Path) -> list[Path]:
    """Re-draw the plots from saved run folders (or folders holding runs, e.g. a compare folder)."""
    out = Path(out_dir)
    check_folder(out, is_plot_folder, "fedxrisk run, comparison or plots")
    sources = find_runs(paths)
    runs = [load_run(p) for p in sources]
    check_one_dataset(runs, sources)
    if any("test_cindex" in run.summary for run in runs):
        raise ConfigError(
            "plot draws test AUROC curves; a survival run's test_cindex per round is in its history.csv "
            "and its C-index with CIs in summary.json (fedxrisk evaluate RUN)"
        )
    return plot_groups(group_runs(runs), out)


def check_one_dataset(runs: Sequence[RunResult], sources: Sequence[Path]) -> None:
    """One line when the runs were tested on different data: their curves share no test set."""
    seen: dict[tuple[Any, Any], Path] = {}
    for run, path in zip(runs, sources):
        config = run.summary["config"]
        seen.setdefault((config.get("dataset"), config.get("data_dir")), path)
    if len(seen) > 1:
        shown = "; ".join(f"{path}: {name} ({where or 'bundled'})" for (name, where), path in seen.items())
        raise ConfigError(
            f"the runs were tested on different data ({shown}); their curves are not comparable, "
            "plot each dataset's runs separately"
        )

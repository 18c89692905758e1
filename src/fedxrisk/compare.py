"""``fedxrisk compare``: several algorithms and/or settings on the same partition and seeds.

Every variant (an algorithm, or a value of a varied setting such as the window
I) runs once per seed into ``OUT/<variant>/seed<s>/``. A seed fixes the data
partition, the model initialisation and the sampling streams, so all variants
see the same clients and start from the same model. The table
(``comparison.csv``, ``comparison.md``) gives per variant the mean ± sample
standard deviation over seeds of the final test AUROC, the test AUROC of the selected
model (``summary.json`` ``selected``: the final one unless ``selection = "best"``) and the final
AP, the rounds and the bytes each client sent and received; the plots are
drawn by :mod:`fedxrisk.plots`.

Running the same comparison again into the same folder continues it: finished
runs are read back, killed ones resume from their checkpoint.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.engines import NonFiniteLoss
from fedxrisk.errors import ConfigError
from fedxrisk.outfiles import check_folder, make_folder, replace_atomic
from fedxrisk.plots import Group, plot_groups, variant_labels
from fedxrisk.run.callbacks import ProgressFn as Callback
from fedxrisk.run.configfile import (
    PRETRAIN,
    SECTIONS,
    config_from_sections,
    hyperparameter_types,
    section_keys,
)
from fedxrisk.run.folder import (
    CHECKPOINT,
    RunResult,
    load_checkpoint,
    load_run,
    write_json_atomic,
)
from fedxrisk.run.identity import config_difference, same_config
from fedxrisk.run.names import resolve
from fedxrisk.run.recipes import resume_experiment, run_experiment
from fedxrisk.run.rules import tune_under_privacy
from fedxrisk.run.spec import RunConfig

TABLE_FIELDS = (
    "variant", "algorithm", "seeds", "completed", "rounds", "local_steps",
    "final_test_auroc_mean", "final_test_auroc_std", "selected_test_auroc_mean", "selected_test_auroc_std",
    "final_test_ap_mean", "final_test_ap_std", "bytes_up_per_client", "bytes_down_per_client",
    "wall_seconds_mean",
)  # fmt: skip

# (variant, seed, run index, number of runs) before each run starts.
RunStart = Callable[[str, int, int, int], None]


@dataclass
class Variant:
    label: str
    configs: list[RunConfig]  # one per seed

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", self.label)


@dataclass
class ComparisonResult:
    rows: list[dict[str, Any]]
    groups: list[Group]
    out_dir: Path
    files: list[Path]


def _split_name(name: str) -> tuple[str, str]:
    section, dot, key = name.partition(".")
    sections = [*SECTIONS, PRETRAIN]  # [pretrain]: vary the first stage of a two-stage run
    if not dot or section not in sections:
        raise ConfigError(f"vary {name!r}: expected SECTION.KEY with a section among {', '.join(sections)}")
    return section, key


def build_variants(
    base: Mapping[str, Any],
    algorithms: Sequence[str] | None = None,
    vary: Mapping[str, Sequence[Any]] | None = None,
    seeds: Sequence[int] | None = None,
) -> list[Variant]:
    """Every combination of ``algorithms`` × the values of each varied ``section.key``, per seed.

    ``base`` is a sectioned config (a parsed TOML file). Hyperparameters in its
    ``[algorithm]`` table apply to the compared algorithms that have them; one
    that none of them has is an error. Every config is validated before any run.
    """
    base = {s: dict(t) for s, t in base.items()}
    algorithm_table = base.setdefault("algorithm", {})
    algorithms = list(algorithms or [algorithm_table.get("algorithm", RunConfig.algorithm)])
    algorithms = [resolve(name, ALGORITHMS) for name in algorithms]  # paper spellings → registry keys
    if len(set(algorithms)) < len(algorithms):
        raise ConfigError(f"an algorithm is listed twice: {algorithms}")
    from fedxrisk.catalog import table

    dataset = base.get("data", {}).get("dataset")
    if dataset in table("survival_datasets") or any(ALGORITHMS[a].task == "survival" for a in algorithms):
        raise ConfigError(
            "fedxrisk compare tabulates AUROC; survival runs are not compared by it yet: run each algorithm "
            "with `fedxrisk run` and read its summary.json test_cindex (docs/survival.md)"
        )
    hyper = {name: hyperparameter_types(name) for name in algorithms}
    shared = set(section_keys("algorithm"))
    for key in algorithm_table:
        if key not in shared and not any(key in h for h in hyper.values()):
            raise ConfigError(
                f"algorithm.{key} is a hyperparameter of none of the compared algorithms ({', '.join(algorithms)})"
            )
    dims: list[tuple[str, str, list[Any]]] = [("algorithm", "algorithm", algorithms)]
    for name, values in (vary or {}).items():
        values = list(values)
        if not values:
            raise ConfigError(f"vary {name!r}: give at least one value")
        if name == "algorithm.algorithm":
            raise ConfigError("vary the algorithm with --algorithms")
        dims.append((*_split_name(name), values))
    seeds = list(seeds) if seeds else [base.get("experiment", {}).get("seed", RunConfig.seed)]
    if len(set(seeds)) < len(seeds):
        raise ConfigError(f"a seed is listed twice: {seeds}")
    combos = []
    for values in itertools.product(*(d[2] for d in dims)):
        configs = []
        for seed in seeds:
            doc = {s: dict(t) for s, t in base.items()}
            for (section, key, _), value in zip(dims, values):
                doc.setdefault(section, {})[key] = value
            alg = doc["algorithm"]["algorithm"]
            doc["algorithm"] = {
                k: v for k, v in doc["algorithm"].items() if k in shared or k in hyperparameter_types(alg)
            }
            doc.setdefault("experiment", {})["seed"] = seed
            configs.append(config_from_sections(doc))
        combos.append(configs)
    for cfg in (c for configs in combos for c in configs):  # several private runs: no combined ε
        tune_under_privacy(cfg, "compare", "runs several trainings, each")
    labels = variant_labels([c[0].to_dict() for c in combos])
    variants = [Variant(label, configs) for label, configs in zip(labels, combos)]
    if len({v.slug for v in variants}) < len(variants):
        raise ConfigError(f"two variants have the same settings: {labels}")
    return variants


def _stored_config(out: Path) -> dict[str, Any]:
    """The config of the run in ``out``: its summary's, else its checked ``config.toml``."""
    from fedxrisk.run.configfile import load_config

    summary = out / "summary.json"
    if summary.exists():
        return load_run(out).summary["config"]
    if (out / "config.toml").exists():
        return load_config(out / "config.toml").to_dict()
    return load_checkpoint(out / CHECKPOINT)["config"]


def _run_one(cfg: RunConfig, out: Path, callback: Callback | None) -> RunResult:
    """Run, resume or read back one run of the comparison (same config required)."""
    if (out / "summary.json").exists() or (out / CHECKPOINT).exists() or (out / "config.toml").exists():
        stored = _stored_config(out)
        if not same_config(stored, cfg.to_dict()):
            raise ConfigError(
                f"{out} holds a run with another config ({config_difference(stored, cfg.to_dict())}); "
                "choose another --out"
            )
        done = load_run(out)
        status = done.summary.get("status")
        if status == "failed" or (status == "completed" and (out / "model.pt").exists()):
            return done
        return resume_experiment(out, callback)
    return run_experiment(cfg, out, callback)


def check_compare_out(out: Path, spec: dict[str, Any]) -> None:
    """``out`` is new, empty, or holds this very comparison (the same command, to continue it)."""
    check_folder(out, lambda f: (f / "compare.json").exists(), "fedxrisk comparison")
    if (out / "compare.json").exists():
        try:
            before = json.loads((out / "compare.json").read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{out / 'compare.json'} is unreadable ({e}); choose another --out") from None
        if not same_config(before, spec):
            old = ", ".join(before.get("variants", {})) if isinstance(before, dict) else "?"
            raise ConfigError(
                f"{out} holds another comparison (variants: {old}); rerun its own command to continue it, "
                "or choose another --out"
            )


def run_comparison(
    variants: Sequence[Variant],
    out_dir: str | Path,
    callback: Callback | None = None,
    on_start: RunStart | None = None,
) -> ComparisonResult:
    """Run every variant and seed, then write the table, the plots and their data into ``out_dir``."""
    out = Path(out_dir)
    spec = {"variants": {v.label: [c.to_dict() for c in v.configs] for v in variants}}
    check_compare_out(out, spec)
    make_folder(out)
    write_json_atomic(out / "compare.json", spec)
    total = sum(len(v.configs) for v in variants)
    groups, index = [], 0
    for v in variants:
        group = Group(v.label)
        for cfg in v.configs:
            if on_start:
                on_start(v.label, cfg.seed, index, total)
            index += 1
            run_dir = out / v.slug / f"seed{cfg.seed}"
            try:
                group.runs.append(_run_one(cfg, run_dir, callback))
            except NonFiniteLoss:
                group.runs.append(load_run(run_dir))  # status failed, history up to the failure
        groups.append(group)
    rows = [summarize(g) for g in groups]
    tables = {"comparison.csv": csv_text(rows), "comparison.md": markdown_text(rows)}
    files = plot_groups(groups, out, extra=tables)  # all together: tables, plots, curves.csv
    files = [*files[-2:], *files[:-2]]
    return ComparisonResult(rows, groups, out, files)


def compare_experiments(
    base: Mapping[str, Any] | None = None,
    algorithms: Sequence[str] | None = None,
    vary: Mapping[str, Sequence[Any]] | None = None,
    seeds: Sequence[int] | None = None,
    out_dir: str | Path = "runs/compare",
    callback: Callback | None = None,
) -> ComparisonResult:
    """The Python form of ``fedxrisk compare``: validate every variant, run them, write table and plots."""
    return run_comparison(build_variants(base or {}, algorithms, vary, seeds), out_dir, callback)


def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(arr) == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else math.nan


def summarize(group: Group) -> dict[str, Any]:
    """One table row: mean and sample std over the group's completed runs."""
    done = [r.summary for r in group.runs if r.summary.get("status") == "completed"]
    first = group.runs[0].summary
    cfg = first["config"]
    row: dict[str, Any] = {
        "variant": group.label,
        "algorithm": cfg["algorithm"],
        "seeds": len(group.runs),
        "completed": len(done),
        "rounds": cfg["rounds"],
        "local_steps": cfg["local_steps"],
    }
    for name, pick in (
        ("final_test_auroc", lambda s: s["final"]["test_auroc"]),
        ("selected_test_auroc", lambda s: (s.get("selected") or s["final"])["test_auroc"]),
        ("final_test_ap", lambda s: s["final"]["test_ap"]),
    ):
        row[f"{name}_mean"], row[f"{name}_std"] = _mean_std([pick(s) for s in done])
    comm = [s["communication"] for s in done]
    row["bytes_up_per_client"] = int(np.mean([c["bytes_up_per_client"] for c in comm])) if comm else None
    row["bytes_down_per_client"] = int(np.mean([c["bytes_down_per_client"] for c in comm])) if comm else None
    row["wall_seconds_mean"] = round(float(np.mean([s["wall_seconds"] for s in done])), 3) if done else None
    return row


def _cell(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    with io.StringIO(newline="") as f:
        writer = csv.DictWriter(f, fieldnames=TABLE_FIELDS)
        writer.writeheader()
        writer.writerows({k: _cell(row[k]) for k in TABLE_FIELDS} for row in rows)
        return f.getvalue()


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    replace_atomic(path, lambda f: f.write(csv_text(rows)))
    return path


def pm(mean: float, std: float) -> str:
    """``0.9123 ± 0.0040``; ``—`` for a missing value, no ± for one seed."""
    if math.isnan(mean):
        return "—"
    return f"{mean:.4f}" if math.isnan(std) else f"{mean:.4f} ± {std:.4f}"


def megabytes(row: dict[str, Any]) -> str:
    if row["bytes_up_per_client"] is None:
        return "—"
    return f"{(row['bytes_up_per_client'] + row['bytes_down_per_client']) / 1e6:.3f}"


DISPLAY = (
    ("variant", lambda r: r["variant"]),
    ("final test AUROC", lambda r: pm(r["final_test_auroc_mean"], r["final_test_auroc_std"])),
    ("selected test AUROC", lambda r: pm(r["selected_test_auroc_mean"], r["selected_test_auroc_std"])),
    ("final test AP", lambda r: pm(r["final_test_ap_mean"], r["final_test_ap_std"])),
    ("rounds", lambda r: str(r["rounds"])),
    ("MB per client (up+down)", megabytes),
    ("seeds done", lambda r: f"{r['completed']}/{r['seeds']}"),
)


def display_rows(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Column names and formatted cells, shared by the Markdown file and the terminal table."""
    return [name for name, _ in DISPLAY], [[fmt(r) for _, fmt in DISPLAY] for r in rows]


def write_markdown(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    replace_atomic(path, lambda f: f.write(markdown_text(rows)))
    return path


def markdown_text(rows: Sequence[dict[str, Any]]) -> str:
    header, cells = display_rows(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    note = "mean ± sample standard deviation over seeds; bytes are per client over the whole run"
    return "\n".join(lines) + f"\n\n{note}\n"


def parse_vary(text: str) -> tuple[str, list[Any]]:
    """``algorithm.local_steps=4,8,16`` → ``("algorithm.local_steps", [4, 8, 16])``."""
    from fedxrisk.run.configfile import parse_value

    if "=" not in text:
        raise ConfigError(f"--vary expects SECTION.KEY=V1,V2,..., got {text!r}")
    name, raw = text.split("=", 1)
    parsed = parse_value(f"[{raw}]")
    values = parsed if isinstance(parsed, list) else [parse_value(v) for v in raw.split(",")]
    return name.strip(), values

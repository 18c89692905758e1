"""Default against default on label-skewed real sites (issue 42 item 3): each AUC method exactly as a
user types it against CE FedAvg's default (``localsgdm``).

Every cell is ``fedxrisk run --dataset D --data-dir PATH -a ALG`` plus the split settings only:

- campaign, mammography, donors (ADBench ``.npz`` under ``DATA/adbench/``, /work/shared/data/README.md):
  ``--partition dirichlet -K 16`` (α = 0.5, the CLI's default ``--dirichlet-alpha``);
- heart (UCI Heart Disease, ``DATA/heart-disease/``): ``--dataset heart_disease --partition source -K 4``
  (the four hospitals, FLamby's split);
- ``--allow-missing-class`` everywhere (the run refuses these splits without it and names the flag:
  Dirichlet(0.5) over 16 clients and Switzerland's training split leave clients with one class;
  CE FedAvg accepts them as they are, the flag changes nothing for it) and ``--seed S``.

Everything else is the CLI's default: 100 rounds, I = 8 local steps, batch 32, MLP, 3 stages, no
validation, ``selection = "last"``, each algorithm's default step size (the CODA family's lowered
for the data's positive ratio, as the run says). The config is resolved by the CLI's own code
(``cli.common.resolve``, ``run.configfile.config_from_sections``), then trained in this process by
``run.recipes.run_experiment`` (what ``fedxrisk run`` calls). Two settings that do not change the
trained model are set to save time: ``eval_every = rounds`` (the test set is scored once, at the
end) and no checkpoints. Reported: the final model's test AUROC and AP, ``summary.json``'s
``below_chance`` flag (training AUROC, as no validation exists) and the step size used.

    python benchmarks/provenance.py run defaults_skewed -- \\
        python benchmarks/defaults/defaults_skewed.py --data ../shared/data --seeds 5
    python benchmarks/defaults/defaults_skewed.py --render-only        # the table from the JSON

Resumable: each finished cell is stored in ``benchmarks/results/defaults_skewed.json`` at once; a
rerun skips the cells already there (one process, one cell at a time). Cost, measured: 140 cells
(5 seeds) in 9.5 min CPU, 20.4 min wall on the shared 2-core machine at load 8
(``benchmarks/results/provenance.json``; about 4 s CPU a cell, 6–9 s for LocalSCGDAM and donors).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.study_cells import read_cells, source_fingerprint, write_cells  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "defaults_skewed.json"
TABLE = RESULTS / "defaults_skewed.md"
SOURCES = RESULTS / "defaults_skewed_sources.json"
RUNS = ROOT / "runs" / "defaults_skewed"
DATA = {"root": ROOT.parent / "shared" / "data"}
SKEWED = {"partition": "dirichlet", "clients": 16, "allow_missing_class": True}
DATASETS: dict[str, tuple[str, dict[str, Any]]] = {  # name -> (path under DATA, the split's flags)
    "campaign": ("adbench/5_campaign.npz", {"dataset": "npz", **SKEWED}),
    "mammography": ("adbench/23_mammography.npz", {"dataset": "npz", **SKEWED}),
    "donors": ("adbench/11_donors.npz", {"dataset": "npz", **SKEWED}),
    "heart": ("heart-disease", {"dataset": "heart_disease", "partition": "source", "clients": 4,
                                "allow_missing_class": True}),
}  # fmt: skip
BASELINE = "localsgdm"
METHODS = {  # `fedxrisk list` name -> label
    BASELINE: "CE FedAvg",
    "codaplus": "CODA+",
    "codasca": "CODASCA",
    "localsgdam": "LocalSGDAM",
    "localscgdam": "LocalSCGDAM",
    "fedxl2": "FeDXL2",
    "fcsg_m": "FCSG-M",
}
COMMAND = "python benchmarks/defaults/defaults_skewed.py --data ../shared/data --seeds {seeds}"


def key(dataset: str, algorithm: str, seed: int) -> str:
    return f"{dataset}|{algorithm}|{seed}"


def user_config(dataset: str, algorithm: str, seed: int):
    """The RunConfig ``fedxrisk run`` builds from these flags (its own resolution code)."""
    from fedxrisk.cli.common import resolve
    from fedxrisk.run.configfile import config_from_sections
    from fedxrisk.run.spec import RunConfig

    path, split = DATASETS[dataset]
    flags = {**split, "data_dir": str(DATA["root"] / path), "algorithm": algorithm, "seed": seed}
    flags |= {"eval_every": RunConfig.__dataclass_fields__["rounds"].default, "checkpoint_every": 0}
    return config_from_sections(resolve(None, flags, (), ()))


def run_cell(dataset: str, algorithm: str, seed: int) -> dict[str, Any]:
    from fedxrisk.engines import NonFiniteLoss
    from fedxrisk.run.recipes import run_experiment

    cfg = user_config(dataset, algorithm, seed)
    folder = RUNS / key(dataset, algorithm, seed).replace("|", "__")
    if folder.exists():  # an interrupted cell starts again
        import shutil

        shutil.rmtree(folder)
    start = time.process_time()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            result = run_experiment(cfg, folder)
        except NonFiniteLoss as e:
            return {"status": "nan", "error": str(e), "test_auroc": math.nan, "test_ap": math.nan,
                    "cpu_seconds": round(time.process_time() - start, 1)}  # fmt: skip
    final, summary = result.history[-1], result.summary
    low = summary.get("below_chance")
    return {
        "status": "ok",
        "test_auroc": float(final["test_auroc"]),
        "test_ap": float(final["test_ap"]),
        "train_auroc": float(final.get("client_auroc_mean", math.nan)),
        "below_chance": None if low is None else low["warning"],
        "lr": summary["config"]["lr"],
        "rounds": summary["rounds"],
        "warnings": sorted({str(w.message)[:200] for w in said}),
        "cpu_seconds": round(time.process_time() - start, 1),
    }


def run_study(seeds: int, datasets: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    cells = read_cells(OUT)
    for seed in range(seeds):  # seed by seed: a stopped study still has paired, complete seeds
        for dataset in datasets:
            for algorithm in METHODS:
                k = key(dataset, algorithm, seed)
                if k in cells:
                    continue
                rec = run_cell(dataset, algorithm, seed)
                rec |= {"dataset": dataset, "algorithm": algorithm, "seed": seed,
                        "source": source_fingerprint(SOURCES)}  # fmt: skip
                cells[k] = rec
                write_cells(OUT, cells)
                print(f"{time.strftime('%H:%M:%S')} {dataset:12s} {algorithm:12s} seed={seed} {rec['status']:4s} "
                      f"test AUROC={rec['test_auroc']:.4f} AP={rec['test_ap']:.4f} ({rec['cpu_seconds']:.0f} s CPU)",
                      flush=True)  # fmt: skip


# -- the table -----------------------------------------------------------------------------------
def paired(
    cells: dict[str, Any], dataset: str, algorithm: str, metric: str
) -> list[tuple[int, float, float]]:
    """(seed, the method's value, CE FedAvg's) for each seed both finished (NaN for a NaN run)."""
    out = []
    for rec in cells.values():
        if rec["dataset"] == dataset and rec["algorithm"] == algorithm:
            base = cells.get(key(dataset, BASELINE, rec["seed"]))
            if base is not None:
                out.append((rec["seed"], rec[f"test_{metric}"], base[f"test_{metric}"]))
    return sorted(out)


def wilcoxon(diffs: list[float]) -> float:
    """Two-sided Wilcoxon signed-rank p over the paired differences (NaN when all are zero or < 2)."""
    from scipy.stats import wilcoxon as test

    d = [x for x in diffs if not math.isnan(x)]
    if len(d) < 2 or all(x == 0 for x in d):
        return math.nan
    return float(test(d).pvalue)


def matrix(cells: dict[str, Any], datasets: list[str], metric: str) -> list[str]:
    """One table row per method: the mean test ``metric`` per dataset and, for the AUC methods, the
    mean paired difference to CE FedAvg's default with the seeds where it is higher."""
    lines = []
    for alg, label in METHODS.items():
        row = []
        for d in datasets:
            pairs = paired(cells, d, alg, metric)
            if not pairs:
                row.append("–")
                continue
            mine = [p[1] for p in pairs]
            text = f"{np.nanmean(mine):.4f}" if not all(math.isnan(v) for v in mine) else "NaN"
            nan = sum(math.isnan(v) for v in mine)
            text += f" (NaN {nan})" if nan else ""
            if alg != BASELINE:
                diffs = [a - b for _, a, b in pairs]
                wins = sum(x > 0 for x in diffs)
                delta = f"{np.nanmean(diffs):+.4f}"
                delta = f"**{delta}**" if wins == 0 and all(x < 0 for x in diffs) else delta
                text += f" ({delta}, {wins}/{len(diffs)})"
            if metric == "auroc":
                below = sum(p[1] < 0.5 for p in pairs)
                text += f" ⚠ {below}" if below else ""
            row.append(text)
        lines.append(f"| {label} (`{alg}`) | " + " | ".join(row) + " |")
    return lines


def render(cells: dict[str, Any]) -> str:
    cells = {k: v for k, v in cells.items() if not k.startswith("_")}
    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in cells.values())]
    # complete seeds only (every dataset × method), so that every mean is over the same pairs
    seeds = sorted(s for s in {r["seed"] for r in cells.values()}
                   if all(key(d, a, s) in cells for d in datasets for a in METHODS))  # fmt: skip
    cells = {k: v for k, v in cells.items() if v["seed"] in seeds}
    rounds = sorted({r["rounds"] for r in cells.values() if "rounds" in r})
    cpu = sum(r["cpu_seconds"] for r in cells.values())
    digests = sorted({r["source"]["files"] for r in cells.values()})
    commits = sorted({r["source"]["commit"][:10] for r in cells.values()})
    lines = [
        f"Each method's default as a user types it (`fedxrisk run --dataset D --data-dir PATH -a ALG` + the split: "
        f"K = 16 Dirichlet(0.5) of campaign, mammography, donors; the 4 heart hospitals, `--partition source`; "
        f"`--allow-missing-class`): {'/'.join(map(str, rounds))} rounds, MLP, no validation, the final model. Seeds {', '.join(map(str, seeds))}, "
        f"paired per seed (same split, same initial model). {len(cells)} cells, "
        f"{cpu / 60:.1f} min CPU (one process). `{COMMAND.format(seeds=len(seeds))}`; ran at commit(s) "
        f"{', '.join(commits)}, fedxrisk source digest(s) {', '.join(digests)} (one digest: every cell ran the same src).",
        "",
        "Test AUROC, mean over seeds; for the AUC methods, (Δ vs CE FedAvg's default, seeds higher / seeds). "
        "**bold Δ**: lower on every seed; ⚠ k: k seeds below 0.5 test AUROC.",
        "",
    ]
    header = ["| method | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
    lines += header
    lines += matrix(cells, datasets, "auroc")
    lines += ["", "Test AP (average precision), the same way:", "", *header]
    lines += matrix(cells, datasets, "ap")
    lines += [
        "",
        "Over all datasets × seeds, paired against CE FedAvg's default (two-sided Wilcoxon signed-rank "
        "test over the paired differences, `scipy.stats.wilcoxon`):",
        "",
        "| method | pairs | Δ AUROC (mean) | higher | Wilcoxon p | Δ AP (mean) | higher | Wilcoxon p | below 0.5 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for alg, label in METHODS.items():
        if alg == BASELINE:
            continue
        parts = []
        for metric in ("auroc", "ap"):
            diffs = [a - b for d in datasets for _, a, b in paired(cells, d, alg, metric)]
            p = wilcoxon(diffs)
            parts += [f"{np.nanmean(diffs):+.4f}", f"{sum(x > 0 for x in diffs)}/{len(diffs)}",
                      "–" if math.isnan(p) else f"{p:.2g}"]  # fmt: skip
        n = sum(1 for d in datasets for _ in paired(cells, d, alg, "auroc"))
        below = [f"{r['dataset']} s{r['seed']}" for r in cells.values()
                 if r["algorithm"] == alg and r["test_auroc"] < 0.5]  # fmt: skip
        lines.append(f"| {label} | {n} | " + " | ".join(parts) + f" | {', '.join(below) or 'none'} |")
    flagged = [
        f"{r['dataset']} {r['algorithm']} s{r['seed']}" for r in cells.values() if r.get("below_chance")
    ]
    nans = [f"{r['dataset']} {r['algorithm']} s{r['seed']}" for r in cells.values() if r["status"] != "ok"]
    lines += ["", f"Non-finite runs: {', '.join(nans) or 'none'}. Runs whose summary.json flags `below_chance` "
              f"(training AUROC < 0.5): {', '.join(flagged) or 'none'}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DATA["root"]), help="folder with adbench/ and heart-disease/")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0 … N-1 (default 3)")
    p.add_argument(
        "--datasets", default=",".join(DATASETS), help=f"comma-separated, of: {', '.join(DATASETS)}"
    )
    p.add_argument("--render-only", action="store_true", help="the table from the JSON")
    args = p.parse_args(argv)
    if not args.render_only:
        DATA["root"] = Path(args.data).expanduser().resolve()
        datasets = [d.strip() for d in args.datasets.split(",")]
        unknown = [d for d in datasets if d not in DATASETS]
        if unknown:
            sys.exit(f"defaults_skewed: unknown dataset(s) {unknown}; choose from {list(DATASETS)}")
        missing = [d for d in datasets if not (DATA["root"] / DATASETS[d][0]).exists()]
        if missing:
            sys.exit(
                f"defaults_skewed: --data {DATA['root']}: no file for {missing} (see /work/shared/data/README.md)"
            )
        run_study(args.seeds, datasets)
    TABLE.write_text(render(read_cells(OUT)))
    print(TABLE.read_text())


if __name__ == "__main__":
    main()

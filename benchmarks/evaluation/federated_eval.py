"""docs/evaluation.md: the heart-disease hospitals evaluated where the data lives (issue 32).

Trains, on UCI Heart Disease as its four hospitals (``partition = source``, FLamby's split),
cross-entropy FedAvg (``localsgdm``) and CODASCA, then evaluates them as ``fedxrisk evaluate
RUN_CODASCA --against RUN_CE`` does: per hospital and pooled AUROC [DeLong 95% CI], the pooled
values computed both pooled-exact and federated (the two secure sums), and the paired DeLong test.
Then each hospital's local-only model (CE on that hospital's training rows alone) and both
federated models at every hospital: ``fedxrisk cross-site``, table and heatmap.

Writes ``benchmarks/results/federated_eval.json`` (every number), ``federated_eval.md`` (the
tables docs/evaluation.md shows) and ``docs/figures/federated_eval_cross_site.png``.

    python benchmarks/provenance.py run federated_eval -- python benchmarks/evaluation/federated_eval.py \\
        --data ../shared/data/heart-disease          # about 4 minutes on 2 cores
    python benchmarks/evaluation/federated_eval.py --render-only   # the .md from the JSON
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "benchmarks" / "results" / "federated_eval.json"
FIGURE = ROOT / "docs" / "figures" / "federated_eval_cross_site.png"
HOSPITALS = ("Cleveland", "Hungarian", "Switzerland", "VA")
FED = dict(dataset="heart_disease", partition="source", clients=4, imratio=None, allow_missing_class=True,
           validation=0.2, eval_every=20, checkpoint_every=0, tensorboard=False)  # fmt: skip
ALGORITHMS = {"CE FedAvg": "localsgdm", "CODASCA": "codasca"}


def _write_local_table(folder: Path, x, y) -> None:
    folder.mkdir(parents=True)
    for name, (xs, ys) in (("train", x), ("test", y)):
        with open(folder / f"{name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([*(f"f{i}" for i in range(xs.shape[1])), "label"])
            w.writerows([[*map(float, r), int(t)] for r, t in zip(xs, ys)])


def measure(data: str, rounds: int, local_rounds: int, bootstrap: int) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import fedxrisk
    from fedxrisk.data.readers.heart import read_heart_disease
    from fedxrisk.evaluation.cross import cross_site
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.spec import RunConfig

    out: dict = {
        "data": "UCI Heart Disease, FLamby's split (4 hospitals)",
        "rounds": rounds,
        "bootstrap": bootstrap,
    }
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        for algorithm in ALGORITHMS.values():
            cfg = RunConfig(algorithm=algorithm, data_dir=data, rounds=rounds, **FED)
            run_experiment(cfg, runs / algorithm)
        ev = fedxrisk.evaluate(runs / "codasca", against=runs / "localsgdm", bootstrap=bootstrap,
                               calibration=True, out=runs / "eval")  # fmt: skip
        ce = fedxrisk.evaluate(
            runs / "localsgdm", bootstrap=bootstrap, calibration=True, out=runs / "eval_ce"
        )
        out["codasca"], out["ce"] = ev, ce
        heart = read_heart_disease(data)  # the features every model sees (standardized by the reader)
        source = np.asarray(heart.groups_train["source"])
        locals_ = []
        for k, hospital in enumerate(HOSPITALS):
            rows = source == k
            folder = runs / f"local-{hospital}"
            _write_local_table(
                folder / "data", (heart.x_train[rows], heart.y_train[rows]), (heart.x_test, heart.y_test)
            )
            cfg = RunConfig(algorithm="localsgdm", dataset="tabular", data_dir=str(folder / "data"), partition="iid",
                            clients=1, imratio=None, allow_missing_class=True, rounds=local_rounds, eval_every=20,
                            checkpoint_every=0, tensorboard=False)  # fmt: skip
            run_experiment(cfg, folder / f"local {hospital}")
            locals_.append(folder / f"local {hospital}")
        shown = []
        for algorithm, name in (("localsgdm", "CE FedAvg (federated)"), ("codasca", "CODASCA (federated)")):
            shutil.copytree(runs / algorithm, runs / name)  # the heatmap names a model by its folder
            shown.append(runs / name)
        matrix = cross_site([*shown, *locals_], out=runs / "cross")  # the reader names the hospitals
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(runs / "cross" / "cross_site.png", FIGURE)
        out["cross_site"] = {k: v for k, v in matrix.items() if k not in ("files", "runs")}
    out["commands"] = [
        "fedxrisk evaluate RUN_CODASCA --against RUN_CE --calibration",
        "fedxrisk cross-site RUN_CE RUN_CODASCA 'local Cleveland' 'local Hungarian' 'local Switzerland' "
        "'local VA' --out cross",
    ]
    return out


def _ci(d: dict) -> str:
    a, lo, hi = d.get("auroc"), d.get("low"), d.get("high")
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return "–"
    return f"{a:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None else f"{a:.3f}"


def _p(x: float | None) -> str:
    return "–" if x is None else (f"{x:.1e}" if x < 1e-3 else f"{x:.4f}")


def render(raw: dict) -> None:
    fa, fc = raw["codasca"]["federated"]["labels"]["score"], raw["ce"]["federated"]["labels"]["score"]
    lines = [
        f"Data: {raw['data']}; both models trained {raw['rounds']} rounds (default settings, `partition = "
        '"source"`, 20 % of each hospital\'s training rows held out for validation). AUROC [DeLong 95% CI].',
        "",
        "| hospital | n+/n− | CE FedAvg | CODASCA |",
        "|---|---:|---|---|",
    ]
    for site, s in fa["sites"].items():
        lines.append(f"| {site} | {s['positives']}/{s['negatives']} | {_ci(fc['sites'][site])} | {_ci(s)} |")
    for way in ("exact", "federated"):
        label = (
            "pooled, exact (all scores in one place)"
            if way == "exact"
            else "pooled, federated (two secure sums)"
        )
        lines.append(
            f"| **{label}** | {fa['positives']}/{fa['negatives']} | {_ci(fc[way])} | {_ci(fa[way])} |"
        )
    diff = [f"{f['difference']['auroc']:+.1e} (bound ±{f['federated']['auroc_bound']:.1e})" for f in (fc, fa)]
    lines.append(f"| federated − exact | | {diff[0]} | {diff[1]} |")
    pe, pf = fa["paired"]["exact"], fa["paired"]["federated"]
    lines += [
        "",
        f"Paired DeLong test, CODASCA − CE FedAvg on the same {fa['positives'] + fa['negatives']} patients: "
        f"difference {pe['difference']:+.4f}, p = {_p(pe['p_value'])} pooled exact; "
        f"{pf['difference']:+.4f}, p = {_p(pf['p_value'])} federated (the exact p lies in "
        f"[{_p(pf['p_low'])}, {_p(pf['p_high'])}], the printed binning bracket).",
        "",
    ]
    ag = raw["codasca"]["against"]["labels"]["score"]["ap"]
    lines.append(
        f"AP (paired bootstrap, {raw['bootstrap']} resamples): CODASCA {ag['estimate1']:.4f}, CE FedAvg "
        f"{ag['estimate2']:.4f}, difference {ag['difference']:+.4f} [{ag['low']:+.4f}, {ag['high']:+.4f}], "
        f"p = {_p(ag['p_value'])}."
    )
    for key, name in (("ce", "CE FedAvg"), ("codasca", "CODASCA")):
        cal = raw[key]["calibration"]["score"]
        scaled = (f"; temperature T = {cal['temperature']:.3g} (fitted on validation): Brier {cal['brier_scaled']:.4f}, "
                  f"ECE {cal['ece_scaled']:.4f}") if cal.get("temperature") else ""  # fmt: skip
        lines.append(
            f"Calibration of {name}: Brier {cal['brier']:.4f}, ECE {cal['ece']:.4f}{scaled}. {cal['meaning']}."
        )
    cross = raw["cross_site"]
    cols = cross["sites"]
    heads = cols
    lines += [
        "",
        "Cross-site matrix: each model (row) at each hospital's test rows (column), AUROC [DeLong 95% CI]:",
        "",
        "| model | " + " | ".join(heads) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for model, row in cross["matrix"].items():
        lines.append(f"| {model} | " + " | ".join(_ci(row[c]) for c in cols) + " |")
    RAW.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", default=os.environ.get("FEDXRISK_DATA", "/work/shared/data") + "/heart-disease"
    )
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--local-rounds", type=int, default=50)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    if not args.render_only:
        sys.path.insert(0, str(ROOT / "src"))
        from fedxrisk.run.folder import json_safe

        raw = json_safe(measure(args.data, args.rounds, args.local_rounds, args.bootstrap))
        RAW.write_text(json.dumps(raw, indent=1, allow_nan=False) + "\n")
    render(json.loads(RAW.read_text()))


if __name__ == "__main__":
    main()

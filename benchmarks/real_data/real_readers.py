"""The real-data readers on the public files: what each reads, FLamby's heart-disease preprocessing
reproduced, and a short end-to-end run per reader (the commands docs/data.md shows).

    python benchmarks/real_data/real_readers.py --data ../shared/data            # counts, checks and runs
    python benchmarks/real_data/real_readers.py --data ../shared/data --no-runs  # counts and checks only

``--data`` holds ``heart-disease/``, ``medmnist/`` and ``adbench/`` (see that folder's README).
Writes ``benchmarks/results/real_readers.md`` (a generated region of docs/data.md).

The heart-disease check recomputes FLamby's Fed-Heart-Disease preprocessing (as its
``dataset.py`` describes it: drop columns 10-12 and incomplete rows, one-hot cp and
restecg with ``pandas.get_dummies(drop_first=True)``, a 66/34 split per hospital, seed 43,
stratified when both classes have more than 2 patients) with pandas, independently of
the reader, and compares features, labels and splits.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "real_readers.md"
RUNS = [  # (what, arguments after `fedxrisk run`, with DATA for the data folder)
    ("heart_disease", "--dataset heart_disease --partition source --clients 4 --set data.data_dir=DATA/heart-disease "
     "--model linear --imratio none --allow-missing-class --rounds 20 --lr 0.1"),
    ("medmnist", "--dataset medmnist --set data.data_dir=DATA/medmnist/breastmnist.npz "
     "--set data.positive_classes=[0] --model cnn28 --imratio none --clients 4 --partition iid --rounds 10 --lr 0.1"),
    ("npz (ADBench)", "--dataset npz --set data.data_dir=DATA/adbench/5_campaign.npz --model linear --imratio none "
     "--clients 8 --partition iid --rounds 10 --lr 0.1"),
]  # fmt: skip


def flamby_heart(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, labels and train/test marks as FLamby's preprocessing gives them (pandas)."""
    import pandas as pd
    from sklearn.model_selection import train_test_split

    tables, labels, test = [], [], []
    for name in ("cleveland", "hungarian", "switzerland", "va"):
        frame = pd.read_csv(folder / f"processed.{name}.data", header=None)
        frame = frame.replace("?", np.nan).drop(columns=[10, 11, 12]).dropna()
        ill = (frame[13] > 0).astype(int).to_numpy()
        counts = np.bincount(ill, minlength=2)
        _, held = train_test_split(np.arange(len(ill)), train_size=0.66, test_size=1 - 0.66, random_state=43,
                                   shuffle=True, stratify=ill if (counts > 2).all() else None)  # fmt: skip
        tables.append(frame.drop(columns=[13]))
        labels.append(ill)
        test.append(np.isin(np.arange(len(ill)), held))
    features = pd.get_dummies(pd.concat(tables, ignore_index=True), columns=[2, 6], drop_first=True)
    return features.to_numpy(dtype=np.float64), np.concatenate(labels), np.concatenate(test)


def heart_rows(folder: Path) -> list[str]:
    from sklearn.linear_model import LogisticRegression

    from fedxrisk.data.readers.heart import (
        HOSPITALS,
        encode,
        read_heart_disease,
        read_hospital,
        split_hospital,
    )

    data = read_heart_disease(folder)
    mine, marks, ys = [], [], []
    for h in HOSPITALS:
        table, text = read_hospital(folder / f"processed.{h}.data")
        y = (table[:, -1] > 0).astype(int)
        mine.append(encode(table, text, "flamby"))
        marks.append(np.isin(np.arange(len(y)), split_hospital(y)[1]))
        ys.append(y)
    ref_x, ref_y, ref_test = flamby_heart(folder)
    same = (np.array_equal(np.concatenate(mine), ref_x), np.array_equal(np.concatenate(ys), ref_y),
            np.array_equal(np.concatenate(marks), ref_test))  # fmt: skip
    lines = ["| hospital | patients kept | train (ill) | test (ill) |", "|---|---|---|---|"]
    for s, h in enumerate(HOSPITALS):
        tr, te = data.y_train[data.groups_train["source"] == s], data.y_test[data.groups_test["source"] == s]
        lines.append(f"| {h} | {len(tr) + len(te)} | {len(tr)} ({tr.sum()}) | {len(te)} ({te.sum()}) |")
    lines.append(f"| all | {len(data.y_train) + len(data.y_test)} | {len(data.y_train)} ({data.y_train.sum()}) "
                 f"| {len(data.y_test)} ({data.y_test.sum()}) |")  # fmt: skip
    model = LogisticRegression(max_iter=2000).fit(data.x_train, data.y_train)
    onehot = read_heart_disease(folder, encoding="onehot")
    return [
        *lines,
        "",
        f"Features: {data.x_train.shape[1]} (`encoding='flamby'`, the default), "
        f"{onehot.x_train.shape[1]} (`'onehot'`). FLamby's preprocessing recomputed with pandas: "
        f"features {'equal' if same[0] else 'DIFFERENT'}, labels {'equal' if same[1] else 'DIFFERENT'}, "
        f"train/test split {'equal' if same[2] else 'DIFFERENT'}. Pooled logistic regression (scikit-learn, "
        f"standardized features): test accuracy at 0.5 = {model.score(data.x_test, data.y_test):.3f} "
        "(FLamby's pooled training: 0.795).",
    ]


def other_rows(data_root: Path) -> list[str]:
    from fedxrisk.data.readers import read_medmnist, read_npz

    lines = [
        "| file | reader | train | val | test | input | class shares / positive rate (train) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("breastmnist", "retinamnist"):
        d = read_medmnist(data_root / "medmnist" / f"{name}.npz")
        counts = np.bincount(d.y_train, minlength=d.num_classes) / len(d.y_train)
        rates = ", ".join(f"{c}: {r:.3f}" for c, r in enumerate(counts))
        lines.append(f"| medmnist/{name}.npz | medmnist | {len(d.y_train)} | {len(d.y_val)} | {len(d.y_test)} "
                     f"| {'×'.join(map(str, d.input_shape))} | classes {rates} |")  # fmt: skip
    for name in ("5_campaign", "23_mammography", "11_donors"):
        d = read_npz(data_root / "adbench" / f"{name}.npz")
        lines.append(f"| adbench/{name}.npz | npz (X, y) | {len(d.y_train)} | – | {len(d.y_test)} "
                     f"| {d.input_shape[0]} features | {d.y_train.mean():.3f} |")  # fmt: skip
    return lines


def run_rows(data_root: Path) -> list[str]:
    lines = ["| reader | command | final test AUROC | test AP |", "|---|---|---|---|"]
    for what, args in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            argv = shlex.split(args.replace("DATA", str(data_root))) + ["--out", f"{tmp}/run", "-q"]
            subprocess.run([sys.executable, "-m", "fedxrisk", "run", *argv], check=True, cwd=ROOT)
            final = json.loads(Path(f"{tmp}/run/summary.json").read_text())["final"]
        command = f"fedxrisk run {args.replace('DATA', 'PATH')}"
        lines.append(f"| {what} | `{command}` | {final['test_auroc']:.4f} | {final['test_ap']:.4f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="folder with heart-disease/, medmnist/, adbench/")
    p.add_argument("--no-runs", action="store_true", help="skip the end-to-end runs (keep their old rows)")
    args = p.parse_args()
    root = args.data.resolve()
    old = OUT.read_text().split("\n\n") if OUT.exists() else []
    runs = run_rows(root) if not args.no_runs else (old[-1].splitlines() if old else ["(runs skipped)"])
    text = "\n".join([*heart_rows(root / "heart-disease"), "", *other_rows(root), "", *runs]) + "\n"
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

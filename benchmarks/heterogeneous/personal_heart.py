"""Personalization on the four heart-disease hospitals (issue 33): per-site AUROC of each site's own
model against the global model on the same hospital's test rows.

Rows: CE FedAvg (``localsgdm``) + 20 fine-tuning steps (its global column is CE FedAvg per site),
+ a personal head, Ditto (λ = 0.1, 1); FedBN needs a BatchNorm model (none of the tabular ones).
Defaults of every algorithm, FLamby's hospital split (``partition = source``), the last model.

    python benchmarks/heterogeneous/personal_heart.py --data ../shared/data [--seeds 0 1 2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np

from fedxrisk.experiment import RunConfig, run_experiment

ROWS = {  # the global model of "CE + fine-tune 20" is CE FedAvg's: its "global" column is FedAvg per site
    "CE + fine-tune 20": {"finetune_steps": 20},
    "CE + personal head": {"personal": "head"},
    "Ditto λ=0.1": {"algorithm": "ditto", "options": {"lam": 0.1}},
    "Ditto λ=1": {"algorithm": "ditto", "options": {"lam": 1.0}},
}


def run_row(data: Path, seed: int, settings: dict, folder: Path) -> dict:
    cfg = dict(
        algorithm="localsgdm", dataset="heart_disease", data_dir=str(data / "heart-disease"), imratio=None,
        partition="source", clients=4, model="mlp", batch_size=16, rounds=40, stages=1, eval_every=40,
        seed=seed, tensorboard=False, checkpoint_every=0, engine="vmap",
    )  # fmt: skip
    cfg.update(settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = run_experiment(RunConfig(**cfg), folder).summary
    p = summary["personal"]
    return {"personal": p["personal_auroc_mean"], "global_sites": p["global_site_auroc_mean"],
            "pooled": summary["final"]["test_auroc"], **{f"site_{k}": p[f"site_auroc_{k}"] for k in range(4)}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, settings) in enumerate(ROWS.items()):
            for seed in args.seeds:
                results.setdefault(name, []).append(
                    run_row(args.data, seed, settings, Path(tmp) / f"{i}-{seed}")
                )
    print(f"{'row':22s} {'site mean (own model)':>22s} {'site mean (global)':>19s} {'pooled test':>12s}")
    for name, rows in results.items():
        mean = {k: float(np.mean([r[k] for r in rows])) for k in ("personal", "global_sites", "pooled")}
        print(f"{name:22s} {mean['personal']:22.4f} {mean['global_sites']:19.4f} {mean['pooled']:12.4f}")
    if args.out:
        args.out.write_text(json.dumps({"seeds": args.seeds, "rows": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Utility against ε on real data: test AUROC of CE FedAvg, CODASCA and LocalSCGDAM with client-level DP.

Two studies, ε ∈ {1, 3, 8, ∞} at the run layer's default δ = min(1e-5, 1/(10·N)) (N: training samples;
∞: no clipping, no noise):

- Fed-Heart-Disease (UCI, reader ``heart_disease``, FLamby's encoding), ``partition = source``:
  the 4 hospitals are the K = 4 clients, every client every round; linear model (FLamby's
  logistic regression).
- ADBench campaign (``5_campaign.npz``, 41,188 × 62, 11.3 % positives), K = 32 iid shards,
  Poisson client sampling q = 0.25 (8 clients a round on average); MLP 64-64.

Per (dataset, method, ε): the learning rate and the clipping norm C are selected on validation
with the same grid for every method (``LRS`` × ``CLIPS``; ε = ∞: ``LRS`` only), by the AUROC
on 20 % of every client's training shard held out (``fedxrisk.data.validation.hold_out``;
the ``data.validation`` setting of branch ``select`` did not exist yet), training on the other
80 % with seed 0. The selected setting is then trained on the full training shards with
seeds 0, 1, 2 and evaluated on the test set. σ comes from the run layer's ``[privacy]``
wiring (``fedxrisk.run.privacy.plan_privacy``: ``target_epsilon`` for the planned rounds). The noise
is the reproducible test mode (``reproducible_noise`` = 1000 + seed) so that every cell reproduces:
it has the distribution of the secret default, but these runs are not private releases; nor is the
choice of (lr, C) on validation accounted in ε (a utility study on public data).

Budget (one core): the grid is 2 learning rates × 2 clipping norms, 3 seeds; LocalSCGDAM runs on
heart disease only (cut on campaign for the CPU budget). Writes
``benchmarks/results/privacy_utility_<study>.json`` (after every cell) and ``privacy_utility.md`` (generated region of
docs/privacy.md); ``--render-only`` rebuilds the .md from the .json files; ``--only STUDY`` runs one study.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/privacy/privacy_utility.py ../shared/data
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

OUT = Path("benchmarks/results/privacy_utility.md")  # and privacy_utility_<study>.json per study
EPSILONS = [1.0, 3.0, 8.0, math.inf]
SEEDS = [0, 1, 2]
CLIPS = [0.1, 1.0]
STUDIES = {
    "heart_disease": dict(
        dataset="heart_disease", folder="heart-disease", clients=4, partition="source", model="linear",
        rounds=50, local_steps=8, batch_size=16, sampling_rate=1.0,
        methods=("localsgdm", "codasca", "localscgdam"), lrs=(0.03, 0.3),
    ),
    "campaign": dict(
        dataset="npz", folder="adbench/5_campaign.npz", clients=32, partition="iid", model="mlp",
        rounds=40, local_steps=8, batch_size=32, sampling_rate=0.25,
        methods=("localsgdm", "codasca"), lrs=(0.03, 0.3),
    ),
}  # fmt: skip
SCGDAM_LRS = (0.01, 0.1)  # its α_h·η < 1 (α_h = 9): the same number of learning rates, in its range
NAMES = {"localsgdm": "CE FedAvg", "codasca": "CODASCA", "localscgdam": "LocalSCGDAM"}


def config(study: dict[str, Any], data_root: Path, method: str, lr: float, seed: int, privacy: Any) -> Any:
    from fedxrisk.run.spec import RunConfig

    return RunConfig(
        algorithm=method, dataset=study["dataset"], data_dir=str(data_root / study["folder"]),
        clients=study["clients"], partition=study["partition"], imratio=None, model=study["model"],
        rounds=study["rounds"], local_steps=study["local_steps"], batch_size=study["batch_size"], lr=lr,
        stages=1, seed=seed, engine="vmap", checkpoint_every=0, tensorboard=False, privacy=privacy,
        allow_missing_class=study["clients"] == 4,  # Switzerland's training split holds positives only
    )  # fmt: skip


def privacy(clip: float | None, eps: float, seed: int, study: dict[str, Any]) -> dict[str, Any] | None:
    """The ``[privacy]`` table of one cell: client level, σ for ``eps`` at the default δ; ε = ∞: None."""
    if math.isinf(eps):
        return None
    return {"clip": clip, "target_epsilon": eps, "delta": None, "level": "client",
            "sampling_rate": study["sampling_rate"], "sampling": "poisson",
            "reproducible_noise": 1000 + seed}  # fmt: skip


def train_eval(cfg: Any, data: Any) -> float:
    """Test AUROC of ``cfg`` trained on ``data`` (its test set: the real one, or validation)."""
    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.engines import NonFiniteLoss, Simulation
    from fedxrisk.metrics import evaluate
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem
    from fedxrisk.run.assemble import data_facts
    from fedxrisk.run.privacy import plan_privacy

    model = build_model(cfg.model, data.data.input_shape, cfg.seed)
    problem = Problem(model, data.data.pos_ratio)
    algorithm = ALGORITHMS[cfg.algorithm](problem, **cfg.options)
    schedule = Schedule.build(cfg.rounds, cfg.resolved_local_steps(), cfg.lr, 1)
    batch = min(cfg.batch_size, max(data.shard_sizes))
    algorithm, client_dp, _ = plan_privacy(cfg, algorithm, data_facts(cfg, data), schedule, batch)
    sim = Simulation(algorithm, data, schedule, batch, cfg.seed, "vmap", privacy=client_dp)
    try:
        while not sim.done:
            sim.run_round()
    except NonFiniteLoss:
        return math.nan
    params, buffers = sim.global_model()
    return float(evaluate(problem, params, buffers, data)["test_auroc"])


def run_study(name: str, study: dict[str, Any], data_root: Path) -> list[dict[str, Any]]:
    from fedxrisk.data.validation import hold_out
    from fedxrisk.run.build import build_data
    from fedxrisk.run.privacy import default_delta

    base = config(study, data_root, "localsgdm", 0.1, 0, None)
    full = {seed: build_data(replace(base, seed=seed))[0] for seed in SEEDS}
    n = len(full[0].data.y_train)
    validation = hold_out(full[0], 0)
    rows = []
    for method in study["methods"]:
        for eps in EPSILONS:
            start = time.perf_counter()

            lrs = SCGDAM_LRS if method == "localscgdam" else study["lrs"]
            grid = [(lr, c) for lr in lrs for c in ([None] if math.isinf(eps) else CLIPS)]
            scores = {}
            for lr, clip in grid:
                cfg = config(study, data_root, method, lr, 0, privacy(clip, eps, 0, study))
                scores[(lr, clip)] = train_eval(cfg, validation)
            (lr, clip), val = max(scores.items(), key=lambda kv: -1 if math.isnan(kv[1]) else kv[1])
            tests = [
                train_eval(
                    config(study, data_root, method, lr, seed, privacy(clip, eps, seed, study)), full[seed]
                )
                for seed in SEEDS
            ]
            row = {
                "study": name, "method": method, "epsilon": eps, "delta": default_delta(n), "lr": lr, "clip": clip,
                "validation_auroc": val, "test_auroc": tests,
                "grid": [{"lr": a, "clip": b, "validation_auroc": v} for (a, b), v in scores.items()],
                "seconds": round(time.perf_counter() - start, 1),
            }  # fmt: skip
            print(json.dumps({k: row[k] for k in ("study", "method", "epsilon", "lr", "clip", "test_auroc")}))
            rows.append(row)
            save(name, rows)  # after every cell: a stopped study keeps what it measured
    return rows


def save(name: str, rows: list[dict[str, Any]]) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    path = OUT.with_name(f"privacy_utility_{name}.json")
    path.write_text(json.dumps({"rows": rows, "cpu_seconds": time.process_time()}, indent=1) + "\n")


def load() -> dict[str, Any]:
    """Every study's saved rows (one file per study, so the studies can run in parallel)."""
    parts = [json.loads(p.read_text()) for p in sorted(OUT.parent.glob("privacy_utility_*.json"))]
    return {"rows": [r for p in parts for r in p["rows"]], "seconds": sum(p["cpu_seconds"] for p in parts)}


def _mean_sd(values: list[float]) -> str:
    ok = [v for v in values if not math.isnan(v)]
    if not ok:
        return "failed"
    text = f"{statistics.mean(ok):.3f} ± {statistics.stdev(ok):.3f}" if len(ok) > 1 else f"{ok[0]:.3f}"
    return text + ("" if len(ok) == len(values) else f" ({len(values) - len(ok)} failed)")


def render(results: dict[str, Any]) -> str:
    lines = []
    for name, study in STUDIES.items():
        rows = [r for r in results["rows"] if r["study"] == name]
        if not rows:
            continue
        delta = rows[0]["delta"]
        head = f"**{name}** (K = {study['clients']}, q = {study['sampling_rate']}, {study['rounds']} rounds, δ = {delta:.2g})"
        eps_cols = " | ".join("ε = ∞ (no DP)" if math.isinf(e) else f"ε = {e:g}" for e in EPSILONS)
        lines += [head, "", f"| method | {eps_cols} |", "|---|" + "---:|" * len(EPSILONS)]
        for method in study["methods"]:
            cells = []
            for e in EPSILONS:
                r = next((r for r in rows if r["method"] == method and r["epsilon"] == e), None)
                if r is None:
                    cells.append("—")
                    continue
                setting = f"lr {r['lr']:g}" + (f", C {r['clip']:g}" if r["clip"] is not None else "")
                cells.append(f"{_mean_sd(r['test_auroc'])} ({setting})")
            lines.append(f"| {NAMES[method]} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(
        f"Test AUROC, mean ± sd over seeds {SEEDS}; {results['seconds'] / 60:.1f} CPU minutes in all."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "data_root", nargs="?", default="../shared/data", help="folder holding heart-disease/ and adbench/"
    )
    p.add_argument("--render-only", action="store_true", help="rebuild the .md from the .json")
    p.add_argument("--only", choices=sorted(STUDIES), help="run one study")
    args = p.parse_args()
    if not args.render_only:
        import torch

        torch.set_num_threads(1)
        for name, study in STUDIES.items():
            if args.only in (None, name):
                run_study(name, study, Path(args.data_root))
    text = render(load())
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

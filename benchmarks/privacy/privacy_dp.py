"""Differential privacy per algorithm, the accountant's σ for target ε, and the cost of DP per round.

1. Support: every registered algorithm is built (digits, MLP 64-64) and asked
   :func:`~fedxrisk.engines.privacy.unsupported_reason` (client-level DP) and
   :func:`~fedxrisk.engines.privacy.unsupported_instance_reason` (instance-level DP-SGD),
   and for Flower's SecAgg+ :func:`~fedxrisk.flower.secure.algorithm_refusal` (two rounds
   through a recording collective: every collective must be a ``mean``): the table is what the
   code refuses, not a list kept by hand.
2. σ for a target ε at δ = 1e-5 (RDP accountant of dp-accounting), for the planned rounds.
3. Seconds per round (median of 3 repeats of 5 rounds after one warm-up round) of CE FedAvg
   (localsgdm) and CODASCA on digits, K = 8, I = 4, B = 32, vmap engine: plain, client-level DP
   (C = 1, σ = 1), client-level DP with Poisson q = 0.5, instance-level DP-SGD (C = 1, σ = 1).

Writes ``benchmarks/results/privacy_dp.json`` and ``privacy_dp_support.md``,
``privacy_dp_sigma.md``, ``privacy_dp_cost.md`` (generated regions of docs/privacy.md);
``--render-only`` rebuilds the .md files from the .json.

    PYTHONPATH=src python benchmarks/privacy/privacy_dp.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

OUT = Path("benchmarks/results/privacy_dp.json")
DELTA = 1e-5
PLANS = [  # (label, clients, sampling rate, rounds)
    ("K = 4, every client, 100 rounds", 4, 1.0, 100),
    ("K = 32, Poisson q = 0.25, 200 rounds", 32, 0.25, 200),
    ("K = 100, Poisson q = 0.1, 500 rounds", 100, 0.1, 500),
]
TARGETS = [1.0, 3.0, 8.0]


def support() -> dict[str, Any]:
    from fedxrisk.algorithms import ALGORITHMS
    from fedxrisk.data import make_federated
    from fedxrisk.engines.privacy import unsupported_instance_reason, unsupported_reason
    from fedxrisk.flower.config import Deployment, FlowerConfig
    from fedxrisk.flower.secure import algorithm_refusal
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem
    from fedxrisk.run.spec import RunConfig

    data = make_federated("digits", 2, "iid", 0.3, 0)
    rows = {}
    for name, cls in sorted(ALGORITHMS.items()):
        problem = Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio)
        options = {"positives_per_batch": 4} if cls.positives_per_batch else {}
        algorithm = cls(problem, **options)
        flower = FlowerConfig(RunConfig(algorithm=name, options=options), Deployment(secure_aggregation=True))
        rows[name] = {
            "client": unsupported_reason(algorithm),
            "instance": unsupported_instance_reason(algorithm),
            "secure": algorithm_refusal(flower),
        }
    return rows


def sigmas() -> list[dict[str, Any]]:
    from fedxrisk.engines.privacy import noise_for_epsilon

    out = []
    for label, _k, q, rounds in PLANS:
        row = {"plan": label, "q": q, "rounds": rounds}
        row.update({str(t): noise_for_epsilon(t, rounds, DELTA, q) for t in TARGETS})
        out.append(row)
    return out


def cost() -> list[dict[str, Any]]:
    import torch

    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.data import make_federated
    from fedxrisk.engines import Simulation
    from fedxrisk.engines.privacy import ClientDP, ClientSampling, instance_private
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem

    torch.set_num_threads(1)
    variants = {
        "plain": (None, None),
        "client DP": (ClientDP(1.0, 1.0), None),
        "client DP, q = 0.5": (ClientDP(1.0, 1.0, ClientSampling(0.5)), None),
        "instance DP-SGD": (None, (1.0, 1.0)),
    }
    rows = []
    for alg in ("localsgdm", "codasca"):
        for label, (client, instance) in variants.items():
            data = make_federated("digits", 8, "iid", 0.3, 0)
            problem = Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio)
            algorithm = ALGORITHMS[alg](problem)
            if instance is not None:
                algorithm = instance_private(algorithm, *instance, pos_ratio=0.3)  # the imratio: public
            sim = Simulation(algorithm, data, Schedule.build(16, 4, 0.1), 32, 0, "vmap", privacy=client)
            sim.run_round()  # warm-up
            times = []
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(5):
                    sim.run_round()
                times.append((time.perf_counter() - start) / 5)
            rows.append({"algorithm": alg, "variant": label, "seconds_per_round": statistics.median(times)})
    return rows


def _mark(reason: str | None) -> str:
    return "✓" if reason is None else "✗ " + reason.replace("|", "/")


def _secure_aggregation(reason: str | None, client: str | None) -> str:
    """SecAgg+ on Flower (``secure-aggregation = true``): ✓ when every collective is a mean, and
    whether client-level DP combines with it (the sites clip, the server adds the noise)."""
    if reason is not None:
        return "✗ " + reason.removeprefix("secure-aggregation: ").replace("|", "/")
    if client is None:
        return "✓ every collective is a mean: the server sees sums only; with client-level DP the sites clip"
    return "✓ every collective is a mean (class sums and counts too): the server sees sums only"


def render(results: dict[str, Any]) -> dict[str, str]:
    support_md = [
        "| algorithm | client-level DP | instance-level DP-SGD | secure aggregation (Flower SecAgg+) |",
        "|---|---|---|---|",
    ]
    for name, r in results["support"].items():
        secure = _secure_aggregation(r["secure"], r["client"])
        support_md.append(f"| `{name}` | {_mark(r['client'])} | {_mark(r['instance'])} | {secure} |")
    sigma_md = [f"| plan (δ = {DELTA:g}) | " + " | ".join(f"σ for ε = {t:g}" for t in TARGETS) + " |"]
    sigma_md.append("|---|" + "---:|" * len(TARGETS))
    for row in results["sigma"]:
        sigma_md.append(f"| {row['plan']} | " + " | ".join(f"{row[str(t)]:.3f}" for t in TARGETS) + " |")
    base = {r["algorithm"]: r["seconds_per_round"] for r in results["cost"] if r["variant"] == "plain"}
    cost_md = ["| algorithm | variant | ms per round | × plain |", "|---|---|---:|---:|"]
    for r in results["cost"]:
        s = r["seconds_per_round"]
        cost_md.append(
            f"| `{r['algorithm']}` | {r['variant']} | {1000 * s:.1f} | {s / base[r['algorithm']]:.2f} |"
        )
    return {
        "privacy_dp_support.md": "\n".join(support_md) + "\n",
        "privacy_dp_sigma.md": "\n".join(sigma_md) + "\n",
        "privacy_dp_cost.md": "\n".join(cost_md) + "\n",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--render-only", action="store_true", help="rebuild the .md files from the .json")
    p.add_argument("--support-only", action="store_true", help="recompute the support table only")
    args = p.parse_args()
    if args.support_only:
        results = json.loads(OUT.read_text())
        results["support"] = support()
        OUT.write_text(json.dumps(results, indent=1) + "\n")
    elif not args.render_only:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        results = {"support": support(), "sigma": sigmas(), "cost": cost()}
        OUT.write_text(json.dumps(results, indent=1) + "\n")
    for name, text in render(json.loads(OUT.read_text())).items():
        (OUT.parent / name).write_text(text)
        print(text)


if __name__ == "__main__":
    main()

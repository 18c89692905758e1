"""What leaves a client, per algorithm: generated from the collectives the algorithms really call.

Every registered algorithm runs a tiny federation (digits, MLP 64-64, K = 2,
4 rounds, 2 stages) through a collective that records each call: which named
tensors a client sends up, their shape per client, and the collective
(``mean``: the server sees each client's tensor and returns the average;
``pool``: per-sample records and a validity mask go up, the merged pool of all
clients comes down). A name the table cannot explain fails the script, so the
table cannot go stale silently.

Writes ``benchmarks/results/privacy.json`` and ``privacy.md`` (the table in
docs/privacy.md); ``--render-only`` rebuilds the .md from the .json.

    PYTHONPATH=src python benchmarks/privacy/privacy_table.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

OUT = Path("benchmarks/results/privacy.json")
ROUNDS = 4
# what each name means; (algorithm, name) overrides a name's general meaning
MEANINGS: dict[Any, str] = {
    "w": "model parameters",
    "buffers": "BatchNorm running statistics (`buffer_policy = average`)",
    "m": "momentum buffer (a running mean of the client's gradients)",
    "a": "AUC loss: running mean score of positives (per label)",
    "b": "AUC loss: running mean score of negatives (per label)",
    "alpha": "AUC loss: dual variable α (per label)",
    "c": "control variate: the client's mean gradient over the round",
    "stage_average": "the client's average iterate of the stage (model-sized; stage ends)",
    "pos": "sum of the client's positive-class scores or gradients on a sampled batch",
    "neg": "sum of the client's negative-class scores or gradients on a sampled batch",
    "n_pos": "number of positives in that sampled batch",
    "n_neg": "number of negatives in that sampled batch",
    ("localscgdam", "h"): "moving-average estimate of the inner function (model-sized + a, b)",
    ("localscgdam", "u"): "moving-average gradient estimate for the primal variables",
    ("localscgdam", "v"): "moving-average gradient estimate for α",
    ("localsgdam", "m_x"): "momentum of the primal variables (w, a, b)",
    ("localsgdam", "m_y"): "momentum of α",
    ("fcsg_m", "u"): "gradient estimator u (momentum form)",
    ("acc_fcsg_m", "u"): "gradient estimator u (STORM form)",
    ("local_scgd", "y"): "moving-average estimate of the inner function per task (averaged statistics)",
    ("local_scgdm", "y"): "moving-average estimate of the inner function per task (averaged statistics)",
    ("local_scgdm", "v"): "momentum of the compositional gradient",
    "pos_pool": "per-sample sigmoid scores (FeDXL2: and log u) of the positives used, + 0/1 mask",
    "neg_pool": "per-sample sigmoid scores of the negatives used, + 0/1 mask",
    "ev_pool": "survival: per-patient risk score η and time T of the events used (FeDXL2-Cox: and log u), + 0/1 mask",
    "all_pool": "survival: per-patient risk score η and time T of the patients used (FeDXL1-C-index: and the event flag), + 0/1 mask",
}


def _meaning(algorithm: str, name: str) -> str:
    text = MEANINGS.get((algorithm, name), MEANINGS.get(name))
    if text is None:
        raise SystemExit(
            f"privacy_table: {algorithm} sends {name!r}, which MEANINGS does not explain; add it"
        )
    return text


def collect() -> dict[str, Any]:
    import torch

    from benchmarks.common.data import survival_dir
    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.data import make_federated
    from fedxrisk.engines import Simulation
    from fedxrisk.engines.simulation import SimCollective
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem
    from fedxrisk.tree import leaves

    torch.set_num_threads(1)
    calls: list[tuple[str, str, list[int], int]] = []  # (kind, name, per-client shape of the leaves, round)
    current = {"round": -1}

    class Recording(SimCollective):
        def _log(self, kind: str, tree: dict[str, Any]) -> None:
            for name, sub in tree.items():
                shapes = [list(t.shape[1:]) for _, t in leaves(sub)]
                calls.append((kind, name, shapes, current["round"]))

        def mean(self, tree):
            self._log("mean", tree)
            return super().mean(tree)

        def gather(self, tree):
            self._log("gather", tree)
            return super().gather(tree)

        def pool(self, groups, valid, key):
            self._log("pool", groups)
            return super().pool(groups, valid, key)

    rows = {}
    for name, cls in sorted(ALGORITHMS.items()):
        calls.clear()
        data = (  # a survival algorithm on a tiny generated time/event table (support_matrix's)
            make_federated("survival", 2, "iid", None, 0, data_dir=survival_dir())
            if cls.task == "survival"
            else make_federated("digits", 2, "iid", 0.3, 0)
        )
        problem = Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio)
        options = {"positives_per_batch": 4} if cls.positives_per_batch else {}
        algorithm = cls(problem, **options)
        schedule = Schedule.build(ROUNDS, cls.fixed_window or 2, 0.1, stages=2)  # stage ends: rounds 1, 3
        sim = Simulation(algorithm, data, schedule, 8, 0, "loop")
        sim._collective = lambda sim=sim: Recording(sim.num_clients, sim.engine, sim.ledger, sim.seed)
        for r in range(ROUNDS):
            current["round"] = r
            sim.run_round()
        per_var: dict[str, dict[str, Any]] = {}
        for kind, var, shapes, r in calls:
            entry = per_var.setdefault(var, {"kind": kind, "shapes": shapes, "rounds": set()})
            entry["rounds"].add(r)
        rows[name] = []
        for var, e in per_var.items():
            when = "every round" if e["rounds"] == set(range(ROUNDS)) else "stage ends"
            if cls.begin_batch and e["kind"] == "pool":
                when += ", and once before round 0"
            pool = e["kind"] == "pool"
            size = len(e["shapes"]) if pool else sum(int(torch.tensor(s).prod()) for s in e["shapes"])
            rows[name].append(
                {"variable": var, "collective": e["kind"], "floats": size, "per_sample": pool, "when": when,
                 "meaning": _meaning(name, var)}
            )  # fmt: skip
    return {"rows": rows}


def render(results: dict[str, Any]) -> str:
    head = ["algorithm", "sent up by a client", "collective", "when", "floats per client (MLP)", "what it is"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for algorithm, rows in results["rows"].items():
        for i, r in enumerate(rows):
            size = f"{r['floats']} per sample used, + 1-byte mask" if r["per_sample"] else str(r["floats"])
            name = f"`{algorithm}`" if i == 0 else ""
            out.append(
                f"| {name} | `{r['variable']}` | {r['collective']} | {r['when']} | {size} | {r['meaning']} |"
            )
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--render-only", action="store_true", help="rebuild the .md from the .json")
    args = p.parse_args()
    if not args.render_only:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(collect(), indent=1) + "\n")
    text = render(json.loads(OUT.read_text()))
    OUT.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

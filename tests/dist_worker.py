"""Run under ``python -m torch.distributed.run`` by tests/test_distributed.py.

Every rank runs the same scenarios; rank 0 saves what the test compares with the
loop engine (``results.pt``). Collective calls are counted by wrapping
``torch.distributed.all_reduce`` / ``all_gather`` around each ``run_round``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fedxrisk import cli
from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import make_federated
from fedxrisk.engines import DistCollective, DistributedSimulation, SimCollective
from fedxrisk.engines.dist_collective import DistGroup
from fedxrisk.engines.launch import client_layout
from fedxrisk.engines.ledger import ByteLedger
from fedxrisk.engines.simulation import LoopEngine
from fedxrisk.experiment import RunConfig
from fedxrisk.experiment import build as experiment_build
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from helpers import write_image_folder

# (algorithm, clients, clients_per_rank, local steps, stages, model, buffer policy): with 2 ranks
SCENARIOS = [
    ("localsgdm", 2, 1, 3, 1, "mlp", "average"),
    ("codaplus", 4, 2, 3, 2, "cnn", "average"),  # BatchNorm statistics restart from the stage average
    ("codasca", 3, "auto", 3, 2, "mlp", "average"),
    ("coda", 4, 2, 3, 2, "mlp", "average"),
    ("npa", 2, 1, 1, 2, "mlp", "average"),
    ("codasca", 4, 2, 2, 2, "cnn", "local", (("form", "code"),)),  # the authors' script's options
]
ROUNDS = 4
# FeDXL2's server-side score pools (comm.pool) over an uneven layout (3 clients on 2 ranks)
FEDXL_SPEC = ("fedxl2", 3, "auto", 2, 1, "mlp", "average")
FEDXL_OPTIONS = {"positives_per_batch": 4, "passive_samples": 4}


# issue 43: 2 of 4 clients per round (seed 3), 2 clients per rank: a rank may hold no participant
PARTICIPATION_SPECS = [("codasca", 4, 2, 2, 1, "mlp", "average"), ("scaffold", 4, 2, 2, 1, "mlp", "average")]


def build(
    alg, clients, per_rank, steps, stages, model, policy, options=None, rounds=ROUNDS, seed=0, part=None
):
    """``options``: a dict, or a tuple of (name, value) pairs (scenario specs stay hashable);
    ``part``: a :class:`~fedxrisk.engines.participation.Participation`."""
    data = make_federated("digits", clients, "class", 0.3, seed)
    net = build_model(model, data.data.input_shape, seed)
    algorithm = ALGORITHMS[alg](Problem(net, data.data.pos_ratio, policy, "global"), **dict(options or {}))
    schedule = Schedule.build(rounds, steps, 0.1, stages)
    return DistributedSimulation(
        algorithm, data, schedule, 8, seed, clients_per_rank=per_rank, timeout=60, participation=part
    )


# (algorithm, model.personal, model, stages): 4 clients, 2 per rank (tests/test_personal.py's runs)
PERSONAL_SPECS = [("localsgdm", "bn", "cnn", 1), ("codaplus", "head", "cnn", 2), ("ditto", "none", "mlp", 1)]
# the same with [server] optimizer = "adam" (lr SERVER_LR): the server step leaves personal entries alone
PERSONAL_SERVER_SPECS = [
    ("localsgdm", "head", "mlp", 1),
    ("localsgdm", "bn", "cnn", 1),
    ("ditto", "none", "mlp", 1),
]
SERVER_LR = 0.05


def personal_run(alg, personal, model, stages, server_lr=None):
    """FedBN / a personal head / Ditto on the distributed engine (``server_lr``: with server Adam)."""
    from fedxrisk.engines.server_opt import ServerOptimizer, with_server_optimizer

    data = make_federated("digits", 4, "class", 0.3, 0)
    problem = Problem(build_model(model, data.data.input_shape, 0), data.data.pos_ratio, personal=personal)
    schedule = Schedule.build(4 if stages > 1 else 2, 2, 0.1, stages)
    algorithm = ALGORITHMS[alg](problem)
    if server_lr is not None:
        algorithm = with_server_optimizer(algorithm, ServerOptimizer("adam", lr=server_lr))
    sim = DistributedSimulation(algorithm, data, schedule, 8, 0, clients_per_rank=2, timeout=60)
    while not sim.done:
        sim.run_round()
    full = sim.state_dict()
    return {"spec": (alg, personal, model, stages), "states": full["states"], "ledger": sim.ledger.summary(),
            "global_model": sim.global_model()}  # fmt: skip


def class_aware_probe():
    """tests/test_classaware.py's probe on 4 clients over 2 ranks: 3 positives per batch of 8."""
    from fedxrisk.classaware import class_aware_batches
    from helpers import PositivesProbe

    data = make_federated("digits", 4, "iid", 0.1, 0)
    probe = PositivesProbe(Problem(build_model("linear", data.data.input_shape, 0), data.data.pos_ratio))
    probe = class_aware_batches(probe, 3, 8)
    sim = DistributedSimulation(
        probe, data, Schedule.build(3, 2, 0.1, 1), 8, 0, clients_per_rank=2, timeout=60
    )
    while not sim.done:
        sim.run_round()
    return sim.state_dict()["states"]


class Counter:
    """Wraps torch.distributed's collectives to count calls."""

    NAMES = ("all_reduce", "all_gather", "broadcast", "all_gather_object", "reduce", "gather", "scatter")

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.saved = {n: getattr(dist, n) for n in self.NAMES}
        for n in self.NAMES:
            setattr(dist, n, self._wrap(n, self.saved[n]))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args, **kwargs)

        return counted

    def take(self) -> dict[str, int]:
        out, self.calls = self.calls, {}
        return out

    def restore(self) -> None:
        for n, fn in self.saved.items():
            setattr(dist, n, fn)


def streamed_config(folder: Path, engine: str, stream: bool) -> RunConfig:
    """The streamed scenario (tests/test_distributed.py runs the loop reference in memory)."""
    return RunConfig(
        algorithm="codasca", dataset="folder", data_dir=str(folder), clients=4, imratio=None, partition="iid",
        positive_classes=["b"],
        rounds=3, stages=1, local_steps=2, batch_size=6, engine=engine, stream=stream,
        clients_per_rank=2 if engine == "distributed" else 1, workers=1, dist_timeout=60, tensorboard=False,
    )  # fmt: skip


def streamed_run(out: Path) -> dict:
    """Each rank streams its own two clients' shards from an image folder (its own copy)."""
    folder = out / f"images-{dist.get_rank()}"
    write_image_folder(folder, per_class=16, size=8)
    sim = experiment_build(streamed_config(folder, "distributed", True)).simulation
    while not sim.done:
        sim.run_round()
    stream = sim.local_data.stream
    return {"states": sim.state_dict()["states"], "shards": len(stream.shards), "misses": stream.misses}


CLI_ARGS = ["--engine", "distributed", "-K", "4", "--clients-per-rank", "2", "--rounds", "4", "--stages", "2"]
CLI_ARGS += ["-I", "2", "--eval-every", "2", "--algorithm", "codasca", "--dist-timeout", "60", "-q"]


def main(out: Path) -> None:
    cli.main(["run", *CLI_ARGS, "--out", str(out / "cli_run")], standalone_mode=False)
    results: dict = {"scenarios": []}
    for spec in SCENARIOS:
        sim = build(*spec)
        counter, calls = Counter(), []
        while not sim.done:
            sim.run_round()
            calls.append(counter.take())
        counter.restore()
        full = sim.state_dict()
        results["scenarios"].append(
            {
                "spec": spec,
                "states": full["states"],
                "calls": calls,
                "ledger": sim.ledger.summary(),
                "train_loss": sim.train_loss(),
                "global_model": sim.global_model(),
            }
        )

    results["streamed"] = streamed_run(out)

    from fedxrisk.engines.participation import Participation

    results["participation"] = []
    for spec in PARTICIPATION_SPECS:
        sim = build(*spec, rounds=3, part=Participation(2, 4, seed=3))
        while not sim.done:
            sim.run_round()
        results["participation"].append({"spec": spec, "states": sim.state_dict()["states"],
                                         "train_loss": sim.train_loss()})  # fmt: skip

    # checkpoint: stop after 2 rounds, resume in a fresh simulation
    spec = ("codasca", 3, "auto", 3, 2, "mlp", "average")
    first = build(*spec)
    first.run_round()
    first.run_round()
    checkpoint = first.state_dict()
    resumed = build(*spec)
    resumed.load_state_dict(checkpoint)
    while not resumed.done:
        resumed.run_round()
    results["resumed"] = {"spec": spec, "states": resumed.state_dict()["states"]}

    fedxl = build(*FEDXL_SPEC, rounds=3, options=FEDXL_OPTIONS)
    while not fedxl.done:
        fedxl.run_round()
    results["fedxl"] = {"states": fedxl.state_dict()["states"], "ledger": fedxl.ledger.summary()}

    # gather with an uneven layout (3 clients on 2 ranks: 2 + 1), mixed dtypes
    group = DistGroup.current()
    layout = client_layout(3, group.world_size, "auto")
    full_tree = {
        "s": torch.arange(3 * 5, dtype=torch.float32).reshape(3, 5),
        "n": {
            "i": torch.arange(3 * 2, dtype=torch.int64).reshape(3, 2) * 7,
            "d": torch.arange(3, dtype=torch.float64) / 3,
        },
    }
    rows = torch.tensor(layout[group.rank])
    mine = {"s": full_tree["s"][rows], "n": {"i": full_tree["n"]["i"][rows], "d": full_tree["n"]["d"][rows]}}
    dist_ledger, sim_ledger = ByteLedger(), ByteLedger()
    gathered = DistCollective(group, layout, LoopEngine(), dist_ledger).gather(mine)
    expected = SimCollective(3, LoopEngine(), sim_ledger).gather(full_tree)
    results["gather_ok"] = all(
        torch.equal(a, b)
        for a, b in [
            (gathered["s"], expected["s"][rows]),
            (gathered["n"]["i"], expected["n"]["i"][rows]),
            (gathered["n"]["d"], expected["n"]["d"][rows]),
        ]
    )
    results["gather_ledger_equal"] = dist_ledger.summary() == sim_ledger.summary()
    results["class_aware_probe"] = class_aware_probe()
    results["personal"] = [personal_run(*spec) for spec in PERSONAL_SPECS]
    results["personal_server"] = [personal_run(*spec, server_lr=SERVER_LR) for spec in PERSONAL_SERVER_SPECS]
    if group.rank == 0:
        torch.save(results, out / "results.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

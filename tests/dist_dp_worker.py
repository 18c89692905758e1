"""Run under ``python -m torch.distributed.run`` by tests/test_privacy_config.py: the distributed
engine with client-level DP, and with instance-level DP-SGD (clients on 2 ranks); rank 0 saves the
final checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fedxrisk.engines import DistributedSimulation
from fedxrisk.engines.dist_collective import DistGroup
from fedxrisk.engines.privacy import ClientDP, ClientSampling, NoiseSource, instance_private
from helpers import make_sim

# (algorithm, clients, clients_per_rank, Poisson sampling rate): every run has C = 0.5, σ = 0.8
SCENARIOS = [("codasca", 4, 2, 0.5), ("localsgdm", 3, "auto", 1.0), ("localscgdam", 4, 2, 0.75)]
# instance-level DP-SGD (per-sample C = 0.5, σ = 1.0), no client-level DP: (algorithm, clients, per rank)
INSTANCE = [("localsgdm", 4, 2), ("codasca", 3, "auto")]


def dp(rate: float) -> ClientDP:
    return ClientDP(0.5, 0.8, ClientSampling(rate), noise_seed=11)  # test mode: engines compared


def build(alg: str, clients: int, per_rank, rate: float) -> DistributedSimulation:
    base = make_sim(alg, "loop", clients=clients, rounds=4, local_steps=2, lr=0.05)
    return DistributedSimulation(
        base.algorithm, base.data, base.schedule, base.batch_size, base.seed,
        clients_per_rank=per_rank, timeout=60, privacy=dp(rate),
    )  # fmt: skip


def build_instance(alg: str, clients: int, per_rank) -> DistributedSimulation:
    base = make_sim(alg, "loop", clients=clients, rounds=3, local_steps=2, lr=0.05)
    return DistributedSimulation(
        instance_private(base.algorithm, 0.5, 1.0, base.algorithm.problem.pos_ratio), base.data, base.schedule, base.batch_size,
        base.seed, clients_per_rank=per_rank, timeout=60, noise=NoiseSource.reproducible(0),
    )  # fmt: skip


def run(alg: str, clients: int, per_rank, rate: float | None = None) -> dict:
    sim = build(alg, clients, per_rank, rate) if rate is not None else build_instance(alg, clients, per_rank)
    while not sim.done:
        sim.run_round()
    return {"state": sim.state_dict(), "train_loss": sim.train_loss()}


def resumed(spec: tuple) -> dict:
    """2 rounds, a checkpoint, the rest in a fresh simulation."""
    first = build(*spec)
    first.run_round()
    first.run_round()
    checkpoint = first.state_dict()
    second = build(*spec)
    second.load_state_dict(checkpoint)
    while not second.done:
        second.run_round()
    return second.state_dict()


def secret() -> dict:
    """Secret noise (the default): rank 0's source on both ranks, so every client gets one answer."""
    base = make_sim("localsgdm", "loop", clients=4, rounds=2, local_steps=2, lr=0.05)
    sim = DistributedSimulation(
        base.algorithm, base.data, base.schedule, base.batch_size, base.seed,
        clients_per_rank=2, timeout=60, privacy=ClientDP(0.5, 0.8),
    )  # fmt: skip
    while not sim.done:
        sim.run_round()
    return {"state": sim.state_dict()}


def main() -> None:
    out = Path(sys.argv[1])
    results = {
        "runs": [run(*spec) for spec in SCENARIOS],
        "instance": [run(*spec) for spec in INSTANCE],
        "resumed": resumed(SCENARIOS[0]),
        "secret": secret(),
    }
    if DistGroup.current().rank == 0:
        torch.save(results, out / "dp_results.pt")


if __name__ == "__main__":
    main()

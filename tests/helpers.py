"""Shared builders for tests: small federated runs and tree comparisons."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS, Algorithm, ClientInfo, Schedule
from fedxrisk.classaware import class_aware_batches
from fedxrisk.data import make_federated
from fedxrisk.engines import Simulation
from fedxrisk.models import build_model
from fedxrisk.problem import Problem
from fedxrisk.tree import leaves

# How much longer than usual a test may wait for a real process (a loaded machine, a slow CI runner):
# the waits are upper bounds that a passing test never reaches, so raising this costs nothing.
WAIT_SCALE = float(os.environ.get("FEDXRISK_TEST_WAIT", "1"))
assert WAIT_SCALE > 0, f"FEDXRISK_TEST_WAIT must be a number > 0, got {WAIT_SCALE}"
PROCESS_WAIT = 900.0 * WAIT_SCALE  # s: the longest a test waits for one real process before calling it hung

# the config of conftest's ``finished_run``: two clients, two rounds, every round evaluated and checkpointed
TINY_RUN = dict(rounds=2, stages=1, eval_every=1, clients=2, tensorboard=False, checkpoint_every=1)


def one_per_family(algorithms: Any) -> list[Any]:
    """``algorithms`` as parametrize values: the first of each family (the module that defines it) runs
    in the quick subset, the others are marked slow (the full suite runs every one)."""
    names = sorted(algorithms)
    first = {ALGORITHMS[name].__module__: name for name in reversed(names)}.values()
    return [name if name in first else pytest.param(name, marks=pytest.mark.slow) for name in names]


def make_sim(
    algorithm: str,
    engine: str = "loop",
    clients: int = 4,
    rounds: int = 3,
    local_steps: int = 2,
    batch_size: int = 8,
    lr: float = 0.1,
    stages: int = 1,
    dataset: str = "digits",
    model: str = "mlp",
    partition: str = "iid",
    imratio: float | None = 0.3,
    seed: int = 0,
    buffer_policy: str = "average",
    pos_ratio_mode: str = "global",
    options: dict[str, Any] | None = None,
    positives: int = 0,
) -> Simulation:
    """A small simulation with every piece built from ``seed``; ``positives`` > 0:
    class-aware batches (:func:`fedxrisk.classaware.class_aware_batches`)."""
    data = make_federated(dataset, clients, partition, imratio, seed)
    net = build_model(model, data.data.input_shape, seed)
    problem = Problem(net, data.data.pos_ratio, buffer_policy, pos_ratio_mode)
    alg = ALGORITHMS[algorithm](problem, **(options or {}))
    alg = class_aware_batches(alg, positives, batch_size)
    schedule = Schedule.build(rounds, local_steps, lr, stages)
    return Simulation(alg, data, schedule, batch_size, seed, engine)


def run_all(sim: Simulation) -> Simulation:
    while not sim.done:
        sim.run_round()
    return sim


def max_abs_diff(a: Any, b: Any) -> float:
    """Largest elementwise difference between two trees of the same structure."""
    pairs = zip(leaves(a), leaves(b), strict=True)
    diffs = []
    for (pa, ta), (pb, tb) in pairs:
        assert pa == pb, (pa, pb)
        diffs.append(float((ta.double() - tb.double()).abs().max()) if ta.numel() else 0.0)
    return max(diffs)


def assert_equal_across_clients(tree: Any, name: str = "", atol: float = 0.0) -> None:
    """Every leaf of a stacked tree is the same on all clients."""
    for path, t in leaves(tree):
        spread = float((t - t[:1]).abs().max()) if t.numel() else 0.0
        assert spread <= atol, f"{name}.{path} differs across clients by {spread}"


def torch_seed(seed: int = 0) -> None:
    torch.manual_seed(seed)


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) encoded as an IDX file: magic 0x0008, its rank, big-endian sizes."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">i4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def write_image_folder(root: Any, per_class: int = 12, size: int = 8, seed: int = 0) -> list[Any]:
    """Two class folders ``a`` and ``b`` of random RGB PNGs (class ``b`` brighter); the paths."""
    from pathlib import Path

    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for c, name in enumerate(("a", "b")):
        (Path(root) / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 160, (size, size, 3)) + 90 * c
            path = Path(root) / name / f"{i:03d}.png"
            Image.fromarray(pixels.astype(np.uint8)).save(path)
            paths.append(path)
    return paths


class PositivesProbe(Algorithm):
    """Counts what the engine feeds it: positives and samples seen, and the p the AUC losses
    would use on each batch (``problem.batch_p``); no learning, no communication."""

    name = "positives_probe"

    def __init__(self, problem: Problem):
        self.problem = problem

    def init(self, client: ClientInfo):
        w, buffers = self.problem.init_model()
        zero = torch.zeros(())
        p = torch.tensor(self.problem.client_pos_ratio(client.pos_ratio), dtype=torch.float32)
        return {"w": w, "buffers": buffers, "p": p, "pos": zero, "seen": zero, "p_min": zero + 2, "p_max": zero - 2,
                "batch_pos_min": zero + 1e9, "batch_pos_max": zero - 1, "loss": zero}  # fmt: skip

    def local_step(self, state, batch, ctx):
        y = batch["y"].float()
        p = self.problem.batch_p(state["p"], batch["y"])
        return {
            **state,
            "pos": state["pos"] + y.sum(), "seen": state["seen"] + y.numel(),
            "p_min": torch.minimum(state["p_min"], p), "p_max": torch.maximum(state["p_max"], p),
            "batch_pos_min": torch.minimum(state["batch_pos_min"], y.sum()),
            "batch_pos_max": torch.maximum(state["batch_pos_max"], y.sum()),
        }  # fmt: skip

    def communicate(self, state, comm, ctx):
        return state


def image_folder_config(folder: Any, **overrides: Any) -> Any:
    """A tiny two-client run on :func:`write_image_folder`'s classes (``b`` positive); ``overrides`` win."""
    from fedxrisk import RunConfig

    base = dict(algorithm="codasca", dataset="folder", data_dir=str(folder), clients=2, imratio=None,
                partition="iid", stages=1, local_steps=1, batch_size=4, workers=0, eval_every=1,
                tensorboard=False, positive_classes=["b"])  # fmt: skip
    return RunConfig(**{**base, **overrides})

"""The same FedAvg task on Flower's simulation (Ray) and on fedxrisk's engines; end-to-end wall time.

Needs ``flwr[simulation]`` (1.41 installs here; it brings Ray), e.g. in a venv that sees torch:

    python -m venv --system-site-packages .venv && .venv/bin/pip install "flwr[simulation]==1.41.*"
    FLWR_TELEMETRY_ENABLED=0 PYTHONPATH=src .venv/bin/python benchmarks/timing/flower_fedavg.py --clients 4,16

Task: the MLP of benchmarks/timing/speed.py on synthetic data (``per_client`` samples a
client), K clients, R rounds of I local SGD steps (batch B, lr, no momentum) on
binary cross-entropy, then the sample-weighted average of the model (all shards
are equal, so the plain mean). Flower: ``ServerApp`` with ``FedAvg`` and a
``ClientApp`` that trains a ``torch.nn.Module`` with ``torch.optim.SGD``.
fedxrisk: ``localsgdm`` with momentum 0 on the ``vmap`` engine. Both timings
include building the clients' data and models; Flower's also Ray's start-up,
reported separately. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.data import synthetic_data  # noqa: E402
from fedxrisk.algorithms import ALGORITHMS, Schedule  # noqa: E402
from fedxrisk.engines import Simulation  # noqa: E402
from fedxrisk.models import MLP  # noqa: E402
from fedxrisk.objectives import bce_loss  # noqa: E402
from fedxrisk.problem import Problem  # noqa: E402

SHAPE = (64,)
PER_CLIENT, BATCH, WINDOW, LR = 128, 32, 8, 0.1


def ours(clients: int, rounds: int, engine: str) -> float:
    t = time.perf_counter()
    data = synthetic_data(SHAPE, clients, PER_CLIENT)
    torch.manual_seed(0)
    alg = ALGORITHMS["localsgdm"](Problem(MLP(SHAPE), float(data.data.y_train.mean())), momentum=0.0)
    sim = Simulation(alg, data, Schedule.build(rounds, WINDOW, LR, 1), BATCH, seed=0, engine=engine)
    while not sim.done:
        sim.run_round()
    return time.perf_counter() - t


def flower(clients: int, rounds: int) -> tuple[float, float]:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    client_app = ClientApp()
    server_app = ServerApp()
    marks: dict[str, float] = {}

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        data = synthetic_data(SHAPE, clients, PER_CLIENT)
        x, y = data.client_view(k)
        model = MLP(SHAPE)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        g = torch.Generator().manual_seed(k)
        for _ in range(WINDOW):
            idx = torch.randint(len(x), (BATCH,), generator=g)
            opt.zero_grad()
            bce_loss(model(x[idx]).reshape(-1), y[idx]).backward()
            opt.step()
        content = RecordDict(
            {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(x)})}
        )
        return Message(content=content, reply_to=msg)

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(0)
        strategy = FedAvg(
            fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients, min_available_nodes=clients
        )
        marks["start"] = time.perf_counter()
        strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(SHAPE).state_dict()), num_rounds=rounds)
        marks["end"] = time.perf_counter()

    t = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    total = time.perf_counter() - t
    rounds_only = marks.get("end", float("nan")) - marks.get("start", float("nan"))
    return total, rounds_only


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", default="4,16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads for fedxrisk (Flower's actors use 1)"
    )
    p.add_argument(
        "--report",
        type=Path,
        default=None,
        help="also write the report there (docs/benchmarks/flower.md; benchmarks/timing/speed_tables.py renders its table)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ["PYTHONPATH"] = os.pathsep.join(sys.path)  # Ray workers import fedxrisk and benchmarks.common
    import flwr

    out("# Flower versus fedxrisk: the same FedAvg task\n")
    out(
        f"Command: `{' '.join(['python', *sys.argv])}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: wall times).\n"
    )
    out(
        f"FedAvg, MLP, {args.rounds} rounds × {WINDOW} local SGD steps of batch {BATCH}, "
        f"flwr {flwr.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads.\n"
    )
    out("| K | Flower total s | Flower rounds s | fedxrisk vmap s | fedxrisk loop s | Flower / vmap |")
    out("|---|---|---|---|---|---|")
    for k in (int(c) for c in args.clients.split(",")):
        ours(k, 1, "vmap")  # warm-up (imports, allocator)
        t_vmap = ours(k, args.rounds, "vmap")
        t_loop = ours(k, args.rounds, "loop")
        total, rounds_only = flower(k, args.rounds)
        out(
            f"| {k} | {total:.1f} | {rounds_only:.1f} | {t_vmap:.2f} | {t_loop:.2f} | {total / t_vmap:.0f}× |"
        )
    if args.report is not None:
        args.report.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

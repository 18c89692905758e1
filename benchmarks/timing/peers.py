"""fedxrisk beside Flower's simulation and pfl-research: the same FedAvg task, rounds/s and peak memory.

    python benchmarks/timing/peers.py    # K = 1,000 (100 a round), K = 100 (10 a round): 2-4 min on the loaded 2-core CPU

Needs the peers, which are not fedxrisk dependencies (the bench refuses in one line, naming the pip
command, when one is missing):

    pip install "flwr[simulation]==1.41.0"                 # brings Ray; installs beside torch 2.13
    python -m venv --system-site-packages /work/venv_pfl && /work/venv_pfl/bin/pip install pfl
        # pfl 0.6.0 pins absl-py<2 (it would downgrade the project's absl-py), hence its own venv; it sees the
        # same torch 2.13 through --system-site-packages (--pfl-python names the interpreter)

The task (identical in all three): synthetic tabular data, 32 features, labels drawn from a logistic
model (seed 0), ``--per-client`` = 32 samples on each of K clients; fedxrisk's ``MLP`` (32-64-64-1, ReLU)
with the same initial weights (``torch.manual_seed(0)``); FedAvg: each round m clients drawn without
replacement, each takes I = 4 local SGD steps (batch 8, lr 0.1, no momentum, binary cross-entropy),
the server averages their models weighted by sample count (all equal) and continues with that model.
What each runs:

- fedxrisk: ``Simulation`` with ``localsgdm`` (momentum 0) on the ``vmap`` engine and
  ``Participation(m, K)`` (``data.clients_per_round``), one ``run_round`` per round;
- Flower 1.41: ``flwr.simulation.run_simulation`` (Ray backend, 2 actors of 1 CPU each, i.e. both
  cores), a ``ServerApp`` running the ``FedAvg`` strategy with ``fraction_train = m / K`` and a
  ``ClientApp`` training a ``torch.nn.Module`` with ``torch.optim.SGD`` (each actor builds the data once);
- pfl 0.6: ``FederatedAveraging`` on a ``SimulatedBackend``, ``PyTorchModel`` with a ``torch.optim.SGD``
  local optimizer and central SGD of lr 1 (the plain average), ``train_cohort_size = m``,
  ``local_num_steps = 4``, users drawn by pfl's ``minimize_reuse`` sampler, no evaluation.

Each (framework, K) runs as a fresh process (``--worker``) in its own session; the parent samples the
resident memory of the process and everything it starts (Ray's GCS, raylet and actor processes: the
whole session, every 0.2 s) and reports the peak of the summed RSS and of the summed PSS (shared pages
counted once: the fairer figure for Ray's processes that share torch's libraries). Rounds/s: the
``--rounds`` rounds after ``--warmup`` rounds, timed inside the worker (wall clock). All use one torch
thread per process (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``). fedxrisk then runs 5 more rounds under
cProfile (not timed) and reports where its round goes; each single-process worker reports its RSS
after each stage (``/proc/self/status``). A fedxrisk-only control run (``--control``, K = m = 100) has
the same local work a round as K = 1,000 with 100, without the per-round O(K) work. The machine is a shared 2-core
CPU: the load average is recorded before and after. Writes ``benchmarks/results/peers.json`` and
``peers.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
FEATURES, LOCAL_STEPS, BATCH, LR = 32, 4, 8, 0.1
PFL_PYTHON = "/work/venv_pfl/bin/python"
INSTALL = {
    "flower": 'pip install "flwr[simulation]==1.41.0"',
    "pfl": "python -m venv --system-site-packages /work/venv_pfl && /work/venv_pfl/bin/pip install pfl",
}


# ---------------------------------------------------------------- the task (used by every worker)


def make_data(clients: int, per_client: int):
    """fedxrisk ``FederatedData``: x ~ N(0, I), y ~ Bernoulli(sigmoid(x·β − 1)), ``per_client`` rows each."""
    import numpy as np
    import torch

    from fedxrisk.data.federated import FederatedData
    from fedxrisk.data.types import BinaryData

    g = torch.Generator().manual_seed(0)
    n = clients * per_client
    x = torch.randn(n, FEATURES, generator=g)
    beta = torch.randn(FEATURES, generator=g) / FEATURES**0.5
    y = (torch.rand(n, generator=g) < torch.sigmoid(x @ beta * 2 - 1)).float()
    data = BinaryData("peers", x, y, x[:8], y[:8], y.long().numpy(), (1,))
    return FederatedData(data, [np.arange(k * per_client, (k + 1) * per_client) for k in range(clients)])


def make_model():
    import torch

    from fedxrisk.models import MLP

    torch.manual_seed(0)
    return MLP((FEATURES,))


_DATA: dict = {}
STAGES: dict[str, float] = {}  # this process's RSS (MB) at the stages of a worker


def stage(name: str, field: str = "VmRSS:") -> None:
    """Record this process's resident memory now (``VmRSS``; ``VmHWM``: its peak) under ``name``."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            STAGES[name] = round(int(line.split()[1]) / 1024, 1)


def actor_data(clients: int, per_client: int):
    """The task's data, built once per process (Flower's actors: not once per client call)."""
    if (clients, per_client) not in _DATA:
        import torch

        torch.set_num_threads(1)
        _DATA[clients, per_client] = make_data(clients, per_client)
    return _DATA[clients, per_client]


def final_loss(model, fed) -> float:
    import torch

    from fedxrisk.objectives import bce_loss

    with torch.no_grad():
        return float(bce_loss(model(fed.data.x_train).reshape(-1), fed.data.y_train))


# ---------------------------------------------------------------- workers: one framework, one K, print JSON


def work_fedxrisk(k: int, m: int, rounds: int, per_client: int) -> dict:
    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.engines import Simulation
    from fedxrisk.engines.participation import Participation
    from fedxrisk.problem import Problem

    stage("imported")
    fed = make_data(k, per_client)
    model = make_model()
    stage("data")
    alg = ALGORITHMS["localsgdm"](Problem(model, float(fed.data.y_train.mean())), momentum=0.0)
    sim = Simulation(
        alg, fed, Schedule.build(rounds + PROFILE_ROUNDS, LOCAL_STEPS, LR, 1), BATCH, seed=0, engine="vmap",
        participation=Participation(m, k, seed=0),
    )  # fmt: skip
    stage("built")
    state_mb = sum(t.numel() * t.element_size() for t in _leaves(sim.states)) / 2**20
    marks = [time.perf_counter()]
    for _ in range(rounds):
        sim.run_round()
        marks.append(time.perf_counter())
    stage("trained")
    params, buffers = sim.global_model()
    model.load_state_dict({**params, **buffers})
    loss = final_loss(model, fed)
    return {"marks": marks, "loss": loss, "state_mb": round(state_mb, 1), "profile": _profile(sim)}


PROFILE_ROUNDS = 5  # fedxrisk runs these after the timed rounds, under cProfile: where its round goes
PARTS = {  # (file, function) of fedxrisk's round, as cProfile names them
    "round": ("engines/simulation.py", "run_round"),
    "local steps (vmapped step)": ("engines/simulation.py", "map_clients"),
    "local steps (with take/put rows)": ("engines/clientround.py", "local_steps"),
    "communicate (participants' mean over K rows)": ("engines/clientround.py", "communicate"),
    "finite check over K rows": ("engines/simulation.py", "_finite"),
}


def _profile(sim) -> dict[str, float]:
    """Milliseconds per round in each of :data:`PARTS` (cumulative), over ``PROFILE_ROUNDS`` rounds."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(PROFILE_ROUNDS):
        sim.run_round()
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    out = {}
    for part, (file, name) in PARTS.items():
        ct = sum(v[3] for (f, _, n), v in stats.items() if f.endswith(file) and n == name)
        out[part] = round(ct / PROFILE_ROUNDS * 1e3, 1)
    return out


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    else:
        yield tree


def work_flower(k: int, m: int, rounds: int, per_client: int) -> dict:
    import peers  # by reference, so that its cache lives in each Ray actor (this file is __main__ here)
    import torch
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from fedxrisk.objectives import bce_loss

    def data():
        return peers.actor_data(k, per_client)

    client_app, server_app = ClientApp(), ServerApp()
    marks: list[float] = []
    result: dict = {}

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        x, y = data().client_view(int(context.node_config["partition-id"]))
        model = make_model()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        order = torch.randperm(len(x))
        for step in range(LOCAL_STEPS):
            idx = order[step * BATCH : (step + 1) * BATCH]
            opt.zero_grad()
            bce_loss(model(x[idx]).reshape(-1), y[idx]).backward()
            opt.step()
        content = {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": len(x)}),
        }
        return Message(content=RecordDict(content), reply_to=msg)

    class TimedFedAvg(FedAvg):
        def aggregate_train(self, server_round, replies):
            out = super().aggregate_train(server_round, replies)
            marks.append(time.perf_counter())
            return out

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = TimedFedAvg(
            fraction_train=m / k, fraction_evaluate=0.0, min_train_nodes=m, min_evaluate_nodes=0,
            min_available_nodes=k,
        )  # fmt: skip
        marks.append(time.perf_counter())
        final = strategy.start(
            grid=grid, initial_arrays=ArrayRecord(make_model().state_dict()), num_rounds=rounds
        )
        model = make_model()
        model.load_state_dict(final.arrays.to_torch_state_dict())
        result["loss"] = final_loss(model, data())

    run_simulation(
        server_app=server_app, client_app=client_app, num_supernodes=k,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False},
        },
    )  # fmt: skip
    return {"marks": marks, "loss": result.get("loss", float("nan"))}


def work_pfl(k: int, m: int, rounds: int, per_client: int) -> dict:
    import torch
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    from fedxrisk.objectives import bce_loss

    stage("imported")
    fed = make_data(k, per_client)
    stage("data")

    class Net(torch.nn.Module):  # pfl's PyTorchModel wants loss() and metrics() on the module
        def __init__(self) -> None:
            super().__init__()
            self.mlp = make_model()

        def forward(self, x):
            return self.mlp(x)

        def loss(self, x, y, eval=False):  # noqa: A002 - pfl's signature
            self.train(not eval)
            return bce_loss(self(x).reshape(-1), y)

        def metrics(self, x, y, eval=True):  # noqa: A002
            return {}

    users = {u: [t.clone() for t in fed.client_view(u)] for u in range(k)}
    train = FederatedDataset(
        lambda u: Dataset(raw_data=users[u], user_id=u), get_user_sampler("minimize_reuse", list(range(k)))
    )
    net = Net()
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )
    stage("built")
    marks = [time.perf_counter()]

    class Clock(TrainingProcessCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            marks.append(time.perf_counter())
            return False, Metrics()

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=rounds,
            evaluation_frequency=10**9,
            train_cohort_size=m,
            val_cohort_size=None,
        ),
        backend=SimulatedBackend(training_data=train, val_data=train),
        model=model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=None, local_learning_rate=LR, local_batch_size=BATCH, local_num_steps=LOCAL_STEPS
        ),
        callbacks=[Clock()],
    )
    stage("trained")
    return {"marks": marks, "loss": final_loss(net.mlp, fed)}


WORKERS = {"fedxrisk": work_fedxrisk, "flower": work_flower, "pfl": work_pfl}


def worker(name: str, k: int, m: int, rounds: int, per_client: int) -> None:
    import torch

    torch.set_num_threads(1)
    stage("torch")
    t0 = time.perf_counter()
    out = WORKERS[name](k, m, rounds, per_client)
    stage("peak", "VmHWM:")
    print("RESULT " + json.dumps({**out, "t0": t0, "stages": STAGES}), flush=True)


# ---------------------------------------------------------------- the parent: memory of a process tree


def _tree_memory(session: int) -> tuple[float, float, int]:
    """Summed RSS and PSS (MB) of every process in the session ``session``, and how many."""
    rss = pss = 0.0
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[3]) != session:  # field 6: session id
                continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1]) / 1024
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1]) / 1024
            count += 1
        except (OSError, ValueError, IndexError):
            continue  # the process ended meanwhile
    return rss, pss, count


def run_peer(name: str, k: int, m: int, warmup: int, rounds: int, per_client: int, pfl_python: str) -> dict:
    python = pfl_python if name == "pfl" else sys.executable
    args = [python, __file__, "--worker", name, "--clients", str(k), "--per-round", str(m)]
    args += ["--rounds", str(warmup + rounds), "--per-client", str(per_client)]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "OMP_NUM_THREADS": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
    }
    env["RAY_DEDUP_LOGS"] = "0"
    start = time.perf_counter()
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    peak = {"rss": 0.0, "pss": 0.0, "procs": 0}
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.2):
            rss, pss, count = _tree_memory(proc.pid)
            peak["rss"], peak["pss"] = max(peak["rss"], rss), max(peak["pss"], pss)
            peak["procs"] = max(peak["procs"], count)

    sampler = threading.Thread(target=poll, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{name} K = {k}: the worker failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT ") :])
    marks = out["marks"]  # start, then the end of every round
    timed = marks[-1] - marks[-1 - rounds]
    return {
        "framework": name, "clients": k, "per_round": m, "warmup": warmup, "rounds": rounds,
        "rounds_per_s": round(rounds / timed, 3), "first_rounds_s": round(marks[warmup] - marks[0], 2),
        "setup_s": round(marks[0] - out["t0"], 2), "process_s": round(wall, 1),
        "peak_rss_mb": round(peak["rss"], 1), "peak_pss_mb": round(peak["pss"], 1), "processes": peak["procs"],
        "final_loss": round(out["loss"], 4), "rss_stages_mb": out.get("stages", {}), "state_mb": out.get("state_mb"),
        "profile_ms": out.get("profile"),
    }  # fmt: skip


def missing_peer(pfl_python: str) -> str | None:
    """One line naming the pip command when a peer is not installed, else None."""
    import importlib.util

    if importlib.util.find_spec("flwr") is None or importlib.util.find_spec("ray") is None:
        return f"Flower's simulation is missing: {INSTALL['flower']}"
    check = [pfl_python, "-c", "import pfl, torch"]
    if not Path(pfl_python).exists() or subprocess.run(check, capture_output=True).returncode != 0:
        return f"pfl is missing at {pfl_python}: {INSTALL['pfl']} (or pass --pfl-python)"
    return None


def versions(pfl_python: str) -> dict:
    from importlib.metadata import version

    import torch

    pfl = subprocess.run(
        [pfl_python, "-c", "from importlib.metadata import version as v; print(v('pfl'), v('torch'))"],
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    return {
        "torch": torch.__version__,
        "flwr": version("flwr"),
        "ray": version("ray"),
        "pfl": pfl[0],
        "pfl_torch": pfl[1],
    }


def render(res: dict) -> str:
    v = res["versions"]
    lines = [
        f"FedAvg, MLP 32-64-64-1, {res['per_client']} samples a client, {LOCAL_STEPS} local SGD steps of batch {BATCH}; "
        f"{res['rounds']} timed rounds after {res['warmup']}; one torch thread a process. fedxrisk (vmap engine), "
        f"Flower {v['flwr']} (Ray {v['ray']}, 2 actors), pfl {v['pfl']}; torch {v['torch']}; {res['machine']}; "
        f"load average {res['load_before']:.1f} before, {res['load_after']:.1f} after.",
        "",
        "| K | per round | framework | rounds/s | fedxrisk / peer (rounds/s) | warm-up rounds, s | set-up s | process s "
        "| peak RSS MB | peak PSS MB | peer / fedxrisk (PSS) | processes | final loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        key = (r["clients"], r["per_round"])
        ours = next(
            (
                o
                for o in res["runs"]
                if o["framework"] == "fedxrisk" and (o["clients"], o["per_round"]) == key
            ),
            r,
        )
        speed = "—" if r is ours else f"**{ours['rounds_per_s'] / r['rounds_per_s']:.1f}×**"
        mem = "—" if r is ours else f"{r['peak_pss_mb'] / ours['peak_pss_mb']:.1f}×"
        name = r["framework"] + (" (control: every client)" if r.get("control") else "")
        lines.append(
            f"| {r['clients']:,} | {r['per_round']} | {name} | {r['rounds_per_s']:.2f} | {speed} "
            f"| {r['first_rounds_s']:.1f} | {r['setup_s']:.1f} | {r['process_s']:.0f} | {r['peak_rss_mb']:.0f} "
            f"| {r['peak_pss_mb']:.0f} | {mem} | {r['processes']} | {r['final_loss']:.3f} |"
        )
    lines += [
        "",
        "Resident memory of the one process of fedxrisk and pfl (MB, `/proc/self/status`) after each stage: "
        "`import torch`; the framework imported; the data and model built; the simulation built; the rounds run; "
        "the process's peak (VmHWM). fedxrisk's stacked state: every client's model and momentum, exact bytes.",
        "",
        "| K | framework | torch | imported | data | built | trained | peak | stacked client state MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        st = r.get("rss_stages_mb") or {}
        if "built" not in st:
            continue
        cells = " | ".join(
            f"{st.get(s, float('nan')):.0f}"
            for s in ("torch", "imported", "data", "built", "trained", "peak")
        )
        state = "—" if r.get("state_mb") is None else f"{r['state_mb']:.1f}"
        name = r["framework"] + (
            f" (control: {r['per_round']} of {r['clients']})" if r.get("control") else ""
        )
        lines.append(f"| {r['clients']:,} | {name} | {cells} | {state} |")
    profiled = [r for r in res["runs"] if r.get("profile_ms")]
    if profiled:
        parts = list(profiled[0]["profile_ms"])
        lines += [
            "",
            f"Where fedxrisk's round goes: ms per round under cProfile ({PROFILE_ROUNDS} rounds after the timed ones; "
            "cumulative, so the parts overlap: the vmapped step is inside the local steps).",
            "",
            "| K | per round | " + " | ".join(parts) + " |",
            "|---|---|" + "---|" * len(parts),
        ]
        for r in profiled:
            cells = " | ".join(f"{r['profile_ms'][p]:.1f}" for p in parts)
            lines.append(f"| {r['clients']:,} | {r['per_round']} | {cells} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=sorted(WORKERS))
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 100])
    p.add_argument("--per-round", type=int, nargs="+", default=[100, 10], help="one per --clients")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds (worker: all rounds)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--per-client", type=int, default=LOCAL_STEPS * BATCH)
    p.add_argument("--frameworks", default="fedxrisk,flower,pfl")
    p.add_argument(
        "--control",
        type=int,
        default=100,
        help="also fedxrisk alone with K = m = this (0: none): the same "
        "local work per round as m of a larger K, without its per-round O(K) work",
    )
    p.add_argument("--pfl-python", default=PFL_PYTHON)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.clients[0], args.per_round[0], args.rounds, args.per_client)
        return
    if len(args.per_round) != len(args.clients):
        raise SystemExit("--per-round takes one count per --clients value")
    if (missing := missing_peer(args.pfl_python)) is not None:
        raise SystemExit(missing)
    load_before = os.getloadavg()[0]
    runs = []
    for k, m in zip(args.clients, args.per_round):
        for name in args.frameworks.split(","):
            runs.append(run_peer(name, k, m, args.warmup, args.rounds, args.per_client, args.pfl_python))
            print(json.dumps(runs[-1]), flush=True)
    if args.control:
        c = args.control
        runs.append(
            {
                **run_peer("fedxrisk", c, c, args.warmup, args.rounds, args.per_client, args.pfl_python),
                "control": True,
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    res = {
        "command": " ".join(["python", "benchmarks/timing/peers.py", *sys.argv[1:]]),
        "per_client": args.per_client, "rounds": args.rounds, "warmup": args.warmup,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_before": load_before, "load_after": os.getloadavg()[0], "versions": versions(args.pfl_python),
        "runs": runs,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "peers.md").write_text(render(res))
    print(render(res))


if __name__ == "__main__":
    main()

"""Simulation speed: K clients versus one model on K·B samples (issue 9, docs/performance.md).

One command, one process, every variant measured side by side and interleaved:

    nice -n 10 python benchmarks/timing/speed.py                      # the full suite
    nice -n 10 python benchmarks/timing/speed.py --models mlp --clients 64 --reps 15

Variants of one *local step of a whole algorithm* (``--algorithms``, any name
registered in ``fedxrisk.algorithms.ALGORITHMS``; names not on this branch are
listed as unavailable, so LocalSCGDAM, FeDXL2, FCSG-M plug in when merged):

- ``central``: the algorithm's ``local_step`` on ONE state and a batch of K·B
  samples, eager (the physical limit: same FLOPs as K clients on B each);
- ``central_compiled``: the same, through ``torch.compile`` (the limit for compiled code);
- ``loop``, ``vmap``, ``compile``: the engines on the stacked state of K clients.

Reported per (model, algorithm, K, variant): median wall and CPU time per step,
ratio to ``central`` (and to ``central_compiled``), first-call (compile) time,
exact stacked-state size, peak RSS growth while stepping (sampled every ms),
and rounds/s of a whole ``Simulation`` round (I local steps + communicate,
including sampling and batching). ``--flower`` also runs
``benchmarks/timing/flower_fedavg.py`` (Flower's simulation versus ours on the same
FedAvg task) with ``--flower-python`` (a venv with ``flwr[simulation]``).
Writes ``speed.md`` and ``speed.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.algorithms.base import ClientInfo, StepContext
from fedxrisk.engines import Simulation
from fedxrisk.engines.simulation import CompiledEngine, LoopEngine, VmapEngine
from fedxrisk.models import MLP, SmallCNN
from fedxrisk.models.resnet import resnet20
from fedxrisk.problem import Problem
from fedxrisk.tree import index, numel_bytes, stack, tmap

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common.data import synthetic_data  # noqa: E402

MODELS: dict[str, tuple[Callable[..., torch.nn.Module], tuple[int, ...]]] = {
    "mlp": (MLP, (64,)),  # 64 → 64 → 64 → 1 (digits-sized inputs)
    "cnn": (SmallCNN, (1, 8, 8)),  # two conv–BN–ReLU blocks, 16/32 channels
    "resnet20": (resnet20, (3, 32, 32)),  # CIFAR ResNet20
}
DEFAULT_CLIENTS = {"mlp": "4,16,64,256,1024", "cnn": "4,16,64,256", "resnet20": "4,16"}
FIELDS = (
    "model", "algorithm", "clients", "batch", "variant", "step_ms", "step_cpu_ms", "ratio",
    "ratio_compiled", "first_call_s", "state_mb", "peak_rss_mb", "round_s", "rounds_per_s", "reps",
)  # fmt: skip


class PeakRSS:
    """Peak resident memory above the level at entry, sampled every millisecond."""

    page = os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakRSS:
        _trim()
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _poll(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def mb(self) -> float:
        return (self.peak - self.base) / 2**20


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


class Case:
    """One (model, algorithm, K): the stacked states, a batch, and the step variants."""

    def __init__(self, model: str, algorithm: str, clients: int, batch: int, args: argparse.Namespace):
        cls, shape = MODELS[model]
        torch.manual_seed(0)
        self.device = torch.device(args.device)
        net = cls(shape).to(self.device)
        self.data = synthetic_data(shape, clients, max(4 * batch, 64))
        problem = Problem(net, float(self.data.data.y_train.mean()))
        self.alg = ALGORITHMS[algorithm](problem)
        infos = [ClientInfo(k, n, self.data.client_pos_ratio(k)) for k, n in enumerate(self.data.shard_sizes)]
        on_device = lambda t: t.to(self.device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        self.states = tmap(on_device, stack([self.alg.init(c) for c in infos]))  # kept on the device
        positions = np.stack([np.arange(batch) for _ in range(clients)])
        self.batch = self.data.batch(positions, self.device)  # one batch, resident: no host copy per step
        extra = getattr(self.alg, "uniforms_per_step", 0)
        if extra:
            self.batch["uniform"] = torch.rand(clients, extra, device=self.device)
        self.flat = {k: v.reshape(clients * batch, *v.shape[2:]) for k, v in self.batch.items()}
        self.one = index(self.states, 0)
        self.ctx = StepContext(0, 0, 0, 0, self.alg.default_lr, args.window)
        self.state_mb = numel_bytes(self.states) / 2**20
        self.window, self.clients, self.batch_size = args.window, clients, batch

    def variants(self, names: list[str]) -> dict[str, Callable[[], Any]]:
        alg, ctx = self.alg, self.ctx
        out: dict[str, Callable[[], Any]] = {}
        for name in names:
            if name == "central":
                out[name] = lambda: alg.local_step(self.one, self.flat, ctx)
            elif name == "central_compiled":
                step = torch.compile(lambda s, b: alg.local_step(s, b, ctx), dynamic=False)
                out[name] = lambda step=step: step(self.one, self.flat)
            else:
                engine = {"loop": LoopEngine, "vmap": VmapEngine, "compile": CompiledEngine}[name]()
                self.engines = getattr(self, "engines", {}) | {name: engine}
                out[name] = lambda e=engine: e.local_steps(alg.local_step, ctx, self.states, self.batch)
        return out

    def round_time(self, engine_name: str, reps: int) -> float:
        """Median seconds of one whole Simulation round with an already warmed engine."""
        sched = Schedule.build(reps + 1, self.window, self.alg.default_lr, 1)
        sim = Simulation(
            self.alg, self.data, sched, self.batch_size, seed=0, engine="vmap", device=self.device
        )
        sim.engine = self.engines[engine_name]
        sim.run_round()  # warm-up
        times = []
        for _ in range(reps):
            synchronize(self.device)
            t = time.perf_counter()
            sim.run_round()
            synchronize(self.device)
            times.append(time.perf_counter() - t)
        return statistics.median(times)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA runs asynchronously: a timer must not stop early)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    case: Case, names: list[str], reps: int, round_reps: int, loop_round_max: int, clock: str
) -> list[dict]:
    fns = {name: _synchronized(fn, case.device) for name, fn in case.variants(names).items()}
    first, rows = {}, {}
    for name, fn in fns.items():  # first call: compiles where compiling
        t = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t
        fn()
    wall: dict[str, list[float]] = {n: [] for n in fns}
    cpu: dict[str, list[float]] = {n: [] for n in fns}
    peak: dict[str, float] = {n: 0.0 for n in fns}
    order = list(fns)
    for r in range(reps):  # interleaved, rotating the order every repetition
        for name in order[r % len(order) :] + order[: r % len(order)]:
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            fns[name]()
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    for name in fns:  # memory in a separate pass: the sampling thread would disturb the CPU clock
        with PeakRSS() as mem:
            fns[name]()
        peak[name] = mem.mb
    med = {n: statistics.median((cpu if clock == "cpu" else wall)[n]) for n in fns}
    for name in fns:
        row = dict(
            model=case.model, algorithm=case.alg.name, clients=case.clients, batch=case.batch_size,
            variant=name, step_ms=1e3 * statistics.median(wall[name]), step_cpu_ms=1e3 * statistics.median(cpu[name]),
            ratio=med[name] / med["central"] if "central" in med else float("nan"),
            ratio_compiled=med[name] / med["central_compiled"] if "central_compiled" in med else float("nan"),
            first_call_s=first[name], state_mb=case.state_mb if name in ("loop", "vmap", "compile") else
            case.state_mb / case.clients, peak_rss_mb=peak[name], round_s=float("nan"),
            rounds_per_s=float("nan"), reps=reps,
        )  # fmt: skip
        if name in ("vmap", "compile") or (name == "loop" and case.clients <= loop_round_max):
            row["round_s"] = case.round_time(name, round_reps)
            row["rounds_per_s"] = 1.0 / row["round_s"]
        rows[name] = row
    return list(rows.values())


def _synchronized(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """``fn`` timed whole on an asynchronous device: the queue is drained before and after it."""
    if device.type != "cuda":
        return fn

    def call() -> Any:
        synchronize(device)
        out = fn()
        synchronize(device)
        return out

    return call


def profile_table(case: Case, names: list[str], steps: int = 5, top: int = 12) -> str:
    """Where the time of one step goes: top operators by self CPU time per variant."""
    from torch.profiler import ProfilerActivity, profile

    out = []
    for name, fn in case.variants(names).items():
        fn()
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                fn()
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in rows) or 1.0
        out.append(
            f"\n**{name}** ({case.model}, {case.alg.name}, K={case.clients}), top operators by self CPU:\n"
        )
        out.append("| operator | calls/step | self ms/step | share |\n|---|---|---|---|")
        for e in rows[:top]:
            out.append(
                f"| `{e.key}` | {e.count / steps:.0f} | {e.self_cpu_time_total / 1e3 / steps:.2f} | "
                f"{100 * e.self_cpu_time_total / total:.0f} % |"
            )
    return "\n".join(out)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "—" if v != v else (f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}")
    return str(v)


def markdown(rows: list[dict], args: argparse.Namespace, header: str, extra: str) -> str:
    cols = ("model", "algorithm", "clients", "variant", "step_ms", "step_cpu_ms", "ratio", "ratio_compiled",
            "first_call_s", "state_mb", "peak_rss_mb", "rounds_per_s")  # fmt: skip
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n" + extra + "\n"


def run_flower(args: argparse.Namespace) -> str:
    script = Path(__file__).with_name("flower_fedavg.py")
    cmd = [
        args.flower_python,
        str(script),
        "--clients",
        args.flower_clients,
        "--rounds",
        str(args.flower_rounds),
        "--threads",
        str(torch.get_num_threads()),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), FLWR_TELEMETRY_ENABLED="0")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.flower_timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"\nFlower comparison did not run: {e}\n"
    if proc.returncode != 0:
        return f"\nFlower comparison failed (exit {proc.returncode}):\n\n```\n{proc.stderr[-2000:]}\n```\n"
    return "\n" + proc.stdout


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="mlp,cnn,resnet20")
    p.add_argument("--clients", default=None, help="comma list; default per model " + str(DEFAULT_CLIENTS))
    p.add_argument("--algorithms", default="codasca,localsgdm", help="any registered algorithm names")
    p.add_argument("--variants", default="central,central_compiled,loop,vmap,compile")
    p.add_argument(
        "--compile-clients", default="64", help="K values where compiled variants run (compiling is slow)"
    )
    p.add_argument(
        "--compile-algorithms", default=None, help="algorithms with compiled variants (default: all)"
    )
    p.add_argument("--loop-max", type=int, default=256, help="largest K for the loop engine")
    p.add_argument("--loop-round-max", type=int, default=16, help="largest K for loop rounds/s")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu", help="cpu or cuda: model, stacked states and batch live there")
    p.add_argument("--window", type=int, default=8, help="local steps per round (rounds/s)")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--round-reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu",
        help="clock for the ratios: process CPU time (robust on a shared machine with --threads 1) or wall",
    )  # fmt: skip
    p.add_argument("--max-state-gb", type=float, default=6.0, help="skip K whose stacked state exceeds this")
    p.add_argument("--profile", default="mlp:64", help="model:K cases to profile (comma list, '' for none)")
    p.add_argument("--flower", action="store_true", help="also run benchmarks/timing/flower_fedavg.py")
    p.add_argument("--flower-python", default=".venv/bin/python")
    p.add_argument("--flower-clients", default="4,16")
    p.add_argument("--flower-rounds", type=int, default=5)
    p.add_argument("--flower-timeout", type=int, default=900)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    hardware = platform.processor() or platform.machine()
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit(f"--device {args.device}: no CUDA device here (torch {torch.__version__})")
        args.clock = "wall"  # the host's CPU clock does not see the device's work
        hardware = f"{torch.cuda.get_device_name(torch.device(args.device))} (CUDA {torch.version.cuda}); host {hardware}"
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    algorithms = [a for a in args.algorithms.split(",") if a]
    missing = [a for a in algorithms if a not in ALGORITHMS]
    algorithms = [a for a in algorithms if a in ALGORITHMS]
    compile_ks = {int(k) for k in args.compile_clients.split(",") if k}
    compile_algs = set((args.compile_algorithms or args.algorithms).split(","))
    profiles = {tuple(s.split(":")) for s in args.profile.split(",") if s}
    rows: list[dict] = []
    notes, prof_md = [], []
    started = time.time()
    load0 = os.getloadavg()
    for model in args.models.split(","):
        ks = [int(k) for k in (args.clients or DEFAULT_CLIENTS[model]).split(",")]
        for alg in algorithms:
            for k in ks:
                case = Case(model, alg, k, args.batch_size, args)
                case.model = model
                if case.state_mb / 1024 > args.max_state_gb:
                    notes.append(
                        f"- {model} {alg} K={k}: skipped, stacked state {case.state_mb / 1024:.1f} GB"
                    )
                    continue
                names = [
                    v for v in args.variants.split(",")
                    if not (v in ("compile", "central_compiled") and (k not in compile_ks or alg not in compile_algs))
                    and not (v == "loop" and k > args.loop_max)
                ]  # fmt: skip
                print(f"[{time.time() - started:6.0f}s] {model} {alg} K={k}: {names}", flush=True)
                rows += measure(case, names, args.reps, args.round_reps, args.loop_round_max, args.clock)
                if (model, str(k)) in profiles and alg == algorithms[0]:
                    prof_md.append(profile_table(case, [n for n in names if n != "loop"]))
                del case
                _trim()
    with open(out / "speed.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    load1 = os.getloadavg()
    header = (
        f"# Simulation speed report\n\nCommand: `{' '.join(sys.argv)}`  \n"
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"{hardware}, device {args.device}; B = {args.batch_size}, I = {args.window}, "
        f"{args.reps} interleaved repetitions (medians); took {time.time() - started:.0f} s; "
        f"load average at start {load0[0]:.1f}, at end {load1[0]:.1f}.\n\n"
        f"Ratios use the {args.clock} clock. "
        "`ratio` = step time / `central` (eager step of one model on K·B samples); "
        "`ratio_compiled` = step time / `central_compiled`; `first_call_s` includes compilation; "
        "`state_mb` = stacked state (one client's for central); `peak_rss_mb` = resident memory growth "
        "during a step; `rounds_per_s` = whole Simulation rounds (I steps + communicate + sampling)."
    )
    extra = ""
    if missing:
        extra += f"\nAlgorithms not registered on this branch (skipped): {', '.join(missing)}.\n"
    if notes:
        extra += "\n" + "\n".join(notes) + "\n"
    if prof_md:
        extra += "\n## Where the time goes\n" + "\n".join(prof_md) + "\n"
    if args.flower:
        extra += "\n## Flower\n" + run_flower(args)
    (out / "speed.md").write_text(markdown(rows, args, header, extra))
    print((out / "speed.md").read_text())
    print(json.dumps({"csv": str(out / "speed.csv"), "md": str(out / "speed.md")}))


if __name__ == "__main__":
    main()

"""Distributed engine benchmark: packed-mean overhead and wall time on 1, 2 and 4 processes.

    nice -n 10 python benchmarks/scale/distributed_bench.py [--reps 50] [--rounds 30]

1. Overhead: under ``torch.distributed.run`` with 2 ranks (gloo, CPU), the time of
   one ``DistCollective.mean`` of a real round payload (pack, one all_reduce,
   unpack) against a raw ``all_reduce`` of one flat tensor with the same number
   of bytes, and against one all_reduce per tensor (what the papers' scripts do).
   Medians over ``--reps`` calls, each after a barrier.
2. Wall time of ``fedxrisk run --engine distributed`` on 1, 2 and 4 processes
   (K = 4 clients, ``--clients-per-rank auto``), next to the loop and vmap engines,
   as reported in summary.json (training and evaluation, without start-up) and
   for the whole command (start-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _torchrun(nproc: int, args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=True)


# -- 1. overhead (runs inside each rank) ----------------------------------------------------
def _payloads():
    """Round payloads of real algorithms and models: (name, tree with a leading client axis)."""
    import torch

    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.algorithms.base import ClientInfo, RoundContext, model_payload
    from fedxrisk.data import make_federated
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem
    from fedxrisk.tree import stack

    data = make_federated("digits", 2, "class", 0.3, 0)
    out = []
    for alg, model in [("localsgdm", "mlp"), ("codasca", "mlp"), ("codasca", "cnn")]:
        net = build_model(model, data.data.input_shape, 0)
        algorithm = ALGORITHMS[alg](Problem(net, data.data.pos_ratio))
        state = stack([algorithm.init(ClientInfo(0, 10, 0.3))])
        if alg == "localsgdm":
            tree = {**model_payload(state, algorithm.problem), "m": state["m"]}
        else:
            plan = next(Schedule.build(2, 2, 0.1, 1).plan())
            tree = algorithm.round_payload(state, RoundContext(plan, None))
            tree["c"] = state["c"]
        out.append((f"{alg} / {model}", tree))
    # larger models, as trees of float32 leaves: ResNet20-like (65 tensors, 0.27M floats), 1M floats in 20
    resnet = {f"l{i}": torch.zeros(1, 272_474 // 65 + (i < 272_474 % 65)) for i in range(65)}
    out.append(("65 tensors, 0.27M floats (ResNet20-sized)", resnet))
    out.append(("20 tensors, 1M floats", {f"l{i}": torch.zeros(1, 50_000) for i in range(20)}))
    return out


def _times_ms(fn, reps: int, warmup: int = 5) -> tuple[float, float]:
    """(median, minimum) in ms; the minimum is the least disturbed by other load on the machine."""
    import torch.distributed as dist

    samples = []
    for i in range(reps + warmup):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3, min(samples) * 1e3


def overhead_worker(reps: int) -> None:
    import torch
    import torch.distributed as dist

    from fedxrisk.engines import ByteLedger, DistCollective
    from fedxrisk.engines.dist_collective import DistGroup
    from fedxrisk.engines.launch import client_layout
    from fedxrisk.engines.simulation import LoopEngine
    from fedxrisk.tree import leaves, numel_bytes

    group = DistGroup.current(timeout=120)
    layout = client_layout(group.world_size, group.world_size, 1)
    rows = []
    for name, tree in _payloads():
        comm = DistCollective(group, layout, LoopEngine(), ByteLedger())
        flat = torch.zeros(numel_bytes(tree) // 4)
        tensors = [t[0].clone() for _, t in leaves(tree)]

        def per_tensor(tensors=tensors):
            for t in tensors:
                dist.all_reduce(t)

        fns = {
            "packed": partial(comm.mean, tree),
            "raw": partial(dist.all_reduce, flat),
            "per_tensor": per_tensor,
        }
        times = {label: _times_ms(fn, reps) for label, fn in fns.items()}
        rows.append({"payload": name, "tensors": len(tensors), "bytes": numel_bytes(tree), **times})
    if group.rank == 0:
        print("RESULT " + json.dumps(rows))


# -- 2. wall time -----------------------------------------------------------------------------------
def run_args(rounds: int, out: Path) -> list[str]:
    return [
        "run", "--algorithm", "codasca", "-K", "4", "--rounds", str(rounds), "--stages", "1",
        "-I", "8", "--eval-every", str(rounds), "--out", str(out), "-q",
    ]  # fmt: skip


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall_times(rounds: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("loop", "vmap"):
            out = Path(tmp) / engine
            t0, c0 = time.perf_counter(), _child_cpu()
            cmd = [sys.executable, "-m", "fedxrisk", *run_args(rounds, out), "--engine", engine]
            subprocess.run(cmd, env=_env(), check=True, capture_output=True)
            total, cpu = time.perf_counter() - t0, _child_cpu() - c0
            summary = json.loads((out / "summary.json").read_text())
            rows.append(
                {
                    "run": f"{engine}, 1 process",
                    "train_s": summary["wall_seconds"],
                    "total_s": total,
                    "cpu_s": cpu,
                }
            )
        for nproc in (1, 2, 4):
            out = Path(tmp) / f"dist{nproc}"
            args = ["-m", "fedxrisk", *run_args(rounds, out), "--engine", "distributed"]
            args += ["--clients-per-rank", "auto"]
            t0, c0 = time.perf_counter(), _child_cpu()
            _torchrun(nproc, args)
            total, cpu = time.perf_counter() - t0, _child_cpu() - c0
            summary = json.loads((out / "summary.json").read_text())
            label = f"distributed, {nproc} process{'es' if nproc > 1 else ''} ({4 // nproc} client{'s' if nproc < 4 else ''} each)"
            rows.append({"run": label, "train_s": summary["wall_seconds"], "total_s": total, "cpu_s": cpu})
    return rows


RESULTS = ROOT / "benchmarks" / "results"


def render(raw: Path) -> None:
    """``distributed_overhead.md`` and ``distributed_wall.md`` next to ``raw``, from its JSON."""
    results = json.loads(raw.read_text())
    lines = [
        "| payload | tensors | bytes | packed mean | raw all_reduce | ratio (median, min) | per tensor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["overhead"]:
        (pm, pn), (rm, rn), (tm, tn) = r["packed"], r["raw"], r["per_tensor"]
        lines.append(
            f"| {r['payload']} | {r['tensors']} | {r['bytes']:,} | {pm:.3f} / {pn:.3f} | {rm:.3f} / {rn:.3f} "
            f"| {pm / rm:.2f}×, {pn / rn:.2f}× | {tm:.3f} / {tn:.3f} |"
        )
    (raw.parent / "distributed_overhead.md").write_text("\n".join(lines) + "\n")
    lines = [
        "| run | training + eval (summary.json) | whole command | CPU, all processes |",
        "|---|---:|---:|---:|",
    ]
    for r in results["wall"]:
        lines.append(f"| {r['run']} | {r['train_s']:.2f} | {r['total_s']:.2f} | {r['cpu_s']:.2f} |")
    (raw.parent / "distributed_wall.md").write_text("\n".join(lines) + "\n")
    for name in ("distributed_overhead.md", "distributed_wall.md"):
        print((raw.parent / name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed.json", help="raw results (JSON)")
    parser.add_argument(
        "--render-only", action="store_true", help="write the .md tables from --out, run nothing"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        overhead_worker(args.reps)
        return
    if args.render_only:
        render(args.out)
        return
    load_before = os.getloadavg()
    proc = _torchrun(2, [str(Path(__file__).resolve()), "--worker", "--reps", str(args.reps)])
    rows = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    results = {
        "args": {"reps": args.reps, "rounds": args.rounds},
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "overhead": rows,
        "wall": wall_times(args.rounds),
        "loadavg_1min": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    render(args.out)


if __name__ == "__main__":
    main()

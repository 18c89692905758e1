"""Where the compiled K-client step loses against the compiled centralized step (issue 43, item 5).

    nice -n 10 python benchmarks/timing/compiled_gap.py              # MLP, CODASCA and LocalSGDM, K = 64, B = 32

One process, one torch thread: for each algorithm, ``benchmarks/timing/speed.py``'s ``compile`` variant
(the vmapped local step of K clients through ``torch.compile``) and ``central_compiled`` (one model
on K·B samples, compiled), timed interleaved (process CPU clock: median of 15 blocks of 20 steps),
then each profiled (torch.profiler, 7 interleaved profiles of 20 steps, the median of each part) and its self time split into the matrix products
(``bmm`` / ``mm`` / ``addmm``), the compiled elementwise graph (``Call CompiledFxGraph``: the
fused update arithmetic of every client's state), and the fixed cost of a compiled call (dynamo's
cache lookup, the AOT wrapper). Also the bytes of the stacked state each step reads and writes.
About 2 minutes on 2 cores (two compilations per algorithm). Writes
``benchmarks/results/compiled_gap.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.timing import speed  # noqa: E402  (the same Case and variants as the speed table)

RESULTS = Path(__file__).resolve().parents[1] / "results"
MATMUL = ("aten::bmm", "aten::mm", "aten::addmm", "aten::baddbmm")


def split(fn, steps: int = 20) -> dict[str, float]:
    """Self time per step (ms) of the matrix products, the compiled graph and the call overhead."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    out = {"matmul": 0.0, "graph": 0.0, "overhead": 0.0, "other": 0.0}
    for e in prof.key_averages():
        ms = e.self_cpu_time_total / 1e3 / steps
        if e.key in MATMUL:
            out["matmul"] += ms
        elif "CompiledFxGraph" in e.key:
            out["graph"] += ms
        elif any(s in e.key for s in ("Dynamo", "AOTDispatcher", "Compiled Region", "Pregraph")):
            out["overhead"] += ms
        else:
            out["other"] += ms
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["codasca", "localsgdm"])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    lines = [
        f"MLP, K = {args.clients}, B = {args.batch_size}, one torch thread, process CPU clock; {platform.machine()}, "
        f"{os.cpu_count()} cores shared with other jobs (load average {load:.1f} at the start), torch {torch.__version__}.",
        "",
        "| algorithm | variant | step (ms) | matrix products | compiled elementwise graph | call overhead "
        "| other | stacked state (MB) | ratio to compiled central |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for alg in args.algorithms:
        case = speed.Case(
            "mlp", alg, args.clients, args.batch_size, argparse.Namespace(device="cpu", window=8)
        )
        fns = case.variants(["central_compiled", "compile"])
        for fn in fns.values():
            for _ in range(3):
                fn()
        times: dict[str, list[float]] = {n: [] for n in fns}
        for _ in range(15):
            for name, fn in fns.items():
                start = time.process_time()
                for _ in range(20):
                    fn()
                times[name].append((time.process_time() - start) / 20 * 1e3)
        median = {n: statistics.median(v) for n, v in times.items()}
        profiles: dict[str, list[dict[str, float]]] = {n: [] for n in fns}
        for _ in range(7):  # interleaved; the median of each part
            for name, fn in fns.items():
                profiles[name].append(split(fn))
        for name in fns:
            parts = {k: statistics.median(p[k] for p in profiles[name]) for k in profiles[name][0]}
            state = case.state_mb if name == "compile" else case.state_mb / args.clients
            ratio = median[name] / median["central_compiled"]
            lines.append(
                f"| {alg} | `{name}` | {median[name]:.2f} | {parts['matmul']:.2f} | {parts['graph']:.2f} "
                f"| {parts['overhead']:.2f} | {parts['other']:.2f} | {state:.2f} | {ratio:.2f} |"
            )
        print(lines[-2], lines[-1], sep="\n", flush=True)
    lines += [
        "",
        "Columns 4–7: profiler self time per step (ms; wall clock inside the profile, medians of 7 profiles, so "
        "they need not add up to the CPU-clock step time of column 3); ratios are within this one run.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compiled_gap.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

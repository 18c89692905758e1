"""Partial participation at scale (issue 43): ``fedxrisk run`` with K clients, 100 of them per round.

    python benchmarks/scale/participation_scale.py                       # K = 1,000 and 10,000: ~4 min, 2-core CPU
    python benchmarks/scale/participation_scale.py --clients 1000 100000 --rounds 32

Each K runs as a fresh ``python -m fedxrisk.cli run`` process: CODASCA on synthetic data with
20 training samples per client (so the data grows with K), the linear model, 100 clients per round
(``data.clients_per_round``), I = 4 local steps of batch 8, the vmap engine, 64 rounds, one
evaluation at the end. Reported per K: the round time in the steady state (a second run of 8
rounds is subtracted: (wall at round 64 − wall at round 8) / 56, from history.csv, so set-up, the
first rounds' warm-up and the final evaluation are excluded; 56 rounds, as 12 were too few on a
loaded machine), the whole process's wall time and its peak RSS (``os.wait4``'s ``ru_maxrss``),
and the stacked client state's bytes per client (the checkpoint's ``states`` / K, from
``final_state.pt``), all of the 64-round run. Writes
``benchmarks/results/participation_scale.json`` and ``participation_scale.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PER_CLIENT = 20  # training samples per client


def run_one(clients: int, per_round: int, rounds: int, out: Path) -> dict:
    """One ``fedxrisk run`` process; its round time, wall time and peak RSS."""
    args = [
        sys.executable, "-m", "fedxrisk.cli", "run", "-q", "--out", str(out),
        "--algorithm", "codasca", "--dataset", "synthetic", "--model", "linear", "--engine", "vmap",
        "-K", str(clients), "--clients-per-round", str(per_round), "--rounds", str(rounds), "--stages", "1",
        "-I", "4", "--batch-size", "8", "--eval-every", str(rounds), "--checkpoint-every", str(rounds),
        "--allow-missing-class", "--partition", "iid",
        "--set", f"data.num_samples={int(PER_CLIENT * clients / 0.8)}", "--set", "experiment.tensorboard=false",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read() if proc.stderr else ""
    if status != 0:
        raise SystemExit(f"K = {clients}: fedxrisk run failed:\n{stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    last = summary["final"]
    rows = (out / "history.csv").read_text().splitlines()
    header, final = rows[0].split(","), rows[-1].split(",")
    round_wall = float(final[header.index("wall_seconds")])  # training time to the last round
    state_bytes = None
    final_state = out / "final_state.pt"
    if final_state.exists():
        import torch

        states = torch.load(final_state, weights_only=False)["simulation"]["states"]
        stack = [states] if isinstance(states, torch.Tensor) else list(_tensors(states))
        state_bytes = sum(t.numel() * t.element_size() for t in stack) / clients
    return {
        "clients": clients, "per_round": per_round, "rounds": rounds,
        "train_seconds": round(round_wall, 4), "process_seconds": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "state_bytes_per_client": state_bytes,
        "test_auroc": last.get("test_auroc"),
    }  # fmt: skip


def _tensors(tree):
    for v in tree.values():
        if isinstance(v, dict):
            yield from _tensors(v)
        else:
            yield v


def render(results: dict) -> str:
    lines = [
        f"K clients, {results['per_round']} per round: CODASCA, synthetic data ({PER_CLIENT} samples per client), "
        f"linear model, vmap engine; {results['machine']}.",
        "",
        "| K | steady round time (s) | process wall (s) | peak RSS (MB) | state bytes per client | ratio to the first K (round, RSS) |",
        "|---|---|---|---|---|---|",
    ]
    first = results["runs"][0]
    for r in results["runs"]:
        ratio = f"{r['round_seconds'] / first['round_seconds']:.2f}, {r['peak_rss_mb'] / first['peak_rss_mb']:.2f}"
        lines.append(
            f"| {r['clients']:,} | {r['round_seconds']:.3f} | {r['process_seconds']:.1f} | {r['peak_rss_mb']:.0f} "
            f"| {r['state_bytes_per_client'] or float('nan'):.0f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=64)
    parser.add_argument("--warmup-rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.clients:
            short = run_one(k, args.per_round, args.warmup_rounds, Path(tmp) / f"k{k}-short")
            run = run_one(k, args.per_round, args.rounds, Path(tmp) / f"k{k}")
            steady = (run["train_seconds"] - short["train_seconds"]) / (args.rounds - args.warmup_rounds)
            runs.append({**run, "round_seconds": round(steady, 4), "warmup_rounds": args.warmup_rounds})
            print(json.dumps(runs[-1]), flush=True)
    results = {
        "per_round": args.per_round,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "participation_scale.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "participation_scale.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()

"""The GPU path in one prepared script (issue 43): engines equal across devices, then the speed table.

    python benchmarks/timing/gpu_check.py --device cuda --out docs/benchmarks/gpu     # on a GPU machine, < 8 min

1. **Equivalence**: the same small run (CODASCA and CE FedAvg on the bundled digits, K = 8,
   3 rounds, I = 4) trained by each engine (loop, vmap, compile) on ``--device`` and by the
   loop engine on the CPU; the largest absolute difference of the final weights from the CPU
   loop's is reported per engine and must stay under ``--tolerance`` (float32 kernels differ in
   summation order across devices, so bit equality is not expected; CPU loop = vmap is tested
   bit for bit elsewhere).
2. **Speed**: ``benchmarks/timing/speed.py --device DEVICE`` (model, stacked states and the batch
   resident on the device; the device synchronized around every timed call; wall clock).

Writes ``gpu_check.md`` (the equivalence table, the hardware) and the speed report under
``--out``; exits 1 when an engine differs beyond the tolerance. On a machine without CUDA,
``--device cpu`` runs the same script (the check that it has not rotted).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.*` imports

ALGORITHMS = ("codasca", "localsgdm")


def final_weights(algorithm: str, engine: str, device: str, folder: Path) -> dict[str, torch.Tensor]:
    """The model.pt weights of one small run (on the CPU, for comparison)."""
    from fedxrisk.run.folder import load_model
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.spec import RunConfig

    cfg = RunConfig(algorithm=algorithm, clients=8, rounds=3, stages=1, local_steps=4, eval_every=3,
                    engine=engine, device=device, tensorboard=False)  # fmt: skip
    run_experiment(cfg, folder)
    return {k: v.float() for k, v in load_model(folder).state_dict().items() if v.is_floating_point()}


def equivalence(device: str, engines: list[str], tolerance: float) -> tuple[list[str], bool]:
    """Markdown rows: per algorithm and engine, max |w_engine,device − w_loop,cpu|."""
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in ALGORITHMS:
            reference = final_weights(algorithm, "loop", "cpu", Path(tmp) / f"{algorithm}-ref")
            for engine in engines:
                started = time.perf_counter()
                got = final_weights(algorithm, engine, device, Path(tmp) / f"{algorithm}-{engine}")
                diff = max(float((got[k] - reference[k]).abs().max()) for k in reference)
                passed = diff <= tolerance
                ok &= passed
                rows.append(
                    f"| {algorithm} | {engine} | {device} | {diff:.2e} | {'yes' if passed else 'NO'} | "
                    f"{time.perf_counter() - started:.1f} |"
                )
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--engines", default="loop,vmap,compile")
    p.add_argument(
        "--tolerance", type=float, default=1e-3, help="largest weight difference from the CPU loop"
    )
    p.add_argument("--no-speed", action="store_true", help="the equivalence check only")
    p.add_argument("--out", default="docs/benchmarks/gpu")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hardware = platform.processor() or platform.machine()
    if args.device.startswith("cuda"):
        hardware = f"{torch.cuda.get_device_name(torch.device(args.device))}, CUDA {torch.version.cuda}"
    started = time.time()
    rows, ok = equivalence(args.device, args.engines.split(","), args.tolerance)
    lines = [
        "# GPU check",
        "",
        f"Command: `python benchmarks/timing/gpu_check.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
        f"torch {torch.__version__}; {hardware}.",
        "",
        f"Final weights after the same run on `{args.device}` against the CPU loop engine "
        f"(tolerance {args.tolerance:g}):",
        "",
        "| algorithm | engine | device | max weight difference | within | seconds |",
        "|---|---|---|---:|---|---:|",
        *rows,
        "",
    ]
    if not args.no_speed:
        from benchmarks.timing import speed

        speed.main(["--device", args.device, "--models", "mlp,cnn", "--clients", "4,64",
                    "--algorithms", "codasca,localsgdm", "--variants", "central,central_compiled,loop,vmap,compile",
                    "--compile-clients", "64", "--reps", "5", "--round-reps", "2", "--profile", "",
                    "--out", str(out)])  # fmt: skip
        lines.append("The speed table: `speed.md` in this folder.")
    lines.append(f"Took {time.time() - started:.0f} s.")
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    print(out / "gpu_check.md")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

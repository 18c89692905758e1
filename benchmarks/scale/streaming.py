"""Streaming vs in-memory training data: peak resident memory and training throughput.

    python benchmarks/scale/streaming.py                  # memory: generate the images in /tmp, measure, render
    python benchmarks/scale/streaming.py --throughput --sizes 10000   # throughput, with and without data.cache
    python benchmarks/scale/streaming.py --render-only    # re-render the tables from the committed JSON
    python benchmarks/scale/streaming.py --large          # the 224×224 case (--sizes 600,5000,20000)

1. Memory: an on-disk folder of 32×32 RGB PNGs (two classes) grows from 10k to
   100k files; each size is trained in a fresh subprocess (CODASCA, 4 clients,
   small CNN, 2 rounds × 4 local steps, batch 32, one evaluation at the end)
   once streamed (2 workers) and once in memory. Reported: the peak RSS of the
   training process and the largest peak RSS of its worker children
   (``resource.getrusage``: ``RUSAGE_SELF`` / ``RUSAGE_CHILDREN``), and their sum
   with one term per worker (an upper bound of the total).
2. Throughput (``--throughput``): training samples per second (K × B × local steps /
   seconds of ``run_round``, evaluation excluded) for the small CNN and ResNet20 on the
   first ``--sizes`` set, in memory, streamed with 0, 1 and 2 workers, and streamed from
   the decoded-image cache (``data.cache``, built once before the timed runs) with 0 and
   1 workers (``--models``: cnn, resnet20); median of ``--repeats`` runs, each in its own subprocess, the modes
   interleaved in one invocation, the load average recorded before every run.

3. ``--large``: real image sizes. Folders of 64×64 PNGs (600, 5k, 20k files) read at
   ``data.image_size = 224`` (resized by the reader), streamed with 1 worker at the default
   ``data.memory_budget`` and engine (``vmap``): CODASCA, K = 4, small CNN, 1 round × 2 local
   steps, batch 32, one evaluation (test set and every client's shard). Reported: peak RSS
   of the training process and of its worker, the budget, and how it was shared (clients per
   step, evaluation batch; ``data/budget.py``). Results: ``streaming_224.json`` and
   ``streaming_memory_224.md``.

Results: ``benchmarks/results/streaming.json`` (memory; its ``speed`` list is the
throughput measured before ``--throughput`` existed, no longer shown) with the table
``streaming_memory.md`` and figure ``docs/figures/streaming_memory.png``;
``streaming_throughput.json`` with the table ``streaming_throughput.md`` (shown in docs/data.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
FIGURE = ROOT / "docs" / "figures" / "streaming_memory.png"
SIZES = (10_000, 30_000, 100_000)
CLIENTS, BATCH = 4, 32


def make_images(root: Path, count: int, seed: int = 0, size: int = 32) -> Path:
    """``count`` size×size RGB PNGs in ``root/<count>/{a,b}`` (kept between invocations)."""
    from PIL import Image

    folder = root / (str(count) if size == 32 else f"{count}-{size}px")
    done = folder / ".complete"
    if done.exists():
        return folder
    rng = np.random.default_rng(seed)
    for c, name in enumerate(("a", "b")):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(count // 2):
            pixels = rng.integers(0, 160, (size, size, 3), dtype=np.uint8) + np.uint8(90 * c)
            Image.fromarray(pixels).save(folder / name / f"{i:06d}.png", compress_level=1)
    done.touch()
    return folder


def _config(
    data_dir: Path, stream: bool, workers: int, model: str, rounds: int, steps: int, cache: str | bool = False
):
    from fedxrisk.experiment import RunConfig

    return RunConfig(
        algorithm="codasca", dataset="folder", data_dir=str(data_dir), clients=CLIENTS, imratio=None,
        partition="iid", model=model, rounds=rounds, stages=1, local_steps=steps, batch_size=BATCH,
        engine="loop", stream=stream, workers=workers, eval_every=rounds, checkpoint_every=0,
        tensorboard=False, cache=cache, positive_classes=["b"],
    )  # fmt: skip


def child_memory(data_dir: Path, stream: bool, out: Path) -> dict:
    from fedxrisk.experiment import run_experiment

    start = time.perf_counter()
    run_experiment(_config(data_dir, stream, 2, "cnn", 2, 4), out)
    kib = 1024  # ru_maxrss is in KiB on Linux
    return {
        "main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib / 1e6,
        "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib / 1e6,
        "seconds": time.perf_counter() - start,
    }


LARGE_SIZES, LARGE_BATCH = (600, 5_000, 20_000), 32


def child_memory_224(data_dir: Path, out: Path) -> dict:
    """One streamed 224×224 run at the default budget and engine; its peak RSS and the budget's plan."""
    from fedxrisk.experiment import RunConfig, run_experiment

    cfg = RunConfig(
        algorithm="codasca", dataset="folder", data_dir=str(data_dir), clients=CLIENTS, imratio=None,
        partition="iid", model="cnn", rounds=1, stages=1, local_steps=2, batch_size=LARGE_BATCH,
        stream=True, workers=1, eval_every=1, checkpoint_every=0, tensorboard=False, image_size=224,
        positive_classes=["b"],
    )  # fmt: skip
    start = time.perf_counter()
    run_experiment(cfg, out)
    plan = json.loads((out / "summary.json").read_text())["data"]["stream"]["memory"]  # data/budget.py
    kib = 1024
    return {
        "main_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib / 1e6,
        "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib / 1e6,
        "seconds": time.perf_counter() - start,
        "eval_batch": plan["eval_batch"],
        "clients_per_step": plan["clients_per_step"],
        "budget_mb": plan["budget"] / 1e6,
        "engine": cfg.engine,
    }


def measure_224(work: Path, sizes: list[int]) -> dict:
    rows, start_load = [], os.getloadavg()[0]
    for n in sizes:
        folder = make_images(work / "images", n, size=64)
        r = _run_child(["memory224", str(folder), "1", str(work / f"run224-{n}-{time.time()}")])
        rows.append({"files": n, **r})
        print(rows[-1], flush=True)
    load = os.getloadavg()
    return {
        "memory": rows,
        "budget": "default (a quarter of the machine's RAM)",
        "batch": LARGE_BATCH,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs while measured "
        f"(1-minute load average {start_load:.1f} at the start, {load[0]:.1f} at the end)",
        "date": time.strftime("%Y-%m-%d"),
    }


def render_224(results: dict) -> None:
    lines = ["| image files (64×64 PNG, read at 224×224) | peak RSS, training process (MB) | peak RSS, worker (MB) "
             "| memory budget (MB) | clients per step | evaluation batch | seconds |",
             "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results["memory"]:
        lines.append(f"| {r['files']:,} | {r['main_mb']:.0f} | {r['worker_mb']:.0f} | {r['budget_mb']:.0f} "
                     f"| {r['clients_per_step']} | {r['eval_batch']} | {r['seconds']:.0f} |")  # fmt: skip
    engine = results["memory"][0]["engine"]
    note = (f"\n\ndata.memory_budget: {results['budget']}; batch {results['batch']}, engine {engine}; "
            f"{results['machine']}; one run per row, {results['date']}.\n")  # fmt: skip
    (RESULTS / "streaming_memory_224.md").write_text("\n".join(lines) + note)


def child_paired(data_dir: Path, cache: str, model: str, steps: int, repeats: int) -> dict:
    """The modes that decode nothing in the background, in ONE process, each timed for two rounds in
    turn, ``repeats`` turns: every mode sees the same load within seconds (uncached streams with
    workers are left out: their workers decode ahead while the other modes are timed)."""
    import torch

    from fedxrisk.experiment import build

    torch.set_num_threads(1)
    sims = {}
    for name, stream, workers, cached in PAIRED:
        cfg = _config(data_dir, stream, workers, model, 2 * repeats + 1, steps, cache if cached else False)
        sims[name] = build(cfg).simulation
        sims[name].run_round()  # warm-up
    runs: dict[str, list[float]] = {name: [] for name in sims}
    for _ in range(repeats):
        for name, sim in sims.items():
            start = time.perf_counter()
            sim.run_round()
            sim.run_round()
            runs[name].append(2 * steps * CLIENTS * BATCH / (time.perf_counter() - start))
    return {"runs": runs}


def child_speed(data_dir: Path, stream: bool, workers: int, model: str, steps: int, cache: str = "-") -> dict:
    import torch

    from fedxrisk.experiment import build

    torch.set_num_threads(1)
    setup = build(_config(data_dir, stream, workers, model, 3, steps, False if cache == "-" else cache))
    if cache != "-":
        assert not any(c["built"] for c in setup.stream.cache), "the cache is built before the timed runs"
    sim = setup.simulation
    sim.run_round()  # warm-up: first batches, allocator, worker start
    start = time.perf_counter()
    sim.run_round()
    sim.run_round()
    seconds = time.perf_counter() - start
    return {"samples_per_s": 2 * steps * CLIENTS * BATCH / seconds}


def _run_child(args: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(work: Path, sizes: list[int]) -> dict:
    memory = []
    for n in sizes:
        folder = make_images(work / "images", n)
        for stream in (True, False):
            r = _run_child(
                ["memory", str(folder), str(int(stream)), str(work / f"run-{n}-{stream}-{time.time()}")]
            )
            memory.append({"files": n, "streamed": stream, **r})
            print(memory[-1], flush=True)
    return {
        "memory": memory,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs while measured",
        "date": time.strftime("%Y-%m-%d"),
    }


SPEED_MODES = (
    [("in memory", False, 0, False)]
    + [(f"streamed, {w} workers", True, w, False) for w in (0, 1, 2)]
    + [(f"streamed + cache, {w} workers", True, w, True) for w in (0, 1)]
)


def prepare_cache(folder: Path, where: Path) -> dict:
    """Build (or check) the decoded-image cache of ``folder`` once, in this process, before any timing."""
    from fedxrisk.experiment import build

    start = time.perf_counter()
    [info] = build(_config(folder, True, 1, "cnn", 1, 1, str(where))).stream.cache
    return {**info, "seconds": time.perf_counter() - start}


PAIRED = [m for m in SPEED_MODES if m[3] or m[2] == 0]  # in memory, streamed 0 workers, + cache 0/1 workers
MODEL_STEPS = {"cnn": 10, "resnet20": 3}  # local steps per timed round
PAIRED_REPEATS = 9


def measure_paired(work: Path, files: int, models: list[str]) -> dict:
    folder = make_images(work / "images", files)
    where = work / "cache"
    prepare_cache(folder, where)
    paired, loads = [], [os.getloadavg()[0]]
    for model in models:
        args = [str(folder), "1", str(where), model, str(MODEL_STEPS[model]), str(PAIRED_REPEATS)]
        runs = _run_child(["paired", *args])["runs"]
        loads.append(os.getloadavg()[0])
        base = runs["in memory"]
        for name, values in runs.items():
            ratios = [v / b for v, b in zip(values, base)]  # against in memory in the same turn
            paired.append({"model": model, "mode": name, "samples_per_s": statistics.median(values),
                           "ratio": statistics.median(ratios), "ratios": ratios, "runs": values})  # fmt: skip
            print(paired[-1], flush=True)
    return {"paired": paired, "paired_load": loads, "paired_repeats": PAIRED_REPEATS}


def measure_speed(work: Path, files: int, repeats: int, models: list[str]) -> dict:
    folder = make_images(work / "images", files)
    where = work / "cache"
    cache = prepare_cache(folder, where)
    print(cache, flush=True)
    speed, loads = [], []
    for model in models:
        steps = MODEL_STEPS[model]
        runs: dict[str, list[float]] = {m[0]: [] for m in SPEED_MODES}
        for _ in range(repeats):  # interleaved: every mode sees the same load over time
            for name, stream, workers, cached in SPEED_MODES:
                loads.append(os.getloadavg()[0])
                args = [str(folder), str(int(stream)), str(workers), model, str(steps)]
                r = _run_child(["speed", *args, str(where) if cached else "-"])
                runs[name].append(r["samples_per_s"])
        base = statistics.median(runs["in memory"])
        for name, *_ in SPEED_MODES:
            med = statistics.median(runs[name])
            speed.append(
                {"model": model, "mode": name, "samples_per_s": med, "ratio": med / base, "runs": runs[name]}
            )
            print(speed[-1], flush=True)
    return {
        "files": files,
        "speed": speed,
        "cache": cache,
        "load": loads,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs while measured",
        "repeats": repeats,
        "date": time.strftime("%Y-%m-%d"),
    }


def render(results: dict) -> None:
    mem = ["| image files | mode | peak RSS, training process (MB) | peak RSS, largest worker (MB) | total bound (MB) | seconds |",
           "|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in results["memory"]:
        workers = 2 if r["streamed"] else 0
        total = r["main_mb"] + workers * r["worker_mb"]
        mode = "streamed (2 workers)" if r["streamed"] else "in memory"
        mem.append(f"| {r['files']:,} | {mode} | {r['main_mb']:.0f} | {r['worker_mb'] if workers else 0:.0f} "
                   f"| {total:.0f} | {r['seconds']:.0f} |")  # fmt: skip
    machine, date = results["machine"], results["date"]
    (RESULTS / "streaming_memory.md").write_text(
        "\n".join(mem) + f"\n\n{machine}; one run per row, {date}.\n"
    )
    _figure(results)


def render_speed(results: dict) -> None:
    speed = ["| model | data | samples/s (median) | runs | × in memory |", "|---|---|---:|---|---:|"]
    for r in results["speed"]:
        runs = ", ".join(f"{v:.0f}" for v in r["runs"])
        speed.append(f"| {r['model']} | {r['mode']} | {r['samples_per_s']:.0f} | {runs} | {r['ratio']:.2f} |")
    c, load = results["cache"], results["load"]
    note = (
        f"\n\n{results['files']:,} files; cache: {c['bytes'] / 1e6:.1f} MB, "
        f"{'built' if c['built'] else 'found complete and current'} in {c['seconds']:.0f} s before the timed "
        f"runs. {results['machine']} (1-minute load average {min(load):.1f}–{max(load):.1f} "
        f"before the runs); median of {results['repeats']} interleaved runs, {results['date']}.\n"
    )
    if "paired" in results:
        lines = ["| model | data | samples/s (median) | × in memory, same turn (median) | ratios |",
                 "|---|---|---:|---:|---|"]  # fmt: skip
        for r in results["paired"]:
            ratios = ", ".join(f"{v:.2f}" for v in r["ratios"])
            lines.append(
                f"| {r['model']} | {r['mode']} | {r['samples_per_s']:.0f} | {r['ratio']:.2f} | {ratios} |"
            )
        load = results["paired_load"]
        note += (
            f"\nOne process, every mode timed for two rounds in turn, {results['paired_repeats']} turns (load "
            f"average {min(load):.1f}–{max(load):.1f}):\n\n" + "\n".join(lines) + "\n"
        )
    (RESULTS / "streaming_throughput.md").write_text("\n".join(speed) + note)


def _figure(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    mem, stream = ([r for r in results["memory"] if r["streamed"] == s] for s in (False, True))
    ax.plot([r["files"] for r in mem], [r["main_mb"] for r in mem], "o-", label="in memory")
    ax.plot(
        [r["files"] for r in stream], [r["main_mb"] for r in stream], "o-", label="streamed: training process"
    )
    bound = [r["main_mb"] + 2 * r["worker_mb"] for r in stream]
    ax.plot([r["files"] for r in stream], bound, "o--", label="streamed: process + 2 workers (bound)")
    ax.set_xlabel("32×32 PNG files on disk")
    ax.set_ylabel("peak resident memory (MB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--render-only", action="store_true", help="re-render from benchmarks/results/streaming.json"
    )
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", default="/tmp/fedxrisk-streaming", help="where the images are generated")
    parser.add_argument("--large", action="store_true", help="the 224×224 memory case only (--sizes: files)")
    parser.add_argument(
        "--throughput", action="store_true", help="training throughput only, on the first --sizes set"
    )
    parser.add_argument(
        "--paired-only",
        action="store_true",
        help="--throughput's one-process measurement only (the rest kept)",
    )
    parser.add_argument(
        "--models", default="cnn,resnet20", help="--throughput: models to time (cnn, resnet20)"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, folder, stream, *rest = args.child
        if kind == "memory224":
            out = child_memory_224(Path(folder), Path(rest[0]))
        elif kind == "memory":
            out = child_memory(Path(folder), bool(int(stream)), Path(rest[0]))
        elif kind == "paired":
            out = child_paired(Path(folder), rest[0], rest[1], int(rest[2]), int(rest[3]))
        else:
            out = child_speed(Path(folder), bool(int(stream)), int(rest[0]), rest[1], int(rest[2]), rest[3])
        print(json.dumps(out))
        return
    if args.large:
        path = RESULTS / "streaming_224.json"
        if not args.render_only:
            sizes = LARGE_SIZES if args.sizes == ",".join(map(str, SIZES)) else args.sizes.split(",")
            path.write_text(
                json.dumps(measure_224(Path(args.work), [int(s) for s in sizes]), indent=2) + "\n"
            )
        render_224(json.loads(path.read_text()))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    speed_path = RESULTS / "streaming_throughput.json"
    if args.throughput or args.paired_only:
        models = args.models.split(",")
        if args.paired_only:  # the one-process measurement again, the separate-process one kept
            results = {
                **json.loads(speed_path.read_text()),
                **measure_paired(Path(args.work), sizes[0], models),
            }
            speed_path.write_text(json.dumps(results, indent=2) + "\n")
        elif not args.render_only:
            results = measure_speed(Path(args.work), sizes[0], args.repeats, models)
            results |= measure_paired(Path(args.work), sizes[0], models)
            speed_path.write_text(json.dumps(results, indent=2) + "\n")
        render_speed(json.loads(speed_path.read_text()))
        return
    path = RESULTS / "streaming.json"
    if not args.render_only:
        old = json.loads(path.read_text()) if path.exists() else {}
        results = measure(Path(args.work), sizes)
        path.write_text(json.dumps({**results, "speed": old.get("speed", [])}, indent=2) + "\n")
    render(json.loads(path.read_text()))
    if speed_path.exists():
        render_speed(json.loads(speed_path.read_text()))


if __name__ == "__main__":
    main()

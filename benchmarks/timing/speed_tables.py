"""docs/performance.md's speed tables, rendered from the committed reports of benchmarks/timing/speed.py.

``benchmarks/timing/speed.py ... --out docs/benchmarks/<run>`` writes ``speed.csv`` and ``speed.md``
(costly: 1 to 15 minutes per run). This script only reads those files and writes

- ``benchmarks/results/speed_targets.md``: the issue-9 targets (MLP within 1.3×, CNN within 1.5×);
- ``benchmarks/results/speed_<run>_k<K>.md``: step time per engine at one K (ratio to central);
- ``benchmarks/results/speed_over_k.md``: vmap and loop ratios over K;
- ``benchmarks/results/flower_fedavg.md``: the table of ``docs/benchmarks/flower.md``, the report of
  ``benchmarks/timing/flower_fedavg.py --report docs/benchmarks/flower.md`` (needs ``flwr[simulation]``).

    python benchmarks/timing/speed_tables.py
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "benchmarks"
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = ("central", "central_compiled", "loop", "vmap", "compile")
NAMES = {"mlp": "MLP", "cnn": "CNN", "resnet20": "ResNet20", "codasca": "CODASCA", "localsgdm": "LocalSGDM"}
TARGETS = {"mlp": 1.3, "cnn": 1.5}


def load(run: str) -> tuple[list[dict], str]:
    """Rows of ``docs/benchmarks/<run>/speed.csv`` and the clock its ratios use."""
    with open(RUNS / run / "speed.csv") as f:
        rows = [
            {k: (v if k in ("model", "algorithm", "variant") else float(v)) for k, v in r.items()}
            for r in csv.DictReader(f)
        ]
    clock = re.search(r"Ratios use the (\w+) clock", (RUNS / run / "speed.md").read_text()).group(1)
    return rows, clock


def ms(row: dict, clock: str) -> float:
    return row["step_cpu_ms"] if clock == "cpu" else row["step_ms"]


def num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def step_table(
    run: str, clients: int, algorithms: tuple[str, ...] = ("codasca", "localsgdm"), memory: bool = False
) -> str:
    """ms per local step (ratio to the eager central step) for every engine at ``clients``.

    ``memory``: a second table with the stacked state, the peak memory growth of a step and the
    wall time of a whole round, per engine.
    """
    rows, clock = load(run)
    present = [v for v in VARIANTS if any(r["variant"] == v and r["clients"] == clients for r in rows)]
    lines = [
        f"| model | algorithm | {' | '.join(v.replace('_', ' ') for v in present)} |",
        "|---|---|" + "---|" * len(present),
    ]
    mem = ["| model | algorithm | engine | state MB | peak step memory MB | s per round (wall) |"]
    mem.append("|---|---|---|---|---|---|")
    for model in dict.fromkeys(r["model"] for r in rows):
        for alg in algorithms:
            got = {
                r["variant"]: r
                for r in rows
                if (r["model"], r["algorithm"], r["clients"]) == (model, alg, clients)
            }
            if not got:
                continue
            cells = []
            for v in present:
                r = got.get(v)
                if r is None:
                    cells.append("—")
                elif v == "central":
                    cells.append(num(ms(r, clock)))
                else:
                    cells.append(f"{num(ms(r, clock))} ({num(r['ratio'])})")
                if r is not None:
                    per_round = "—" if math.isnan(r["round_s"]) else num(r["round_s"])
                    mem.append(
                        f"| {NAMES[model]} | {NAMES[alg]} | {v.replace('_', ' ')} | {num(r['state_mb'])} "
                        f"| +{num(r['peak_rss_mb'])} | {per_round} |"
                    )
            lines.append(f"| {NAMES[model]} | {NAMES[alg]} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + f"\n\nms per local step ({clock} clock), ratio to `central` in brackets.\n"
    return text + ("\n" + "\n".join(mem) + "\n" if memory else "")


def over_k_table(runs: tuple[str, ...] = ("cpu", "resnet20", "resnet20_k16")) -> str:
    """Ratio to the central step of vmap and loop for every K measured (CODASCA and LocalSGDM)."""
    by = {}
    for run in runs:
        rows, _ = load(run)
        for r in rows:
            if r["algorithm"] in ("codasca", "localsgdm") and r["variant"] in ("vmap", "loop"):
                by.setdefault((r["model"], r["algorithm"], r["variant"]), {})[int(r["clients"])] = r["ratio"]
    ks = sorted({k for d in by.values() for k in d})
    lines = ["| model | algorithm | engine | " + " | ".join(f"K = {k}" for k in ks) + " |"]
    lines.append("|---|---|---|" + "---|" * len(ks))
    for (model, alg, variant), d in by.items():
        cells = [num(d[k]) if k in d and not math.isnan(d[k]) else "—" for k in ks]
        lines.append(f"| {NAMES[model]} | {NAMES[alg]} | {variant} | " + " | ".join(cells) + " |")
    return (
        "\n".join(lines)
        + "\n\nRatio of the step time to the eager central step on K·B samples (CPU clock).\n"
    )


def targets_table(run: str = "cpu", clients: int = 64) -> str:
    """The issue-9 targets: the best engine's K-client CODASCA step against the eager central step."""
    rows, clock = load(run)
    lines = [
        f"| target (K = {clients} local step of CODASCA, B = 32) | limit: eager central step | best engine "
        f"| ratio ({clock.upper() if clock == 'cpu' else clock} clock, 1 thread) | met | vs compiled central "
        "| first call, s (compilation) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, target in TARGETS.items():
        got = {
            r["variant"]: r
            for r in rows
            if (r["model"], r["algorithm"], r["clients"]) == (model, "codasca", clients)
        }
        engines = {v: got[v] for v in ("loop", "vmap", "compile") if v in got}
        best = min(engines, key=lambda v: engines[v]["ratio"])
        others = ", ".join(f"{v} {num(engines[v]['ratio'])}×" for v in engines if v != best)
        ratio = engines[best]["ratio"]
        lines.append(
            f"| {NAMES[model]} within {target}× | {num(ms(got['central'], clock))} ms "
            f"| `{best}` {num(ms(engines[best], clock))} ms | **{ratio:.2f}×** ({others}) "
            f"| {'yes' if ratio <= target else 'no'} | {num(engines[best]['ratio_compiled'])}× "
            f"| {num(engines[best]['first_call_s'])} |"
        )
    return "\n".join(lines) + "\n"


def flower_table(report: Path = RUNS / "flower.md") -> str:
    """The Markdown table of the Flower comparison's report, verbatim."""
    return "\n".join(line for line in report.read_text().splitlines() if line.startswith("|")) + "\n"


def tables() -> dict[str, str]:
    """File name under benchmarks/results → its Markdown."""
    return {
        "speed_targets.md": targets_table(),
        "speed_cpu_k64.md": step_table("cpu", 64),
        "speed_over_k.md": over_k_table(),
        "speed_resnet20_k16.md": step_table("resnet20_k16", 16, ("codasca",), memory=True),
        "speed_k1024.md": step_table("k1024", 1024, memory=True),
        "speed_k64_wall.md": step_table("k64_wall", 64),
        "flower_fedavg.md": flower_table(),
    }


def main() -> None:
    for name, text in tables().items():
        (RESULTS / name).write_text(text)
        print(f"## {name}\n{text}")


if __name__ == "__main__":
    main()

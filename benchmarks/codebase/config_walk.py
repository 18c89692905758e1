"""How far a setting walks through the code (issue 39, item 5): from ``run_experiment`` to its use.

A tiny run (digits, 2 clients, 2 rounds) is traced with :func:`sys.setprofile`; each setting is
given a value no other code produces (a distinctive float) and every Python function call that
receives that value as an argument — itself, or inside a dict, list or tuple argument, or as an
attribute of a dataclass argument other than the whole ``RunConfig`` — is a *stay*. Counted: the
distinct functions (file, name) it stays in and their distinct files, from ``run_experiment`` on.
Passing the whole config object is not counted (every layer receives it); reading
``cfg.setting`` inside a function is not seen by the tracer, so the count is the value's hand-offs
after it leaves the config, a lower bound of the walk a reader follows.

    python benchmarks/codebase/config_walk.py      # writes benchmarks/results/config_walk{,_stays}.md (seconds)
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "config_walk.md"  # the table the docs show
STAYS = ROOT / "benchmarks" / "results" / "config_walk_stays.md"  # each function, by file
PACKAGE = str(ROOT / "src" / "fedxrisk")
# setting → (RunConfig field changes, the sentinel value the tracer looks for)
SETTINGS: dict[str, tuple[dict[str, Any], float]] = {
    "algorithm.lr": ({"lr": 0.0271828}, 0.0271828),
    "server.lr": ({"server": {"optimizer": "adam", "lr": 0.0314159}}, 0.0314159),
    "privacy.clip": ({"privacy": {"level": "client", "clip": 0.7071067, "noise_multiplier": 0.5}}, 0.7071067),
    "data.validation": ({"validation": 0.2357022, "selection": "best"}, 0.2357022),
}
BASE = dict(dataset="digits", clients=2, rounds=2, stages=1, local_steps=1, batch_size=8, eval_every=1,
            checkpoint_every=0, tensorboard=False)  # fmt: skip


def _holds(value: Any, sentinel: float, depth: int = 0) -> bool:
    if isinstance(value, float):
        return value == sentinel
    if depth > 2:
        return False
    if isinstance(value, dict):
        return any(_holds(v, sentinel, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds(v, sentinel, depth + 1) for v in value[:16])
    if (
        dataclasses.is_dataclass(value)
        and not isinstance(value, type)
        and type(value).__name__ != "RunConfig"
    ):
        return any(
            _holds(getattr(value, f.name, None), sentinel, depth + 1) for f in dataclasses.fields(value)
        )
    return False


def walk(setting: str) -> tuple[set[tuple[str, str]], int]:
    """The (file, function) stays of ``setting``'s value during a traced tiny run, and the calls seen."""
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.spec import RunConfig

    changes, sentinel = SETTINGS[setting]
    cfg = RunConfig(**BASE, **changes)
    stays: set[tuple[str, str]] = set()
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        calls += 1
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(_holds(frame.f_locals.get(n), sentinel) for n in names):
            stays.add((os.path.relpath(code.co_filename, PACKAGE), code.co_qualname))

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sys.setprofile(profile)
        try:
            run_experiment(cfg, Path(tmp) / "run")
        finally:
            sys.setprofile(None)
    return stays, calls


def main() -> None:
    lines = [
        "A setting's walk from `run_experiment` to its use: the functions that receive its value as an "
        "argument (itself, or in a dict, list or settings object; not the whole config) during a tiny "
        "traced run, and their files. `python benchmarks/codebase/config_walk.py`",
        "",
        "| setting | functions it stays in | files | fedxrisk calls traced |",
        "|---|---|---|---|",
    ]
    details = []
    for setting in SETTINGS:
        stays, calls = walk(setting)
        files = sorted({f for f, _ in stays})
        lines.append(f"| `{setting}` | {len(stays)} | {len(files)} | {calls:,} |")
        details.append(f"- `{setting}`: " + "; ".join(
            f"`{f}` ({', '.join(sorted(n for g, n in stays if g == f))})" for f in files))  # fmt: skip
    OUT.write_text(
        "\n".join([*lines, "", "Each function, by file: `benchmarks/results/config_walk_stays.md`.", ""])
    )
    STAYS.write_text(
        "\n".join(
            [
                "Where each setting's value stays (`python benchmarks/codebase/config_walk.py`):",
                "",
                *details,
                "",
            ]
        )
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""How far a setting walks through the code (issue 39, item 5): from ``run_experiment`` to its use.

A tiny run (digits, 2 clients, 2 rounds) is traced with :func:`sys.setprofile`; each setting is
given a value no other code produces (a distinctive float) and every Python function call that
receives that value as an argument — itself, or inside a dict, list or tuple argument, or as an
attribute of a dataclass argument other than the whole ``RunConfig`` — is a *stay*. Counted: the
distinct functions (file, name) it stays in and their distinct files, from ``run_experiment`` on.
Passing the whole config object is not counted (every layer receives it); reading
``cfg.setting`` inside a function is not seen by the tracer, so the count is the value's hand-offs
after it leaves the config, a lower bound of the walk a reader follows. The *path* adds every
function on the call stacks from ``run_experiment`` down to each stay that uses the value (stays in
``OUTPUTS``, which write or echo it, excluded): what a reader follows from the entry to the uses.
The last row follows the ``RunConfig`` object itself. The same walk runs on ``BASELINE`` (the
main issue 39's review walked, in a temporary worktree) so the two counts share one method;
the review's own count (102 stays in 43 files) used a method not recorded, so it is not
comparable with these numbers.

    python benchmarks/codebase/config_walk.py      # writes benchmarks/results/config_walk{,_stays}.md (seconds)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "config_walk.md"  # the table the docs show
STAYS = ROOT / "benchmarks" / "results" / "config_walk_stays.md"  # each function, by file
# where a value is written out or echoed rather than used to train: not a "use" for the path measure
OUTPUTS = ("run/folder.py", "run/configfile.py", "run/configtypes.py", "run/identity.py", "run/callbacks.py",
           "run/privacy_outputs.py", "run/spec.py", "run/schema.py")  # fmt: skip
# setting → (RunConfig field changes, the sentinel value the tracer looks for)
SETTINGS: dict[str, tuple[dict[str, Any], float | None]] = {
    "algorithm.lr": ({"lr": 0.0271828}, 0.0271828),
    "server.lr": ({"server": {"optimizer": "adam", "lr": 0.0314159}}, 0.0314159),
    "privacy.clip": ({"privacy": {"level": "client", "clip": 0.7071067, "noise_multiplier": 0.5}}, 0.7071067),
    "data.validation": ({"validation": 0.2357022, "selection": "best"}, 0.2357022),
    "the whole config (the `RunConfig` object)": ({}, None),
}
BASELINE = "2b0f96c"  # the main that issue 39's review walked (102 stays in 43 files by its count)
BASE = dict(dataset="digits", clients=2, rounds=2, stages=1, local_steps=1, batch_size=8, eval_every=1,
            checkpoint_every=0, tensorboard=False)  # fmt: skip


def _holds(value: Any, sentinel: float | None, depth: int = 0) -> bool:
    if sentinel is None:  # the whole config: the RunConfig object itself
        return type(value).__name__ == "RunConfig"
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


def walk(setting: str) -> tuple[set[tuple[str, str]], set[tuple[str, str]], int]:
    """The (file, function) stays of ``setting``'s value during a traced tiny run, the (file,
    function) frames on the call stacks from ``run_experiment`` down to each stay outside
    ``OUTPUTS`` (the path a reader follows from the entry to the value's uses), and the calls seen."""
    import fedxrisk
    from fedxrisk.run.recipes import run_experiment
    from fedxrisk.run.spec import RunConfig

    package = str(Path(fedxrisk.__file__).parent)  # this tree's, or the baseline's in its child
    changes, sentinel = SETTINGS[setting]
    cfg = RunConfig(**BASE, **changes)
    stays: set[tuple[str, str]] = set()
    path: set[tuple[str, str]] = set()
    calls = 0

    def where(code: Any) -> tuple[str, str]:
        return os.path.relpath(code.co_filename, package), code.co_qualname

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event != "call" or not frame.f_code.co_filename.startswith(package):
            return
        calls += 1
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(_holds(frame.f_locals.get(n), sentinel) for n in names):
            stays.add(where(code))
            if where(code)[0] not in OUTPUTS:
                f = frame
                while f is not None and f.f_code.co_filename.startswith(package):
                    path.add(where(f.f_code))
                    f = f.f_back

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sys.setprofile(profile)
        try:
            run_experiment(cfg, Path(tmp) / "run")
        finally:
            sys.setprofile(None)
    return stays, path, calls


def counts() -> dict[str, dict[str, Any]]:
    """Every setting's walk in the fedxrisk imported here."""
    out = {}
    for setting in SETTINGS:
        stays, path, calls = walk(setting)
        out[setting] = {
            "stays": sorted(map(list, stays)),
            "path": sorted(map(list, path)),
            "calls": calls,
        }
    return out


def baseline_counts(rev: str) -> dict[str, dict[str, Any]]:
    """The same walk on the source of commit ``rev`` (a temporary worktree, a child process)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev], check=True
        )
        try:
            env = {**os.environ, "PYTHONPATH": str(tree / "src")}
            done = subprocess.run([sys.executable, __file__, "--json"], env=env, check=True,
                                  capture_output=True, text=True)  # fmt: skip
            return json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def _n(walks: dict[str, Any], setting: str, part: str) -> tuple[int, int]:
    items = walks[setting][part]
    return len(items), len({f for f, _ in items})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", default=BASELINE, help="the commit to compare with (default %(default)s)"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child's answer
    args = parser.parse_args()
    if args.json:
        print(json.dumps(counts()))
        return
    now, before = counts(), baseline_counts(args.baseline)
    lines = [
        "A setting's walk from `run_experiment` to its use, traced in a tiny run, on this source and "
        f"on `{args.baseline}` (the review of issue 39), the same method on both: *stays* are the "
        "functions that receive the setting's value as an argument (itself, or in a dict, list or "
        "settings object; not the whole config), outputs included; the *path* is every function on the "
        "call stacks from `run_experiment` down to each stay that uses the value (outside the modules "
        "that write or echo it: " + ", ".join(f"`{m}`" for m in OUTPUTS) + "). "
        "`python benchmarks/codebase/config_walk.py`",
        "",
        "| setting | stays: functions / files | path: functions / files | "
        f"on {args.baseline}: stays | on {args.baseline}: path |",
        "|---|---|---|---|---|",
    ]
    details = []
    for setting in SETTINGS:
        cells = [
            f"{a} / {b}"
            for a, b in (_n(w, setting, part) for w in (now, before) for part in ("stays", "path"))
        ]
        label = setting if " " in setting else f"`{setting}`"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        stays = now[setting]["stays"]
        files = sorted({f for f, _ in stays})
        details.append(f"- {label}: " + "; ".join(
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

"""Which source produced each committed result, so a result cannot silently go stale (issue 21).

Every ``[[bench]]`` of ``benchmarks/REBUILD.toml`` lists the files it writes
that the docs show (``results``, globs relative to the repository root). When a
benchmark runs, the sha256 of every ``fedxrisk`` source file its process
imported, by path relative to the repository root, is written with the commit
to ``benchmarks/results/provenance.json`` under the benchmark's name:

    python benchmarks/provenance.py run NAME -- python benchmarks/STUDY/x.py ARGS   # run, then record
    python benchmarks/provenance.py status                                  # every bench, one line, by study folder

``status`` is the list of every study with its cost: each record keeps the wall time and CPU time
the last run took and the machine's load average when it started (REBUILD.toml's ``cheap`` flag
says which run under 2 minutes).

(``python benchmarks/docs.py --rebuild`` runs every command that way; a
benchmark with ``records = "script"`` records itself, e.g. ``evidence.py``
from the per-cell fingerprints its results carry.) ``python benchmarks/docs.py
--check`` then fails on a result whose recorded files changed or disappeared
since, naming the result, its benchmark and the files, until it is rerun or the
bench is marked ``kept = "why"`` in REBUILD.toml; the reason is then printed
under the result in every doc that shows it.

After a refactor that moves or splits modules with behaviour unchanged bit for
bit, the moved files show as missing and the new ones are not in the record, so
the check fails for every result that imported them. The remedy is not to
edit the record: rerun the benchmark (or, for the evidence study,
``python benchmarks/evidence/run.py --verify REGIME``, which reruns seed 0 of every
row, requires bit-for-bit equal metrics and curves, and only then records the
new fingerprint), or mark it kept with the reason. Only the parent process's
imports can be seen: for a benchmark that imports fedxrisk only in worker
processes (or CLI subprocesses), every file of the package is recorded, so any
change to ``src/fedxrisk`` makes its results stale.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import hashlib
import json
import os
import resource
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path("benchmarks") / "results" / "provenance.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fingerprint(modules: dict[str, Any] | None = None, root: Path = ROOT) -> dict[str, str]:
    """{path relative to ``root``: sha256} of every imported ``fedxrisk`` module's file."""
    files = {}
    for name, mod in sorted((sys.modules if modules is None else modules).items()):
        path = getattr(mod, "__file__", None)
        if name.split(".")[0] != "fedxrisk" or not path:
            continue
        p = Path(path).resolve()
        if not p.is_relative_to(root):
            raise SystemExit(
                f"provenance: {name} was imported from {p}, outside {root} (set PYTHONPATH={root}/src)"
            )
        files[p.relative_to(root).as_posix()] = sha256(p)
    return files


def package_fingerprint(root: Path = ROOT) -> dict[str, str]:
    """{path: sha256} of every file of the ``fedxrisk`` package (for benchmarks that import it only
    in subprocesses, so the parent cannot tell which modules they used: all of them count)."""
    package = root / "src" / "fedxrisk"
    return {
        p.relative_to(root).as_posix(): sha256(p)
        for p in sorted(package.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".json") and "__pycache__" not in p.parts
    }


def git(*args: str, root: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()


def load(root: Path = ROOT) -> dict[str, Any]:
    path = root / RECORD
    return json.loads(path.read_text()) if path.exists() else {}


def record(bench: str, files: dict[str, str], root: Path = ROOT, commit: str | None = None,
           note: str = "", cost: dict[str, float] | None = None) -> dict[str, Any]:  # fmt: skip
    """Write (replace) ``bench``'s entry: commit, whether src/ had uncommitted changes, files, and
    what the run cost (``cost``: wall and CPU seconds, load average at its start)."""
    entry = {
        "commit": commit or git("rev-parse", "HEAD", root=root),
        "src_dirty": bool(git("status", "--porcelain", "--", "src", root=root)),
        "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "files": dict(sorted(files.items())),
    }
    if note:
        entry["note"] = note
    if cost:
        entry["cost"] = cost
    everything = load(root)
    everything[bench] = entry
    (root / RECORD).write_text(json.dumps(dict(sorted(everything.items())), indent=1) + "\n")
    return entry


def benches(root: Path = ROOT) -> list[dict[str, Any]]:
    path = root / "benchmarks" / "REBUILD.toml"
    return tomllib.loads(path.read_text())["bench"] if path.exists() else []


def bench_of(result: str, root: Path = ROOT) -> dict[str, Any] | None:
    """The first [[bench]] whose ``results`` globs match ``result`` (a path relative to root)."""
    for bench in benches(root):
        if any(fnmatch.fnmatch(result, pattern) for pattern in bench.get("results", [])):
            return bench
    return None


def changed(files: dict[str, str], root: Path = ROOT) -> list[str]:
    """The recorded files whose content differs now ("path (changed)") or that are gone."""
    out = []
    for rel, digest in sorted(files.items()):
        p = root / rel
        if not p.is_file():
            out.append(f"{rel} (missing)")
        elif sha256(p) != digest:
            out.append(f"{rel} (changed)")
    return out


def problems(results: list[str], root: Path = ROOT) -> list[str]:
    """One line per shown result whose source is not known to be the current one (and not kept)."""
    recorded, out = load(root), []
    for result in results:
        bench = bench_of(result, root)
        if bench is None:
            out.append(f"{result}: no [[bench]] in benchmarks/REBUILD.toml lists it in `results`")
            continue
        if bench.get("kept"):
            continue
        name, entry = bench["name"], recorded.get(bench["name"])
        if entry is None:
            out.append(f"{result}: bench {name!r} has no recorded source; rerun it "
                       f"(python benchmarks/docs.py --rebuild) or mark it kept = \"why\" in REBUILD.toml")  # fmt: skip
            continue
        diff = changed(entry["files"], root)
        if diff:
            out.append(f"{result}: bench {name!r} ran at {entry['commit'][:10]}; its source changed since: "
                       + ", ".join(diff) + f"; rerun `{bench['command']}` or mark it kept")  # fmt: skip
    return out


def kept_note(result: str, root: Path = ROOT) -> str:
    """The paragraph a doc shows right after a kept result's region (empty when not kept)."""
    bench = bench_of(result, root)
    if bench is None or not bench.get("kept"):
        return ""
    return f"\n\n*Kept without a rerun: {bench['kept']}*"


def run(name: str, command: list[str], root: Path = ROOT) -> None:
    """Run a ``python script.py ARGS`` command in this process, then record what it imported."""
    if (
        len(command) < 2
        or Path(command[0]).name not in ("python", "python3")
        or not command[1].endswith(".py")
    ):
        raise SystemExit(f"provenance run: expected `python SCRIPT.py ARGS`, got {' '.join(command)!r}")
    sys.argv = command[1:]
    sys.path.insert(0, str((root / command[1]).parent))
    load_at_start, wall, cpu = os.getloadavg()[0], time.perf_counter(), _cpu_seconds()
    runpy.run_path(str(root / command[1]), run_name="__main__")
    cost = {"wall_s": round(time.perf_counter() - wall, 1), "cpu_s": round(_cpu_seconds() - cpu, 1),
            "load_at_start": round(load_at_start, 2)}  # fmt: skip
    files, note = fingerprint(root=root), ""
    if not files:  # fedxrisk ran in subprocesses only: any change to the package makes it stale
        files = package_fingerprint(root)
        note = "imported fedxrisk in subprocesses only: every file of the package is recorded"
    record(name, files, root, note=note, cost=cost)
    print(f"provenance: recorded {len(files)} source files for {name}" + (f" ({note})" if note else ""))


def _cpu_seconds() -> float:
    """CPU time of this process and of the children it waited for (worker processes count)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cost_words(entry: dict[str, Any] | None, bench: dict[str, Any]) -> str:
    """What a bench costs: its last run's measured wall and CPU time, else REBUILD.toml's flag."""
    cost = (entry or {}).get("cost")
    if cost:
        return (f"took {cost['wall_s'] / 60:.1f} min wall, {cost['cpu_s'] / 60:.1f} min CPU "
                f"(load {cost['load_at_start']:g} at start)")  # fmt: skip
    return "under 2 min (cheap)" if bench.get("cheap") else "cost not measured (not cheap)"


def status(root: Path = ROOT) -> list[str]:
    recorded, lines = load(root), []
    for bench in benches(root):
        entry = recorded.get(bench["name"])
        if entry is None:
            state = "no record"
        else:
            diff = changed(entry["files"], root)
            state = f"ran at {entry['commit'][:10]}, " + (
                f"{len(diff)} files changed since" if diff else "source unchanged"
            )
        kept = f"; kept: {bench['kept']}" if bench.get("kept") else ""
        lines.append(f"{bench['name']}: {state}; {cost_words(entry, bench)}{kept}")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a benchmark command, then record its source")
    r.add_argument("name")
    r.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("status", help="every registered benchmark in one line: its state and its cost")
    args = p.parse_args(argv)
    if args.cmd == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        run(args.name, command)
    else:
        print("\n".join(by_folder(benches(), status())))


def by_folder(registered: list[dict[str, Any]], lines: list[str]) -> list[str]:
    """``status``'s lines under the folder of each bench's script (its study), folders in
    REBUILD.toml's order."""
    groups: dict[str, list[str]] = {}
    for bench, line in zip(registered, lines):
        words = bench["command"].split()
        folder = Path(words[1]).parent.as_posix() if len(words) > 1 else "?"
        groups.setdefault(folder, []).append(f"  {line}")
    return [row for folder, rows in groups.items() for row in (f"{folder}/", *rows)]


if __name__ == "__main__":
    main()

"""Generated regions of the docs: every measured table comes from a committed results file.

A region in README.md or docs/**/*.md is

    <!-- BEGIN GENERATED benchmarks/results/<name>.md -->
    (the exact content of that file)
    <!-- END GENERATED -->

    python benchmarks/docs.py                    # re-render every region from its file
    python benchmarks/docs.py --check            # exit 1: stale regions, results whose source changed
    python benchmarks/docs.py --rebuild --cheap  # run the cheap benchmarks of REBUILD.toml, then render
    python benchmarks/docs.py --rebuild          # run every benchmark (hours), then render

``benchmarks/REBUILD.toml`` registers each benchmark as ``[[bench]]`` with
``name``, ``command`` (run from the repository root, with ``src`` on
PYTHONPATH), ``cheap`` (under 2 minutes on the 2-core CI machine), ``results``
(globs of the files it writes that docs show) and optionally ``kept = "why"``
(a result not rerun although its source changed; the reason is printed under
it in the docs) and ``records = "script"`` (the script records its own source).

``--check`` also fails on a shown result whose source changed since it ran:
see ``benchmarks/provenance.py`` for the record, and for what to do after a
refactor moves modules (rerun and confirm bit-for-bit equality, then the new
fingerprint is recorded; never edit the record by hand).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # benchmarks/provenance.py, without leaving benchmarks/ on the path
    sys.path.insert(0, _HERE)
    import provenance  # noqa: E402

    sys.path.remove(_HERE)
else:
    import provenance  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# a region, then (for a kept result) the kept note on its own paragraph right after it
REGION = re.compile(
    r"(<!-- BEGIN GENERATED (\S+) -->\n)(.*?)(<!-- END GENERATED -->)(\n\n\*Kept without a rerun: [^\n]*\*)?",
    re.S,
)


@dataclass
class Region:
    doc: Path
    line: int
    source: str  # path of the results file, relative to the repository root
    body: str
    note: str = ""  # the kept note after the region, if any

    def expected(self, root: Path) -> str | None:
        path = root / self.source
        return path.read_text() if path.is_file() else None

    def where(self, root: Path) -> str:
        return f"{self.doc.relative_to(root)}:{self.line}"


def docs(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def regions(root: Path = ROOT) -> list[Region]:
    found = []
    for doc in docs(root):
        text = doc.read_text()
        for m in REGION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(Region(doc, line, m.group(2), m.group(3), m.group(5) or ""))
    return found


def stale(root: Path = ROOT) -> list[str]:
    """One line per region whose body differs from its file (or whose file is missing)."""
    problems = []
    for r in regions(root):
        want = r.expected(root)
        if want is None:
            problems.append(f"{r.where(root)}: {r.source} does not exist")
        elif want != r.body:
            problems.append(f"{r.where(root)}: differs from {r.source}")
        elif r.note != provenance.kept_note(r.source, root):
            problems.append(f"{r.where(root)}: the kept note under it differs from REBUILD.toml's `kept`")
    return problems


def outdated(root: Path = ROOT) -> list[str]:
    """One line per shown result whose recorded source changed since it ran (unless kept)."""
    return provenance.problems(sorted({r.source for r in regions(root)}), root)


def render(root: Path = ROOT) -> list[Path]:
    """Rewrite every region from its file; returns the docs that changed."""
    missing = [
        f"{r.where(root)}: {r.source} does not exist" for r in regions(root) if r.expected(root) is None
    ]
    if missing:
        raise SystemExit("\n".join(missing))
    changed = []
    for doc in docs(root):
        text = doc.read_text()
        new = REGION.sub(
            lambda m: (
                m.group(1)
                + (root / m.group(2)).read_text()
                + m.group(4)
                + provenance.kept_note(m.group(2), root)
            ),
            text,
        )
        if new != text:
            doc.write_text(new)
            changed.append(doc)
    return changed


def benches(root: Path = ROOT) -> list[dict]:
    return tomllib.loads((root / "benchmarks" / "REBUILD.toml").read_text())["bench"]


def rebuild(cheap_only: bool, root: Path = ROOT) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")])}
    for bench in benches(root):
        if cheap_only and not bench.get("cheap", False):
            continue
        print(f"[{bench['name']}] {bench['command']}", flush=True)
        command = shlex.split(bench["command"])
        if bench.get("records") != "script":  # record the source the run imported
            command = [sys.executable, "benchmarks/provenance.py", "run", bench["name"], "--", *command]
        subprocess.run(command, cwd=root, env=env, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a region or its result's source is stale")
    p.add_argument("--rebuild", action="store_true", help="run the benchmarks of REBUILD.toml first")
    p.add_argument("--cheap", action="store_true", help="with --rebuild: only those marked cheap")
    args = p.parse_args()
    if args.check:
        problems = stale() + outdated()
        for line in problems:
            print(line)
        sys.exit(1 if problems else 0)
    if args.rebuild:
        rebuild(args.cheap)
    for doc in render():
        print(f"updated {doc.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

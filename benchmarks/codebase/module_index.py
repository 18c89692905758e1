"""Every module of ``src/fedxrisk`` with the first sentence of its docstring: the index at the end
of docs/architecture.md, generated from the code so that it cannot go stale (issue 39 item 5).

    python benchmarks/codebase/module_index.py            # rewrite the index region of docs/architecture.md
    python benchmarks/codebase/module_index.py --check    # exit 1 if the committed index differs

``tests/test_module_index.py`` runs the check and requires a docstring in every module.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "fedxrisk"
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- BEGIN MODULE INDEX (python benchmarks/codebase/module_index.py) -->"
END = "<!-- END MODULE INDEX -->"
ABBREVIATIONS = {"Alg", "Algs", "Eq", "Eqs", "al", "Fig", "Sec", "Thm", "vs", "cf", "e.g", "i.e", "No"}


def first_sentence(text: str) -> str:
    """The docstring's first sentence, on one line (up to the first '. ' or blank line)."""
    paragraph = re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0]
    line = " ".join(paragraph.split())
    for cut in re.finditer(r"(\w+)\.\s+(?=[A-Z(`])", line):  # not after Alg., Eq., et al., …
        if cut.group(1) not in ABBREVIATIONS:
            line = line[: cut.start(1) + len(cut.group(1)) + 1]
            break
    return line.replace("|", "\\|")


def modules() -> list[tuple[str, str | None]]:
    """(path relative to src/fedxrisk, its docstring's first sentence or None) for every module."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text()))
        out.append((path.relative_to(PACKAGE).as_posix(), first_sentence(doc) if doc else None))
    return out


def render() -> str:
    rows = [f"| `{name}` | {job or '(no docstring)'} |" for name, job in modules()]
    return "\n".join(
        [BEGIN, "", f"Every module ({len(rows)}), from its docstring:", "", "| module | job |", "|---|---|", *rows,
         "", END]
    )  # fmt: skip


def with_index(doc: str) -> str:
    """``doc`` with its index region replaced (appended under "## Module index" when absent)."""
    if BEGIN in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + render() + rest.split(END, 1)[1]
    return doc.rstrip("\n") + "\n\n## Module index\n\n" + render() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/architecture.md's index is stale")
    args = p.parse_args(argv)
    current = DOC.read_text()
    wanted = with_index(current)
    if args.check:
        if wanted != current:
            print(
                "docs/architecture.md's module index is stale: run python benchmarks/codebase/module_index.py"
            )
            return 1
        return 0
    DOC.write_text(wanted)
    print(f"wrote the module index of {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

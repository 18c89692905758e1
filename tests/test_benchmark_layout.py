"""benchmarks/ shows its architecture (issue 39, item 5): one folder per study, shared helpers in
``benchmarks/common``, no import circles (a study's report imports the study, never its runner),
no study importing another study, every REBUILD.toml command naming a script that exists, and
benchmarks/README.md listing every folder. Parsed with ``ast``: nothing is imported or run."""

from __future__ import annotations

import ast
import shlex
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("benchmarks.common", "benchmarks.docs", "benchmarks.provenance")  # any study may import these


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the benchmark modules it imports}, imports inside functions included. A flat
    ``import x`` names the sibling ``x.py`` (how a script started as a file finds it); a module
    importing itself (peers.py, for Ray's workers) is not a circle."""
    files = {module_name(p, root): p for p in (root / "benchmarks").rglob("*.py") if "results" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def find(target: str, package: str = package) -> str | None:
            return next((c for c in (target, f"{package}.{target}") if c in files), None)

        resolved: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                resolved |= {find(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                # `from a.b import c`: the module a.b.c if there is one, else a name of a.b
                resolved |= {find(f"{base}.{alias.name}") or find(base) for alias in node.names}
        graph[name] = {m for m in resolved if m is not None} - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle found by a depth-first walk (each as the path that closes it)."""
    found, state = [], {}  # state: 1 on the current path, 2 done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return found


def test_no_import_circle_among_the_benchmarks():
    graph = import_graph()
    assert len(graph) > 50, "the benchmarks were not found"
    assert graph["benchmarks.evidence.run"] >= {"benchmarks.evidence.study", "benchmarks.evidence.report"}
    assert cycles(graph) == [], "a report imports its study, never the runner that renders it"


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    """The check can fail: a runner importing its report inside a function, the report importing
    the runner (the circle benchmarks/ had before issue 39)."""
    study = tmp_path / "benchmarks" / "study"
    study.mkdir(parents=True)
    (study / "run.py").write_text("def render():\n    from benchmarks.study import report\n")
    (study / "report.py").write_text("from benchmarks.study.run import PLAN\n")
    (study / "plan.py").write_text("import run\n")  # a flat sibling import
    graph = import_graph(tmp_path)
    assert graph == {
        "benchmarks.study.run": {"benchmarks.study.report"},
        "benchmarks.study.report": {"benchmarks.study.run"},
        "benchmarks.study.plan": {"benchmarks.study.run"},
    }
    assert cycles(graph) == [["benchmarks.study.run", "benchmarks.study.report", "benchmarks.study.run"]]


def test_a_study_imports_only_its_own_folder_and_the_shared_helpers():
    crossing = []
    for name, targets in import_graph().items():
        folder = name.rsplit(".", 1)[0] if name.count(".") >= 2 else name
        for target in targets:
            if not (target.startswith(folder + ".") or target.startswith(SHARED)):
                crossing.append(f"{name} imports {target}")
        if name.startswith("benchmarks.common."):  # the helpers know no study
            crossing += [f"{name} imports {t}" for t in targets if not t.startswith(SHARED)]
    assert crossing == [], "move what both need to benchmarks/common"


def test_every_rebuild_command_names_a_script_that_exists():
    benches = tomllib.loads((ROOT / "benchmarks" / "REBUILD.toml").read_text())["bench"]
    assert len(benches) > 40
    missing = []
    for bench in benches:
        words = shlex.split(bench["command"])
        assert words[0] == "python" and words[1].endswith(".py"), bench["command"]
        missing += [f"{bench['name']}: {w}" for w in words if w.endswith(".py") and not (ROOT / w).is_file()]
    assert missing == []


def test_every_rebuild_script_that_imports_a_benchmark_module_finds_the_package():
    """Run as ``python benchmarks/x/y.py``, a script sees only its own folder on ``sys.path``: one
    that imports ``benchmarks.*`` (at the top or inside a function) must put the repository root
    there first (privacy_table.py's lazy import once failed this way)."""
    scripts = {w for b in tomllib.loads((ROOT / "benchmarks" / "REBUILD.toml").read_text())["bench"]
               for w in shlex.split(b["command"]) if w.endswith(".py")}  # fmt: skip
    lost = []
    for script in sorted(scripts):
        tree = ast.parse((ROOT / script).read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        named = [n.module if isinstance(n, ast.ImportFrom) else a.name for n in imports
                 for a in (n.names if isinstance(n, ast.Import) else [None])]  # fmt: skip
        inserts = any(  # a module-level sys.path.insert(0, …): the repository root in every script here
            isinstance(n, ast.Expr) and ast.unparse(n).startswith("sys.path.insert(0,") for n in tree.body
        )
        if any((m or "").startswith("benchmarks.") or m == "benchmarks" for m in named) and not inserts:
            lost.append(script)
    assert lost == []


@pytest.mark.parametrize(
    "folder", sorted({p.parent.name for p in (ROOT / "benchmarks").glob("*/*.py")} - {"results"})
)
def test_the_readme_lists_every_study_folder(folder):
    assert f"`benchmarks/{folder}/`" in (ROOT / "benchmarks" / "README.md").read_text()


def test_status_lists_each_bench_under_its_study_folder():
    sys.path.insert(0, str(ROOT))
    from benchmarks import provenance

    registered = [{"command": "python benchmarks/evidence/run.py"}, {"command": "python benchmarks/timing/speed.py --x"},
                  {"command": "python benchmarks/evidence/run.py --verify R"}]  # fmt: skip
    assert provenance.by_folder(registered, ["a: 1", "b: 2", "c: 3"]) == [
        "benchmarks/evidence/", "  a: 1", "  c: 3", "benchmarks/timing/", "  b: 2"
    ]  # fmt: skip

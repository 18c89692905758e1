"""The data package's import graph: no circle, and no module imports a higher layer than its own.

Read from the source with ``ast`` (every import statement, also inside functions), so
an import that only runs later counts as much as one at the top of a file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "src" / "fedxrisk" / "data"
PACKAGE = "fedxrisk.data"
MAX_LINES = 400

# Bottom to top; a module may import its own layer and those below (readers import each other).
LAYERS: list[tuple[str, set[str]]] = [
    ("types and decoders", {"types", "stream_choice", "decode"}),
    ("checks", {"checks"}),
    ("lazy samples", {"lazy"}),
    ("registry", {"registry"}),
    ("datasets and readers", {"bundled", "mnist1d", "readers", "readers.base", "readers.arrays",
                              "readers.binary", "readers.cifar", "readers.images", "readers.manifest",
                              "readers.medmnist", "readers.heart"}),
    ("loading", {"loading"}),
    ("array steps", {"imbalance", "partition", "shift", "augment", "sampler"}),
    ("federated data", {"federated"}),
    ("streaming and validation", {"prefetch", "stream", "validation"}),
    ("package and old paths", {"__init__", "datasets"}),
]  # fmt: skip
LAYER = {module: rank for rank, (_, modules) in enumerate(LAYERS) for module in modules}


def module_name(path: Path) -> str:
    """``readers/base.py`` → ``readers.base``; a package's ``__init__.py`` → its folder's name."""
    parts = list(path.relative_to(DATA).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The data modules ``tree``'s statements name: ``from a.b import c`` names ``a.b`` and, when
    ``c`` is a module, ``a.b.c``; a parent package's ``__init__`` counts only when named itself."""
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            if name == PACKAGE:
                found.add("__init__")
            elif name.startswith(PACKAGE + "."):
                rest = name[len(PACKAGE) + 1 :]
                if rest in modules:
                    found.add(rest)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in DATA.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = imported(tree, set(files)) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected set of modules (depth-first search)."""
    found, state = [], dict.fromkeys(graph, 0)  # 0 new, 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt, 2) == 1:
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif state.get(nxt) == 0:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            visit(node, [node])
    return found


def test_every_data_module_has_a_layer():
    assert sorted(set(import_graph()) - set(LAYER)) == []
    assert sorted(set(LAYER) - set(import_graph())) == []


def test_no_import_circle_in_the_data_package():
    assert cycles(import_graph()) == []


def test_no_data_module_imports_a_higher_layer():
    upward = [
        f"{m} ({LAYERS[LAYER[m]][0]}) imports {n} ({LAYERS[LAYER[n]][0]})"
        for m, deps in sorted(import_graph().items())
        for n in sorted(deps)
        if LAYER[n] > LAYER[m]
    ]
    assert upward == []


def test_no_data_file_over_400_lines():
    long = {
        module_name(p): n for p in DATA.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from fedxrisk.data.lazy import LazySamples", {"lazy"}),
        ("def f():\n    from fedxrisk.data import readers", {"__init__", "readers"}),
        ("from fedxrisk.data import DATASETS", {"__init__"}),
        ("import fedxrisk.data.readers.base\nimport numpy", {"readers.base"}),
    ],
)
def test_imports_are_read_also_inside_functions(source, expected):
    assert imported(ast.parse(source), {"lazy", "readers", "readers.base"}) == expected


def test_a_circle_and_its_members_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []

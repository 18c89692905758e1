"""The package's shape: no import cycle, no import of a higher layer, no file over 400 lines.

Every module of ``src/fedxrisk`` is read with :mod:`ast`; imports inside functions count
(they run too), imports under ``if TYPE_CHECKING:`` do not. ``fedxrisk/__init__.py`` resolves
its public names lazily (by string), so it adds no edge. A layer may import its own layer and
the layers listed before it. Adding a table for the inside of a package (e.g. ``data/``): write
another ``(name, prefixes)`` list and call :func:`violations` with it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "fedxrisk"
MAX_LINES = 400

# Bottom first. A module belongs to the entry with the longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", (
        "fedxrisk.errors", "fedxrisk.tree", "fedxrisk.problem", "fedxrisk.objectives", "fedxrisk.models",
        "fedxrisk.algorithms", "fedxrisk.classaware", "fedxrisk.data", "fedxrisk.engines", "fedxrisk.metrics",
        "fedxrisk.stats", "fedxrisk.tasks", "fedxrisk.tables", "fedxrisk.catalog", "fedxrisk.schedule",
        "fedxrisk.outfiles", "fedxrisk.textsafe",
        # pieces for one's own loop: wrap objectives/, the CODA+ step and data.sampler; no run setting
        "fedxrisk.losses", "fedxrisk.optim", "fedxrisk.samplers",
    )),
    ("run.spec", ("fedxrisk.run", "fedxrisk.run.spec", "fedxrisk.run.identity", "fedxrisk.run.readback")),  # run/__init__ imports nothing
    ("run.privacy", ("fedxrisk.run.privacy",)),
    ("run.checks", ("fedxrisk.run.configtypes", "fedxrisk.run.combos", "fedxrisk.run.privacy_rules", "fedxrisk.run.rules", "fedxrisk.run.checks", "fedxrisk.run.nested")),
    ("run.names", ("fedxrisk.run.names",)),
    ("run.configfile", ("fedxrisk.run.configfile",)),
    ("run.weights", ("fedxrisk.run.weights",)),
    ("run.folder", ("fedxrisk.run.folder",)),
    ("run.build", ("fedxrisk.run.assemble", "fedxrisk.run.build", "fedxrisk.run.personalize")),
    ("run.callbacks", ("fedxrisk.run.callbacks",)),
    ("run.loop", ("fedxrisk.run.loop",)),
    ("flower", ("fedxrisk.flower",)),  # may use only the run files above it (callbacks: selection, early stopping)
    ("run.recipes", ("fedxrisk.run.recipes",)),
    ("run.tune", ("fedxrisk.run.tunespace", "fedxrisk.run.tuneout", "fedxrisk.run.tune", "fedxrisk.run.tuneconfirm")),  # only run.tune imports optuna
    ("api", (
        "fedxrisk.experiment", "fedxrisk.inference", "fedxrisk.inputs", "fedxrisk.prediction",
        "fedxrisk.evaluation", "fedxrisk.evaluation.data", "fedxrisk.evaluation.report",
        "fedxrisk.evaluation.federated", "fedxrisk.evaluation.against", "fedxrisk.evaluation.clinic",
        "fedxrisk.evaluation.personal", "fedxrisk.evaluation.survival",
        "fedxrisk.evaluation.cross", "fedxrisk.plots", "fedxrisk.compare",
        "fedxrisk.tune",
    )),
    ("cli", ("fedxrisk.cli", "fedxrisk.__main__")),
]  # fmt: skip

# Inside data/, bottom first (the whole package sits in "core" above); a reader may import
# another reader. "fedxrisk.data" itself (its __init__) and the old path datasets.py re-export only.
DATA_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("types and decoders", (
        "fedxrisk.data.types", "fedxrisk.data.stream_choice", "fedxrisk.data.decode", "fedxrisk.data.preprocessing",
    )),
    ("checks", ("fedxrisk.data.checks", "fedxrisk.data.missing")),
    ("lazy samples", ("fedxrisk.data.lazy", "fedxrisk.data.cache")),
    ("registry", ("fedxrisk.data.registry",)),
    ("datasets and readers", ("fedxrisk.data.bundled", "fedxrisk.data.mnist1d", "fedxrisk.data.readers")),
    ("loading", ("fedxrisk.data.loading",)),
    ("array steps", (
        "fedxrisk.data.imbalance", "fedxrisk.data.partition", "fedxrisk.data.shift", "fedxrisk.data.augment",
        "fedxrisk.data.sampler",
    )),
    ("federated data", ("fedxrisk.data.federated",)),
    ("streaming and validation", (
        "fedxrisk.data.prefetch", "fedxrisk.data.stream", "fedxrisk.data.validation", "fedxrisk.data.budget",
    )),
    ("package and old paths", ("fedxrisk.data", "fedxrisk.data.datasets")),
]  # fmt: skip

# (importer, imported) edges allowed against the table, each with its reason; removed when fixed.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
# Cycles allowed for now: the modules of each, with the reason.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}
ALLOWED_CYCLE_PACKAGES: dict[str, str] = {}
# Files allowed over MAX_LINES, with the reason.
LONG_FILES = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(name: str, node: ast.AST) -> list[str]:
    """The package modules an import statement in module ``name`` loads directly."""
    is_package = MODULES[name].name == "__init__.py"
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = node.module or ""
        if node.level:
            anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join([*anchor, *([base] if base else [])])
        targets = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names
        ]
    found = []
    for target in targets:
        while target and target not in MODULES:  # `import fedxrisk.x.y as z`, `from m import attr`
            target = target.rpartition(".")[0]
        if target and target != "fedxrisk" and target != name:
            found.append(target)
    return found


def imports(name: str) -> set[str]:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(_imported(name, node))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


GRAPH = {name: imports(name) for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(name: str, table: list[tuple[str, tuple[str, ...]]]) -> int | None:
    best, level = -1, None
    for i, (_, prefixes) in enumerate(table):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


def violations(
    graph: dict[str, set[str]], table: list[tuple[str, tuple[str, ...]]], allowed: dict[tuple[str, str], str]
) -> list[str]:
    """``importer (layer) -> imported (layer)`` for every import of a higher layer."""
    out = []
    for name, targets in sorted(graph.items()):
        mine = layer_of(name, table)
        for target in sorted(targets):
            theirs = layer_of(target, table)
            if mine is None or theirs is None or theirs <= mine or (name, target) in allowed:
                continue
            out.append(f"{name} ({table[mine][0]}) -> {target} ({table[theirs][0]})")
    return out


def test_every_module_has_a_layer():
    assert [name for name in MODULES if name != "fedxrisk" and layer_of(name, LAYERS) is None] == []


def test_no_module_imports_a_higher_layer():
    assert violations(GRAPH, LAYERS, ALLOWED_UPWARD) == []


def test_every_data_module_has_its_own_data_layer():
    data = [name for name in MODULES if name.startswith("fedxrisk.data.")]
    top = len(DATA_LAYERS) - 1
    assert [n for n in data if layer_of(n, DATA_LAYERS) == top and n != "fedxrisk.data.datasets"] == []


def test_no_data_module_imports_a_higher_data_layer():
    data = {
        n: {t for t in ts if t.startswith("fedxrisk.data")}
        for n, ts in GRAPH.items()
        if n.startswith("fedxrisk.data")
    }
    assert violations(data, DATA_LAYERS, {}) == []


def test_the_allowed_exceptions_are_still_needed():
    for importer, imported in ALLOWED_UPWARD:
        assert imported in GRAPH[importer], f"{importer} -> {imported} is gone: drop it from ALLOWED_UPWARD"


def test_no_import_cycle():
    left = [
        c
        for c in cycles(GRAPH)
        if frozenset(c) not in ALLOWED_CYCLES
        and not all(m.startswith(tuple(ALLOWED_CYCLE_PACKAGES)) for m in c)
    ]
    assert left == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert violations(
        {"x.low": {"x.high"}, "x.high": {"x.low"}}, [("low", ("x.low",)), ("high", ("x.high",))], {}
    ) == ["x.low (low) -> x.high (high)"]


def test_no_file_is_over_400_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert {k: v for k, v in long.items() if k not in LONG_FILES} == {}


# Modules a config error passes through: none may load torch when imported (its imports at module
# level, followed through fedxrisk's own modules and their packages' __init__). The CLI reports a
# bad config from these alone; tests/test_startup.py checks the same in a fresh process.
TORCH_FREE = (
    "fedxrisk.errors", "fedxrisk.catalog", "fedxrisk.schedule", "fedxrisk.textsafe", "fedxrisk.outfiles",
    "fedxrisk.engines.launch", "fedxrisk.data.stream_choice", "fedxrisk.data.preprocessing",
    "fedxrisk.data.partition", "fedxrisk.run.spec", "fedxrisk.run.privacy", "fedxrisk.run.rules", "fedxrisk.run.checks",
    "fedxrisk.run.names", "fedxrisk.run.configtypes", "fedxrisk.run.configfile", "fedxrisk.run.privacy_rules",
    "fedxrisk.run.nested", "fedxrisk.cli",
    "fedxrisk.cli.common", "fedxrisk.cli.run", "fedxrisk.cli.flags", "fedxrisk.cli.check",
)  # fmt: skip
HEAVY_LIBRARIES = ("torch", "sklearn", "scipy", "matplotlib")


def top_level_imports(name: str) -> set[str]:
    """What importing module ``name`` imports at once: fedxrisk modules (with the ``__init__`` of
    their packages) and other libraries' top-level names; not imports inside functions."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(
                alias.name.split(".")[0] for alias in node.names if not alias.name.startswith("fedxrisk")
            )
        if (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and not (node.module or "").startswith("fedxrisk")
        ):
            out.add((node.module or "").split(".")[0])
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _imported(name, node):
                parts = target.split(".")
                out.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))  # packages first
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def loaded_on_import(name: str) -> set[str]:
    """Every module and library importing ``name`` loads, following fedxrisk's modules."""
    parts = name.split(".")
    seen, todo = set(), [".".join(parts[:i]) for i in range(2, len(parts) + 1)]  # its packages too
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(t for t in top_level_imports(current) if t in MODULES)
        seen.update(t for t in top_level_imports(current) if t not in MODULES)
    return seen


def test_the_config_layer_imports_no_torch():
    heavy = {name: sorted(set(HEAVY_LIBRARIES) & loaded_on_import(name)) for name in TORCH_FREE}
    assert {name: libs for name, libs in heavy.items() if libs} == {}


def test_the_torch_free_rule_sees_an_import_through_a_package_init():
    assert "torch" in loaded_on_import("fedxrisk.models")  # imports torch itself
    assert "torch" in loaded_on_import("fedxrisk.data.types")  # idem
    assert "fedxrisk.data" in loaded_on_import("fedxrisk.data.stream_choice")  # its package runs first


def _config_parameters(folder: str) -> list[str]:
    """Functions under ``fedxrisk/<folder>`` that take a run config: a parameter annotated ``RunConfig``,
    or one named ``cfg``, or ``config`` without an annotation naming another type."""
    found = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                hints = [ast.unparse(a.annotation) if a.annotation else "" for a in args]
                if any(
                    "RunConfig" in h or a.arg == "cfg" or (a.arg == "config" and not h)
                    for a, h in zip(args, hints, strict=True)
                ):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    return found


def test_the_layers_below_the_run_take_values_not_the_run_config():
    """data/, engines/, algorithms/ and objectives/ receive the values they use: reading a run's
    settings is the run layer's job (run/build.py, run/assemble.py), so a setting's walk stops there."""
    assert [f for d in ("data", "engines", "algorithms", "objectives") for f in _config_parameters(d)] == []
    assert "run/build.py:build" in _config_parameters("run")  # the finder finds such a function

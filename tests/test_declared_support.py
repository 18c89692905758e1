"""Parts learn what they run with from declarations, never from names or probes (issue 39).

- engines/ never tests an algorithm's name (``name.startswith("fedxl")``, ``name == "ditto"``): a
  wrapper reads what the algorithm declares (``collectives``, ``begin_batch``, …).
- run/loop.py and run/personalize.py never probe the simulation or the set-up with ``getattr``:
  the simulation protocol ``train`` accepts declares its members (``evaluate``,
  ``summary_extra``, ``remote_sites``), and the in-process ``Simulation`` gives their defaults.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch.nn as nn

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "fedxrisk"


def algorithm_names() -> set[str]:
    """Every algorithm class's name: the registry's and unregistered subclasses' (survival)."""
    import fedxrisk.algorithms.survival  # noqa: F401  (unregistered subclasses)
    from fedxrisk.algorithms import ALGORITHMS, Algorithm

    names, todo = set(ALGORITHMS), [Algorithm]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if getattr(cls, "name", ""):
            names.add(cls.name)
    return names


def _strings(node: ast.AST) -> list[str]:
    """String constants in ``node`` (a literal, or a tuple/list/set of them)."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def name_tests(source: str, names: set[str]) -> list[str]:
    """Lines of ``source`` that compare something with an algorithm's name or a prefix of one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "endswith"):
                for s in [s for a in node.args for s in _strings(a)]:
                    if s and any(
                        n.startswith(s) if node.func.attr == "startswith" else n.endswith(s) for n in names
                    ):
                        found.append(f"{node.lineno}: {node.func.attr}({s!r})")
        if isinstance(node, ast.Compare):
            for s in [s for part in [node.left, *node.comparators] for s in _strings(part)]:
                if s in names:
                    found.append(f"{node.lineno}: compares with {s!r}")
    return found


def test_the_scanner_finds_a_name_test():
    names = algorithm_names()
    assert {"fedxl1", "fedxl2_cox", "codaplus"} <= names
    snippet = (
        'if name.startswith("fedxl"):\n    pass\nif alg.name == "ditto" or n in ("npa", "x"):\n    pass\n'
    )
    assert [line.split(":")[0] for line in name_tests(snippet, names)] == ["1", "3", "3"]
    assert name_tests('if k.startswith("site_auroc_") or name == "LOCAL_RANK":\n    pass\n', names) == []


def test_engines_never_test_an_algorithm_name():
    names = algorithm_names()
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted((PACKAGE / "engines").rglob("*.py"))
        if (hits := name_tests(path.read_text(), names))
    }
    assert found == {}


def test_client_dp_reads_the_declared_collectives():
    """The refusal follows ``collectives``: a pool-declaring copy of FedAvg is refused, a
    FeDXL copy declaring only ``mean`` is not refused for its pools."""
    from fedxrisk.algorithms import ALGORITHMS
    from fedxrisk.algorithms.survival import FeDXL2Cox
    from fedxrisk.engines.privacy import unsupported_reason
    from fedxrisk.problem import Problem

    problem = Problem(nn.Linear(3, 1), 0.2)
    fedavg = ALGORITHMS["localsgdm"](problem)
    assert unsupported_reason(fedavg) is None
    pooled = type("Pooled", (type(fedavg),), {"collectives": ("mean", "pool")})(problem)
    assert "collective 'pool'" in unsupported_reason(pooled)
    gathers = type("Gathers", (type(fedavg),), {"collectives": ("gather",)})(problem)
    assert "collective 'gather'" in unsupported_reason(gathers)
    cox = FeDXL2Cox(problem)
    assert "collective 'pool'" in unsupported_reason(cox)
    assert unsupported_reason(type("MeanOnly", (FeDXL2Cox,), {"collectives": ("mean",)})(problem)) is None


@pytest.mark.parametrize("name", ["loop.py", "personalize.py"])
def test_run_never_probes_the_simulation_with_getattr(name):
    """No ``getattr``/``hasattr`` on the simulation or the set-up in the run loop and the
    personalized end: they call the declared members."""
    tree = ast.parse((PACKAGE / "run" / name).read_text())
    probes = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
        ):
            target = ast.unparse(node.args[0])
            if any(word in target for word in ("sim", "setup", "federation")):
                probes.append(f"{node.lineno}: {ast.unparse(node)}")
    assert probes == []


NOT_HONOURED_VALUES = {
    "feature-shift": True,
    "num-samples": 300,
    "test-imratio": 0.2,
    "image-size": 16,
    "augment": "flip",
    "normalize": "imagenet",
    "memory-budget": "4GB",
    "engine": "compile",
    "pretrain": '{"algorithm": "centralized", "rounds": 1}',
    "sources": '["cleveland"]',
    "on-missing": "impute",
}


def test_every_setting_flower_does_not_honour_is_listed_with_a_value():
    from fedxrisk.flower.config import NOT_HONOURED

    assert sorted(k.replace("_", "-") for k in NOT_HONOURED) == sorted(NOT_HONOURED_VALUES)


@pytest.mark.parametrize("key", sorted(NOT_HONOURED_VALUES))
def test_flower_refuses_a_simulation_setting_it_would_ignore(key):
    """Set in Flower's run config, a setting no Flower party honours is refused in one line that
    names it and the deployment — never accepted and ignored (it was: a Flower run trained one
    stage with ``pretrain`` set, unnormalized with ``normalize`` set)."""
    from fedxrisk.errors import ConfigError
    from fedxrisk.flower.config import FlowerConfig, default_run_config

    flat = default_run_config() | {key: NOT_HONOURED_VALUES[key]}
    with pytest.raises(ConfigError) as refused:
        FlowerConfig.from_run_config(flat)
    message = str(refused.value)
    assert "\n" not in message
    assert f"run-config {key!r}" in message and "Flower deployment does not honour" in message


def test_flower_accepts_the_defaults_and_the_loop_engine():
    from fedxrisk.flower.config import FlowerConfig, default_run_config

    assert FlowerConfig.from_run_config(default_run_config() | {"engine": "loop"}).run.engine == "loop"
    assert FlowerConfig.from_run_config(default_run_config()).run.normalize is None


@pytest.mark.parametrize(
    "name",  # the binary ones: the survival algorithms' collectives are checked on survival data in
    # tests/test_survival_algorithms.py (their batches need a time)
    sorted(
        n
        for n, c in __import__("fedxrisk.algorithms", fromlist=["ALGORITHMS"]).ALGORITHMS.items()
        if c.task == "binary"
    ),
)
def test_every_algorithm_declares_the_collectives_it_calls(name):
    """``collectives`` (what client-level DP and SecAgg+ refuse on) equals what two rounds with two
    stages of a tiny run call, recorded on the collective."""
    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.data import make_federated
    from fedxrisk.engines import Simulation
    from fedxrisk.engines.simulation import SimCollective
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem

    kinds: set[str] = set()

    class Recording(SimCollective):
        def mean(self, tree):
            kinds.add("mean")
            return super().mean(tree)

        def gather(self, tree):
            kinds.add("gather")
            return super().gather(tree)

        def pool(self, groups, valid, key):
            kinds.add("pool")
            return super().pool(groups, valid, key)

    cls = ALGORITHMS[name]
    data = make_federated("synthetic", 2, "iid", 0.3, 0)
    algorithm = cls(Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio))
    schedule = Schedule.build(2, cls.fixed_window or 1, 0.01, stages=2)
    sim = Simulation(algorithm, data, schedule, max(8, 2 * algorithm.positives_per_batch), 0, "loop")
    sim._collective = lambda: Recording(sim.num_clients, sim.engine, sim.ledger, sim.seed)
    for _ in range(2):
        sim.run_round()
    assert kinds == set(cls.collectives)


# Constructors of a run's parts → the modules allowed to call them. run/assemble.py is the one
# assembly (evaluate and predict load through it too); run/folder.load_model, a layer below it,
# reads a saved model.pt back from its record.
CONSTRUCTORS: dict[str, set[str]] = {
    "Problem": {"run/assemble.py"},
    "build_model": {"run/assemble.py", "run/folder.py"},
    "ALGORITHMS[]": {"run/assemble.py"},
    "class_aware_batches": {"run/assemble.py"},
    "with_server_optimizer": {"run/assemble.py"},
    "plan_privacy": {"run/assemble.py"},
    "PrivacyPlan": {"run/privacy.py"},  # plan_privacy's own
    # the simulation's split: run/build.build_data (Flower's trial sites call it); a paper's protocol
    "make_federated": {"run/build.py", "tasks/auprc.py"},
}


def constructor_calls(source: str) -> set[str]:
    """The :data:`CONSTRUCTORS` ``source`` calls."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name) and f.value.id == "ALGORITHMS":
            found.add("ALGORITHMS[]")
        name = f.id if isinstance(f, ast.Name) else None
        if isinstance(f, ast.Attribute) and ast.unparse(f.value) not in ("cfg", "self", "self.cfg"):
            name = f.attr  # a module's function; FlowerConfig.build_model delegates to assemble_model
        if name in CONSTRUCTORS:
            found.add(name)
    return found


def test_the_scanner_finds_constructors():
    snippet = (
        "a = ALGORITHMS[name](problem)\np = Problem(m, 0.5)\nb = fedxrisk.models.build_model('mlp', s)\n"
    )
    assert constructor_calls(snippet) == {"ALGORITHMS[]", "Problem", "build_model"}


def test_a_run_is_assembled_in_one_module():
    """Model, problem, algorithm with its wrappers and the privacy plan are built by run/assemble.py
    alone: `fedxrisk run`, the Flower server and every Flower site call it (no hand-built copy)."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        for call in constructor_calls(path.read_text()):
            found.setdefault(call, set()).add(name)
    assert {k: v - CONSTRUCTORS[k] for k, v in found.items() if v - CONSTRUCTORS[k]} == {}
    assert found["plan_privacy"] == found["ALGORITHMS[]"] == {"run/assemble.py"}


def test_load_model_keeps_the_input_normalization_it_was_trained_with(tmp_path):
    """run/folder.load_model builds a saved network from its record: the ``data.normalize`` hook
    is part of it (it was dropped, so the loaded model scored raw inputs differently)."""
    import torch

    from fedxrisk.models import build_model
    from fedxrisk.run.folder import load_model, save_model

    norm = {"mean": [0.5], "std": [0.25]}
    trained = build_model("mlp", (1, 8, 8), 3, 1, norm).eval()
    params = {k: v.detach() for k, v in trained.named_parameters()}
    buffers = {k: v for k, v in trained.named_buffers()}
    save_model(tmp_path / "model.pt", "mlp", (1, 8, 8), 1, params, buffers, {"normalize": norm})
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path)(x), trained(x))


def test_a_training_batch_is_put_together_in_one_place():
    """The batch ``local_step`` reads (x, y, index, local_index, time, uniform) is built by
    data/federated.training_batch: the simulation's shards and a Flower site's rows alike."""
    homes = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict) and "local_index" in _strings(
                ast.Tuple(elts=node.keys, ctx=ast.Load())
            ):
                homes.add(str(path.relative_to(PACKAGE)))
    assert homes == {"data/federated.py"}

"""The quick subset, ``python -m pytest -m "not slow"``: the ``slow`` marker is registered (a typo in
a marker is an error), and the real-process tests are in the slow set while their cheap neighbours
are not."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# every test of these modules starts real processes: a TLS Flower federation, or fedxrisk run on every
# engine; each is skipped without its optional extra
NEEDS = {
    "test_flower_deploy.py": "flwr",
    "test_flower_evaluate_deploy.py": "flwr",
    "test_one_path.py": "dp_accounting",
}
WHOLLY_SLOW = tuple(m for m, extra in NEEDS.items() if importlib.util.find_spec(extra) is not None)
SLOW = ("test_distributed.py::test_a_dead_or_frozen_rank_is_named_and_the_others_exit_nonzero",
        "test_distributed.py::test_distributed_matches_loop_engine_for_every_family",
        "test_launch_local.py::test_a_launched_run_equals_the_loop_engine")  # fmt: skip
QUICK = ("test_distributed.py::test_client_layout", "test_distributed.py::test_bad_launches_fail_before_training",
         "test_launch_local.py::test_a_launch_mistake_is_one_line_before_any_rank_starts")  # fmt: skip


def test_the_slow_marker_is_registered_and_markers_are_strict(pytestconfig):
    assert any(line.startswith("slow:") for line in pytestconfig.getini("markers"))
    assert "--strict-markers" in pytestconfig.getini("addopts")


def _test_names(module: str) -> set[str]:
    tree = ast.parse((TESTS / module).read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


@pytest.mark.slow  # collects five modules in a real pytest process
def test_the_real_process_tests_are_slow_and_their_cheap_neighbours_are_not():
    modules = sorted({*WHOLLY_SLOW, *(case.split("::")[0] for case in (*SLOW, *QUICK))})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n0", "-m", "slow", "-p", "no:cacheprovider",
         *(str(TESTS / m) for m in modules)],
        cwd=TESTS.parent, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    slow = {line.split("[")[0].removeprefix("tests/") for line in done.stdout.splitlines() if "::" in line}
    for module in WHOLLY_SLOW:
        assert {f"{module}::{name}" for name in _test_names(module)} <= slow, module
    assert set(SLOW) <= slow
    assert not set(QUICK) & slow

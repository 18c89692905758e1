"""docs/architecture.md's module index is generated from the code (benchmarks/codebase/module_index.py):
every module of src/fedxrisk has a docstring, and the committed index equals the generated one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "module_index", ROOT / "benchmarks" / "codebase" / "module_index.py"
)
index = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(index)  # type: ignore[union-attr]


def test_every_module_has_a_docstring():
    assert [name for name, job in index.modules() if job is None] == []


def test_the_committed_index_equals_the_generated_one():
    assert index.with_index(index.DOC.read_text()) == index.DOC.read_text(), (
        "docs/architecture.md's module index is stale: run python benchmarks/codebase/module_index.py"
    )
    assert len(index.modules()) == sum(1 for p in index.PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_first_sentence_stops_at_a_sentence_not_at_an_abbreviation():
    assert index.first_sentence("Ditto (Li et al., Alg. 1) on BCE. More here.\n\nAnd more.") == (
        "Ditto (Li et al., Alg. 1) on BCE."
    )
    assert index.first_sentence("A | B table row") == "A \\| B table row"

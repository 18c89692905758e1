"""docs/cli.md's config-error example is what the program prints today."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_documented_config_errors_are_the_printed_ones():
    spec = importlib.util.spec_from_file_location(
        "config_errors", ROOT / "benchmarks" / "reliability" / "config_errors.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == module.OUT.read_text(), (
        "refresh: python benchmarks/reliability/config_errors.py"
    )

"""The docs' generated regions equal their results files, and the quick numbers reproduce.

The default run (README) and seed 0 of docs/cli.md's comparison are re-run here
and compared with ``benchmarks/results/quick_docs.json`` (written by
``python benchmarks/defaults/quick_docs.py``). On the machine that wrote the file the
numbers agree to the last digit (same seed, same engine); another CPU may order
floating-point sums differently, so AUROC and AP get a tolerance of 0.005.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from fedxrisk.compare import compare_experiments
from fedxrisk.experiment import RunConfig, run_experiment

ROOT = Path(__file__).resolve().parents[1]
QUICK = json.loads((ROOT / "benchmarks" / "results" / "quick_docs.json").read_text())
TOLERANCE = 5e-3  # across machines; the writing machine reproduces the numbers exactly


def _docs_module():
    spec = importlib.util.spec_from_file_location("bench_docs", ROOT / "benchmarks" / "docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_generated_region_equals_its_results_file():
    docs = _docs_module()
    assert docs.regions(), "no generated region found"
    assert docs.stale() == [], "run `python benchmarks/docs.py` to refresh the docs"


def test_a_stale_region_is_reported(tmp_path):
    docs = _docs_module()
    (tmp_path / "docs").mkdir()
    (tmp_path / "res.md").write_text("| a |\n")
    doc = tmp_path / "README.md"
    doc.write_text("x\n<!-- BEGIN GENERATED res.md -->\n| old |\n<!-- END GENERATED -->\n")
    assert docs.stale(tmp_path) == ["README.md:2: differs from res.md"]
    assert docs.render(tmp_path) == [doc]
    assert docs.stale(tmp_path) == [] and "| a |\n<!-- END" in doc.read_text()


@pytest.mark.slow  # reruns the documented runs
def test_the_default_run_reproduces_the_documented_numbers(tmp_path):
    result = run_experiment(RunConfig(), tmp_path / "default")
    documented = QUICK["default"]
    assert result.summary["config"] == documented["config"]
    for key, value in documented["final"].items():
        assert result.summary["final"][key] == pytest.approx(value, abs=TOLERANCE), key
    assert result.summary["communication"]["bytes_up_per_client"] == documented["bytes_up_per_client"]


@pytest.mark.slow  # reruns the documented runs
def test_seed_0_of_the_documented_comparison_reproduces(tmp_path):
    variants = list(QUICK["compare"]["runs"])
    cmp = compare_experiments({"experiment": {"rounds": 50}}, variants, seeds=[0], out_dir=tmp_path)
    for group in cmp.groups:
        documented = QUICK["compare"]["runs"][group.label]["0"]
        final = group.runs[0].summary["final"]
        for key, value in documented.items():
            assert final[key] == pytest.approx(value, abs=TOLERANCE), (group.label, key)


def test_the_evaluate_example_is_the_documented_default_run():
    """docs/cli.md's `fedxrisk evaluate` printout and the README's default run are the same run."""
    example = json.loads((ROOT / "benchmarks" / "results" / "evaluate_example.json").read_text())
    for key in ("test_auroc", "test_ap", "test_pauc30_norm"):
        assert example["evaluation"]["summary"][key] == pytest.approx(
            QUICK["default"]["final"][key], abs=1e-9
        ), key
    auroc = f"{QUICK['default']['final']['test_auroc']:.4f}"
    assert re.search(rf"AUROC +{re.escape(auroc)} ", example["printout"]), example["printout"]


def test_the_speed_tables_are_rendered_from_the_committed_speed_reports():
    """docs/performance.md's tables equal a fresh rendering of docs/benchmarks/*/speed.csv (no timing)."""
    spec = importlib.util.spec_from_file_location(
        "speed_tables", ROOT / "benchmarks" / "timing" / "speed_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rendered = module.tables()
    for name, text in rendered.items():
        assert (ROOT / "benchmarks" / "results" / name).read_text() == text, name

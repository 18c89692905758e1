"""A committed result cannot silently go stale: ``benchmarks/docs.py --check`` fails on a shown
result whose recorded source files changed since it ran (issue 21), and passes on this tree."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


docs = _bench_module("docs")
prov = sys.modules["provenance"]  # docs.py imports benchmarks/provenance.py


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _tree(tmp_path: Path, extra: str = "") -> Path:
    """A repository in miniature: one algorithm file, one benchmark, one result shown in README."""
    (tmp_path / "src" / "fedxrisk" / "algorithms").mkdir(parents=True)
    (tmp_path / "src" / "fedxrisk" / "algorithms" / "fedxl.py").write_text("STEP = 1\n")
    (tmp_path / "src" / "fedxrisk" / "metrics.py").write_text("def auroc(): ...\n")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "REBUILD.toml").write_text(
        '[[bench]]\nname = "study"\ncommand = "python benchmarks/study.py"\ncheap = false\n'
        f'results = ["benchmarks/results/study*.md"]\n{extra}'
    )
    (tmp_path / "benchmarks" / "results" / "study.md").write_text("| AUROC |\n| 0.97 |\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "x\n<!-- BEGIN GENERATED benchmarks/results/study.md -->\n| AUROC |\n| 0.97 |\n<!-- END GENERATED -->\n"
    )
    files = {
        "src/fedxrisk/algorithms/fedxl.py": _sha("STEP = 1\n"),
        "src/fedxrisk/metrics.py": _sha("def auroc(): ...\n"),
    }
    prov.record("study", files, tmp_path, commit="abc1234")
    return tmp_path


def test_this_tree_passes_the_check():
    assert docs.stale() == [], "run `python benchmarks/docs.py` to refresh the docs"
    assert docs.outdated() == [], "rerun the benchmark or mark it kept in benchmarks/REBUILD.toml"


def test_an_unchanged_source_passes(tmp_path):
    root = _tree(tmp_path)
    assert docs.stale(root) == [] and docs.outdated(root) == []


def test_changing_an_algorithm_file_fails_the_check_naming_result_and_file(tmp_path):
    root = _tree(tmp_path)
    (root / "src" / "fedxrisk" / "algorithms" / "fedxl.py").write_text("STEP = 2\n")
    assert docs.outdated(root) == [
        "benchmarks/results/study.md: bench 'study' ran at abc1234; its source changed since: "
        "src/fedxrisk/algorithms/fedxl.py (changed); rerun `python benchmarks/study.py` or mark it kept"
    ]


def test_a_moved_module_shows_as_missing(tmp_path):
    root = _tree(tmp_path)
    src = root / "src" / "fedxrisk"
    (src / "algorithms" / "fedxl.py").rename(src / "algorithms" / "fedxl_two.py")
    [line] = docs.outdated(root)
    assert "src/fedxrisk/algorithms/fedxl.py (missing)" in line


def test_a_kept_result_passes_and_the_doc_shows_why(tmp_path):
    root = _tree(tmp_path, extra='kept = "checked by hand after the move"\n')
    (root / "src" / "fedxrisk" / "algorithms" / "fedxl.py").write_text("STEP = 2\n")
    assert docs.outdated(root) == []
    assert docs.stale(root) == ["README.md:2: the kept note under it differs from REBUILD.toml's `kept`"]
    docs.render(root)
    text = (root / "README.md").read_text()  # the region keeps the file's exact text; the note follows it
    assert (
        "| 0.97 |\n<!-- END GENERATED -->\n\n*Kept without a rerun: checked by hand after the move*\n" in text
    )
    assert docs.stale(root) == []
    (root / "benchmarks" / "REBUILD.toml").write_text(  # no longer kept: the note goes again
        '[[bench]]\nname = "study"\ncommand = "x"\nresults = ["benchmarks/results/study*.md"]\n'
    )
    docs.render(root)
    assert "Kept" not in (root / "README.md").read_text() and docs.stale(root) == []


def test_a_result_without_a_record_or_a_bench_fails(tmp_path):
    root = _tree(tmp_path)
    (root / "benchmarks" / "results" / "provenance.json").write_text("{}\n")
    [line] = docs.outdated(root)
    assert line.startswith("benchmarks/results/study.md: bench 'study' has no recorded source")
    (root / "benchmarks" / "REBUILD.toml").write_text('[[bench]]\nname = "other"\ncommand = "x"\n')
    assert docs.outdated(root) == [
        "benchmarks/results/study.md: no [[bench]] in benchmarks/REBUILD.toml lists it in `results`"
    ]


def test_changing_a_file_the_evidence_study_ran_fails_the_check_on_a_copy_of_this_tree(tmp_path):
    """The real record: copy the docs, results, record and the recorded sources still in the tree,
    drop the study's `kept` mark in the copy (if it has one), edit one unchanged algorithm file: the
    check names it."""
    entry = prov.load()["evidence"]
    unchanged = [
        f for f, digest in entry["files"].items()
        if f.startswith("src/fedxrisk/algorithms/") and (ROOT / f).is_file()
        and hashlib.sha256((ROOT / f).read_bytes()).hexdigest() == digest
    ]  # fmt: skip
    assert unchanged, "no algorithm file of the evidence study is unchanged: rerun or --verify it"
    algo = sorted(unchanged)[0]
    for rel in ["README.md", "docs", "benchmarks/REBUILD.toml", "benchmarks/results",
                *[f for f in entry["files"] if (ROOT / f).is_file()]]:  # fmt: skip
        src, dst = ROOT / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
    rebuild = tmp_path / "benchmarks" / "REBUILD.toml"
    text = rebuild.read_text()
    start = text.index('name = "evidence"')
    end = text.find("[[bench]]", start)
    kept = text.find("\nkept = ", start, end if end >= 0 else len(text))
    if kept >= 0:  # a kept mark would hide the change; the study may also have been rerun (no mark)
        rebuild.write_text(text[:kept] + text[text.index("\n", kept + 1) :])
    assert all(f"{algo} (changed)" not in p for p in docs.outdated(tmp_path))
    with open(tmp_path / algo, "a") as f:
        f.write("# changed\n")
    problems = docs.outdated(tmp_path)
    assert problems and all(f"{algo} (changed)" in p for p in problems if "'evidence'" in p)
    assert any(f"{algo} (changed)" in p for p in problems)


def test_the_fingerprint_lists_fedxrisk_files_by_path(tmp_path):
    (tmp_path / "src" / "fedxrisk").mkdir(parents=True)
    (tmp_path / "src" / "fedxrisk" / "metrics.py").write_text("A = 1\n")
    modules = {
        "fedxrisk.metrics": SimpleNamespace(__file__=str(tmp_path / "src" / "fedxrisk" / "metrics.py")),
        "numpy": SimpleNamespace(__file__=str(tmp_path / "numpy.py")),
        "fedxrisk.namespace": SimpleNamespace(__file__=None),
    }
    assert prov.fingerprint(modules, tmp_path) == {"src/fedxrisk/metrics.py": _sha("A = 1\n")}
    outside = {"fedxrisk.metrics": SimpleNamespace(__file__="/elsewhere/fedxrisk/metrics.py")}
    with pytest.raises(SystemExit, match="outside"):
        prov.fingerprint(outside, tmp_path)


def test_the_runner_records_the_modules_the_script_imported(tmp_path, monkeypatch):
    import fedxrisk

    if not Path(fedxrisk.__file__).resolve().is_relative_to(ROOT):
        pytest.skip(f"fedxrisk is imported from outside {ROOT}; set PYTHONPATH={ROOT}/src")
    script = tmp_path / "bench.py"
    script.write_text("import fedxrisk.metrics\n")
    seen = {}
    monkeypatch.setattr(
        prov, "record", lambda name, files, root, note="", cost=None: seen.update(name=name, files=files)
    )
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    prov.run("tiny", ["python", str(script)])
    assert seen["name"] == "tiny"
    assert (
        seen["files"]["src/fedxrisk/metrics.py"]
        == hashlib.sha256((ROOT / "src" / "fedxrisk" / "metrics.py").read_bytes()).hexdigest()
    )
    with pytest.raises(SystemExit, match="expected `python SCRIPT.py ARGS`"):
        prov.run("tiny", ["bash", "-c", "true"])


def test_the_record_is_json_with_the_commit_and_files(tmp_path):
    _tree(tmp_path)
    entry = json.loads((tmp_path / "benchmarks" / "results" / "provenance.json").read_text())["study"]
    assert entry["commit"] == "abc1234" and len(entry["files"]) == 2


def test_a_script_that_imports_fedxrisk_only_in_subprocesses_records_the_whole_package(tmp_path, monkeypatch):
    (tmp_path / "src" / "fedxrisk" / "run").mkdir(parents=True)
    (tmp_path / "src" / "fedxrisk" / "run" / "loop.py").write_text("A = 1\n")
    (tmp_path / "src" / "fedxrisk" / "catalog.json").write_text("{}\n")
    (tmp_path / "src" / "fedxrisk" / "notes.txt").write_text("not source\n")
    (tmp_path / "bench.py").write_text("import json\n")
    seen = {}
    monkeypatch.setattr(prov, "fingerprint", lambda root: {})
    monkeypatch.setattr(
        prov, "record", lambda name, files, root, note, cost: seen.update(files=files, note=note)
    )
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    prov.run("sub", ["python", "bench.py"], root=tmp_path)
    assert seen["files"] == {
        "src/fedxrisk/catalog.json": _sha("{}\n"),
        "src/fedxrisk/run/loop.py": _sha("A = 1\n"),
    }
    assert "subprocesses only" in seen["note"]


def test_the_runner_records_what_the_run_cost_and_status_lists_it(tmp_path, monkeypatch):
    """Issue 39 item 5: `provenance.py status` lists every study with its cost, measured when it ran
    (a script that burns about 0.3 s of CPU must be recorded as at least 0.2 s)."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "REBUILD.toml").write_text(
        '[[bench]]\nname = "burn"\ncommand = "python bench.py"\nresults = []\n'
        '[[bench]]\nname = "never"\ncommand = "python x.py"\ncheap = true\nresults = []\n'
    )
    (tmp_path / "benchmarks" / "results").mkdir()
    (tmp_path / "bench.py").write_text(
        "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass\n"
    )
    monkeypatch.setattr(prov, "fingerprint", lambda root: {"src/fedxrisk/x.py": "0" * 64})
    monkeypatch.setattr(prov, "git", lambda *args, root: "abc1234" if args[0] == "rev-parse" else "")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    prov.run("burn", ["python", "bench.py"], root=tmp_path)
    cost = prov.load(tmp_path)["burn"]["cost"]
    assert 0.2 <= cost["cpu_s"] <= cost["wall_s"] + 0.5 and cost["load_at_start"] >= 0
    burn, never = prov.status(tmp_path)
    assert burn.startswith("burn: ran at abc1234") and "min wall" in burn and "min CPU" in burn
    assert never == "never: no record; under 2 min (cheap)"

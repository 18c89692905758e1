"""The studies' cells are runs of the run layer (benchmarks/common/study_cells.py, used by evidence.py and
real_data.py): what a cell selects is what ``fedxrisk run`` with the same config selects."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks.*`

from benchmarks.common import study_cells as sc  # noqa: E402
from fedxrisk.cli import main as cli_main  # noqa: E402
from fedxrisk.metrics import auroc  # noqa: E402
from fedxrisk.run.recipes import run_experiment  # noqa: E402
from fedxrisk.run.spec import RunConfig  # noqa: E402

CFG = RunConfig(algorithm="codasca", dataset="digits", clients=4, rounds=12, eval_every=2, lr=1.0,
                validation=0.2, selection="best", checkpoint_every=0, tensorboard=False)  # fmt: skip


@pytest.mark.slow  # a study cell against a full run
def test_a_cell_selects_the_round_fedxrisk_run_selects_and_scores_its_model(tmp_path):
    cell = sc.train_cell(CFG, tmp_path / "cell")
    ref = run_experiment(dataclasses.replace(CFG), tmp_path / "api").summary["selected"]
    assert cell["status"] == "ok" and ref["selection"] == "best"
    assert cell["round"] == ref["round"] and cell["val"]["auroc"] == ref["value"]
    assert cell["test"]["auroc"] == ref["test_auroc"] and cell["test"]["ap"] == ref["test_ap"]
    assert cell["test"]["pauc"] == ref["test_pauc30_norm"]
    scores = np.frombuffer(base64.b64decode(cell["scores"]), dtype=np.float32)
    assert auroc(np.array(cell["labels"]), scores) == pytest.approx(ref["test_auroc"], abs=1e-6)
    # the cell's folder is a normal run: its config.toml reruns through the CLI to the same choice
    args = ["run", "--config", str(tmp_path / "cell" / "config.toml"), "--out", str(tmp_path / "cli")]
    assert CliRunner().invoke(cli_main, args, catch_exceptions=False).exit_code == 0
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())["selected"]
    assert (cli["round"], cli["value"], cli["test_auroc"]) == (
        cell["round"],
        cell["val"]["auroc"],
        ref["test_auroc"],
    )
    assert len(cell["curve"]) == CFG.rounds // CFG.eval_every and cell["curve"][0][0] == 2 * 8


def test_a_refused_cell_ranks_last(tmp_path):
    refused = sc.train_cell(dataclasses.replace(CFG, algorithm="localscgdam", lr=0.5), tmp_path / "x")
    assert refused["status"].startswith("refused: alpha_h") and sc.objective(refused, "auroc") == -math.inf


def test_the_lr_rule_extends_at_an_edge_and_takes_the_best_validation_value():
    runs = {0.1: 0.8, 0.3: 0.85, 1.0: 0.9, 3.0: 0.88}
    rec = {lr: {"val": {"auroc": v}} for lr, v in runs.items()}
    assert sc.select_lr((0.1, 0.3, 1.0), lambda lr: None if lr == 3.0 else rec[lr], "auroc") == (
        [0.1, 0.3, 1.0, 3.0], None)  # fmt: skip
    assert sc.select_lr((0.1, 0.3, 1.0), rec.get, "auroc") == ([0.1, 0.3, 1.0, 3.0], 1.0)
    nan = {lr: {"val": {"auroc": math.nan}} for lr in runs}
    assert sc.select_lr((0.1, 0.3, 1.0), nan.get, "auroc") == ([0.1, 0.3, 1.0], 0.3)  # cannot rank: middle


def test_record_sources_refuses_dirty_unknown_or_mixed_cells_and_records_the_union(tmp_path, monkeypatch):
    from benchmarks import provenance

    sources = tmp_path / "sources.json"
    sources.write_text(json.dumps({"d1": {"src/a.py": "1", "src/b.py": "2"}, "d2": {"src/a.py": "1"},
                                   "d3": {"src/a.py": "9"}}))  # fmt: skip
    recorded = {}
    monkeypatch.setattr(
        provenance, "record", lambda name, files, **kw: recorded.update(name=name, files=files, **kw)
    )

    def cell(digest: str, dirty: bool = False, commit: str = "c1") -> dict:
        return {"id": digest, "source": {"files": digest, "src_dirty": dirty, "commit": commit}}

    label = lambda rec: rec["id"]  # noqa: E731
    for cells, words in [
        ([cell("d1"), cell("d2", dirty=True)], "cell d2 ran with uncommitted changes"),
        ([cell("d1"), cell("d9")], "cell d9 has no recorded source d9"),
        ([cell("d1"), cell("d3")], "different versions of src/a.py"),
    ]:
        with pytest.raises(SystemExit, match=words):
            sc.record_sources("study", cells, sources, label)
    assert recorded == {}
    sc.record_sources("study", [cell("d1", commit="c1"), cell("d2", commit="c2")], sources, label)
    assert recorded == {"name": "study", "files": {"src/a.py": "1", "src/b.py": "2"}, "commit": "c2",
                        "note": "2 cells; 2 commit(s)"}  # fmt: skip

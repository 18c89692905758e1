"""`fedxrisk plot` on synthetic run folders: read without launching, one line per effective config,
n distinct seeds per line, distinct line styles, the legend outside when crowded."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner
from matplotlib.image import imread

from fedxrisk.cli import main
from fedxrisk.experiment import HISTORY_FIELDS, RunConfig, load_run
from fedxrisk.plots import group_runs, legend_labels, line_styles, title_suffix
from fedxrisk.run.configfile import config_to_toml


def write_run(folder, cfg: RunConfig, aurocs: list[float], finished: bool = True):
    """A run folder as fedxrisk writes it, with made-up numbers (no training)."""
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(config_to_toml(cfg))
    with open(folder / "history.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=HISTORY_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r, auroc in enumerate(aurocs, start=1):
            row = dict.fromkeys(HISTORY_FIELDS, 0.5) | {"round": r, "test_auroc": auroc}
            writer.writerow(row | {"bytes_up_per_client": 100 * r, "bytes_down_per_client": 100 * r})
    if finished:
        summary = {"status": "completed", "config": cfg.to_dict(), "final": {"test_auroc": aurocs[-1]}}
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def _curves(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_an_unfinished_distributed_run_is_read_without_launching_anything(tmp_path, monkeypatch):
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    write_run(tmp_path / "runs" / "a", RunConfig(rounds=2), [0.6, 0.7])
    write_run(
        tmp_path / "runs" / "b", RunConfig(rounds=2, engine="distributed", clients=2), [0.8], finished=False
    )
    result = CliRunner().invoke(main, ["plot", str(tmp_path / "runs"), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    labels = {c["label"] for c in _curves(tmp_path / "plots" / "curves.csv")}
    assert labels == {"codasca K=8 engine=vmap", "codasca K=2 engine=distributed"}
    assert load_run(tmp_path / "runs" / "b").summary["config"]["engine"] == "distributed"


def test_one_line_per_effective_config_and_distinct_seeds_counted_once(tmp_path):
    plain = write_run(tmp_path / "plain", RunConfig(seed=0), [0.6, 0.7])
    explicit = write_run(tmp_path / "explicit", RunConfig(seed=1, options={"eta_g": 1.0}), [0.8, 0.9])
    again = write_run(tmp_path / "again", RunConfig(seed=0), [0.1], finished=False)  # seed 0 once more
    other = write_run(tmp_path / "other", RunConfig(seed=0, options={"eta_g": 1.1}), [0.5, 0.5])
    groups = group_runs([load_run(p) for p in (plain, explicit, again, other)])
    assert [g.label for g in groups] == ["codasca eta_g=1", "codasca eta_g=1.1"]  # eta_g differs: named
    assert [len(g.runs) for g in groups] == [2, 1]
    assert {run.out_dir for run in groups[0].runs} == {plain, explicit}  # the longer seed-0 run is kept
    assert groups[0].curve()["mean"].tolist() == pytest.approx([0.7, 0.8])
    assert legend_labels(groups) == ["codasca eta_g=1 (n=2)", "codasca eta_g=1.1 (n=1)"]
    assert title_suffix(groups).endswith("(mean ± std over the n seeds of each line)")
    alone = group_runs([load_run(p) for p in (plain, explicit)])
    assert [g.label for g in alone] == ["codasca"]  # eta_g = its default, written or not: no label


def test_many_lines_have_distinct_styles_and_the_legend_outside(tmp_path):
    styles = line_styles(24)
    assert len({(s["color"], s["linestyle"]) for s in styles}) == 24
    runs = [
        write_run(tmp_path / f"lr{i}", RunConfig(lr=0.1 * (i + 1), rounds=2), [0.5 + 0.01 * i, 0.6])
        for i in range(6)
    ]
    result = CliRunner().invoke(main, ["plot", *map(str, runs), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert len({c["label"] for c in _curves(tmp_path / "out" / "curves.csv")}) == 6
    result = CliRunner().invoke(main, ["plot", *map(str, runs[:2]), "--out", str(tmp_path / "few")])
    for folder in ("out", "few"):  # the legend beside the axes (wider than the 7.5-inch axes figure)
        image = imread(tmp_path / folder / "auroc_vs_rounds.png")
        assert image.shape[1] > 900
        assert (image[:, -4:, :3] == 1.0).all()  # nothing drawn at the right edge: no label cut there

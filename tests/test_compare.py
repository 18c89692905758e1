"""compare: same partition and seeds for every variant, a table and plots whose numbers match the runs."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
from click.testing import CliRunner
from matplotlib.image import imread

from fedxrisk.cli import main
from fedxrisk.compare import build_variants, compare_experiments, parse_vary
from fedxrisk.experiment import ConfigError

TINY = ["--set", "data.clients=2", "--set", "experiment.rounds=2", "--set", "algorithm.stages=1"]
TINY += [
    "--set",
    "algorithm.local_steps=2",
    "--set",
    "experiment.eval_every=1",
    "--set",
    "data.batch_size=16",
]


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp") / "out"
    args = ["compare", "-a", "codasca,localsgdm", "--seeds", "0,1", *TINY, "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out, args, result.output


def test_compare_writes_table_with_one_row_per_algorithm(compared):
    out, _, output = compared
    rows = _csv(out / "comparison.csv")
    assert [r["variant"] for r in rows] == ["codasca", "localsgdm"]
    for row in rows:
        runs = [json.loads((out / row["variant"] / f"seed{s}" / "summary.json").read_text()) for s in (0, 1)]
        finals = [r["final"]["test_auroc"] for r in runs]
        assert (row["seeds"], row["completed"], row["rounds"]) == ("2", "2", "2")
        assert float(row["final_test_auroc_mean"]) == pytest.approx(statistics.mean(finals), abs=1e-12)
        assert float(row["final_test_auroc_std"]) == pytest.approx(statistics.stdev(finals), abs=1e-12)
        chosen = [r["selected"]["test_auroc"] for r in runs]
        assert float(row["selected_test_auroc_mean"]) == pytest.approx(statistics.mean(chosen), abs=1e-12)
        assert int(row["bytes_up_per_client"]) == runs[0]["communication"]["bytes_up_per_client"]
    md = (out / "comparison.md").read_text().splitlines()
    assert md[0].startswith("| variant | final test AUROC |")
    assert md[2].startswith("| codasca | ") and "±" in md[2] and md[3].startswith("| localsgdm | ")
    assert "codasca" in output and "localsgdm" in output


def test_variants_share_the_partition_of_each_seed(compared):
    out = compared[0]
    for seed in (0, 1):
        counts = [
            json.loads((out / alg / f"seed{seed}" / "summary.json").read_text())["data"]["client_counts"]
            for alg in ("codasca", "localsgdm")
        ]
        assert counts[0] == counts[1]


def test_compare_writes_readable_plots_and_their_data(compared):
    out = compared[0]
    for name in ("auroc_vs_rounds.png", "auroc_vs_bytes.png"):
        image = imread(out / name)
        assert image.shape[0] > 300 and image.shape[1] > 500
    curves = _csv(out / "curves.csv")
    assert len(curves) == 2 * 2 * 2  # variants × seeds × evaluations
    assert {(c["label"], c["seed"], c["round"]) for c in curves} == {
        (a, s, r) for a in ("codasca", "localsgdm") for s in "01" for r in "12"
    }


def test_compare_again_into_the_same_folder_reads_finished_runs_back(compared):
    out, args, _ = compared
    summary = out / "codasca" / "seed0" / "summary.json"
    stamp = summary.stat().st_mtime_ns
    table = (out / "comparison.csv").read_text()
    result = CliRunner().invoke(main, [*args, "--quiet"])
    assert result.exit_code == 0, result.output
    assert summary.stat().st_mtime_ns == stamp  # not re-run
    assert (out / "comparison.csv").read_text() == table


def test_plot_redraws_from_run_folders(compared, tmp_path):
    out = compared[0]
    dest = tmp_path / "plots"
    runs = [str(out / "codasca" / "seed1"), str(out / "localsgdm" / "seed1")]
    result = CliRunner().invoke(main, ["plot", *runs, "--out", str(dest)])
    assert result.exit_code == 0, result.output
    assert imread(dest / "auroc_vs_bytes.png").shape[0] > 300
    curves = _csv(dest / "curves.csv")
    assert {c["label"] for c in curves} == {"codasca", "localsgdm"} and {c["seed"] for c in curves} == {"1"}


def test_vary_builds_one_labelled_variant_per_value():
    name, values = parse_vary("algorithm.local_steps=2,4")
    variants = build_variants({}, ["codasca"], {name: values}, [0, 3])
    assert [v.label for v in variants] == ["codasca I=2", "codasca I=4"]
    assert [[c.seed for c in v.configs] for v in variants] == [[0, 3], [0, 3]]
    assert [v.configs[0].local_steps for v in variants] == [2, 4]
    assert parse_vary("data.partition=iid,class") == ("data.partition", ["iid", "class"])


def test_hyperparameters_go_to_the_algorithms_that_have_them():
    variants = build_variants({"algorithm": {"eta_g": 1.1}}, ["codasca", "localsgdm"])
    assert [v.configs[0].options for v in variants] == [{"eta_g": 1.1}, {}]
    assert [v.label for v in variants] == ["codasca eta_g=1.1", "localsgdm"]


@pytest.mark.parametrize(
    ("base", "algorithms", "vary", "message"),
    [
        (
            {"algorithm": {"momentun": 0.5}},
            ["codasca", "localsgdm"],
            {},
            "algorithm.momentun is a hyperparameter of none",
        ),
        ({}, ["codasca", "sgd"], {}, "unknown algorithm 'sgd'"),
        ({}, ["codasca", "codasca"], {}, "listed twice"),
        ({}, ["npa"], {"algorithm.local_steps": [2]}, "npa communicates every 1 step(s)"),
        ({}, ["codasca"], {"optimizer.lr": [0.1]}, "expected SECTION.KEY"),
    ],
)
def test_bad_comparisons_fail_before_any_run(base, algorithms, vary, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_variants(base, algorithms, vary)


def test_compare_cli_error_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["compare", "-a", "codasca,sgd", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: unknown algorithm 'sgd'; choose one of [")
    assert not (tmp_path / "o").exists()


def test_a_diverged_run_is_reported_not_fatal(tmp_path, monkeypatch):
    from fedxrisk.engines import NonFiniteLoss, Simulation

    original = Simulation.run_round

    def diverge(self):
        if self.algorithm.name == "localsgdm" and self.round == 1:
            raise NonFiniteLoss(1)
        return original(self)

    monkeypatch.setattr(Simulation, "run_round", diverge)
    base = {"experiment": {"rounds": 2, "eval_every": 1}, "data": {"clients": 2}}
    base["algorithm"] = {"local_steps": 1, "stages": 1}
    result = compare_experiments(base, ["codasca", "localsgdm"], seeds=[0], out_dir=tmp_path)
    done, failed = result.rows
    assert (done["completed"], failed["completed"]) == (1, 0)
    assert failed["final_test_auroc_mean"] != failed["final_test_auroc_mean"]  # NaN: no completed run
    assert json.loads((tmp_path / "localsgdm" / "seed0" / "summary.json").read_text())["status"] == "failed"
    md = (tmp_path / "comparison.md").read_text()
    assert "| localsgdm | — | — | — | 2 | — | 0/1 |" in md
    assert len(_csv(tmp_path / "curves.csv")) == 2 + 1  # codasca 2 rows, localsgdm 1 before diverging

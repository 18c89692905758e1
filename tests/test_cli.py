"""The `fedxrisk` command line and run outputs: files, keys, reproducibility, bad input."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.experiment import HISTORY_FIELDS, RunConfig, run_experiment

SMALL = ["--rounds", "6", "--eval-every", "2", "--clients", "4", "-q"]
REQUIRED = [
    "algorithm", "dataset", "engine", "num_clients", "rounds", "local_steps", "seed",
    "final.test_auroc", "final.test_ap", "final.client_auroc_mean", "final.client_auroc_std",
    "selected.test_auroc", "selected.round", "test_oracle.test_auroc", "test_oracle.round", "communication.rounds", "communication.bytes_up_per_client",
    "communication.bytes_down_per_client", "wall_seconds",
]  # fmt: skip


def _get(d, dotted):
    for part in dotted.split("."):
        d = d[part]
    return d


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_run_writes_summary_and_history(tmp_path):
    out = tmp_path / "run"
    result = _invoke(["run", *SMALL, "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    for key in REQUIRED:
        _get(summary, key)
    assert summary["algorithm"] == "codasca" and summary["num_clients"] == 4 and summary["rounds"] == 6
    rows = list(csv.DictReader(open(out / "history.csv")))
    assert [int(r["round"]) for r in rows] == [2, 4, 6]
    assert list(rows[0]) == list(HISTORY_FIELDS)
    assert float(rows[-1]["test_auroc"]) == pytest.approx(summary["final"]["test_auroc"])
    best = max(float(r["test_auroc"]) for r in rows)
    assert summary["test_oracle"]["test_auroc"] == pytest.approx(best)
    assert summary["selected"]["test_auroc"] == summary["final"]["test_auroc"]  # selection = "last"
    up = [int(r["bytes_up_per_client"]) for r in rows]
    assert up == sorted(up) and up[-1] == summary["communication"]["bytes_up_per_client"]
    assert summary["communication"]["rounds"] == 6


def test_same_seed_same_numbers(tmp_path):
    cfg = RunConfig(algorithm="codaplus", rounds=4, eval_every=2, clients=3)
    a = run_experiment(cfg, tmp_path / "a").summary
    b = run_experiment(cfg, tmp_path / "b").summary
    assert a["final"] == b["final"] and a["communication"] == b["communication"]
    c = run_experiment(
        RunConfig(algorithm="codaplus", rounds=4, eval_every=2, clients=3, seed=1), tmp_path / "c"
    )
    assert c.summary["final"] != a["final"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algorithm", "fedsgd9"], "unknown algorithm 'fedsgd9'"),
        (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
        (["--imratio", "1.5"], r"imratio must lie in (0, 1), got 1.5"),
        (["--imratio", "0"], r"imratio must lie in (0, 1), got 0.0"),
        (["--dataset", "breast_cancer", "--clients", "1000", "--partition", "iid"], "1000 clients but only"),
        (["--algorithm", "npa", "--local-steps", "8"], "local_steps must be 1, got 8"),
        (["--engine", "gpu"], "unknown engine 'gpu'"),
        (["-o", "eta_gg=2"], "unknown key 'algorithm.eta_gg' (did you mean 'eta_g'?)"),
        (["-o", "eta_g=-1"], "eta_g must be > 0"),
    ],
)
def test_bad_input_is_named_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", *SMALL, *args, "--out", str(out)])
    assert result.exit_code == 2
    assert message in result.output
    assert not out.exists()


def test_nan_loss_stops_keeps_history_and_names_the_round(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["run", "--algorithm", "codaplus", "--lr", "1e30", "--rounds", "6", "--eval-every", "1",
               "--clients", "2", "-q", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "non-finite loss or model (NaN/inf) at round" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "at round" in summary["error"]
    failed_round = int(summary["error"].split("at round ")[1].split(";")[0])
    rows = list(csv.DictReader(open(out / "history.csv")))
    # rounds are 1-based as in history.csv: every round before the failed one was evaluated and kept
    assert [int(r["round"]) for r in rows] == list(range(1, failed_round))


def test_existing_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    assert _invoke(["run", *SMALL, "--out", str(out)]).exit_code == 0
    before = (out / "summary.json").read_text()
    result = CliRunner().invoke(main, ["run", *SMALL, "--out", str(out)])
    assert result.exit_code == 2 and "already holds a finished run" in result.output
    assert (out / "summary.json").read_text() == before


def test_clients_missing_a_class_train_when_allowed(tmp_path):
    """With --allow-missing-class, clients without positives train on their negatives only;
    their AUROC is undefined and excluded from the per-client mean."""
    out = tmp_path / "run"
    args = ["run", "--clients", "16", "--partition", "iid", "--imratio", "0.01", "--rounds", "3", "-q"]
    refused = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert refused.exit_code == 2 and "hold only one class" in refused.output
    with pytest.warns(UserWarning, match="hold only one class"):
        result = CliRunner().invoke(main, [*args, "--allow-missing-class", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert any(pos == 0 for pos, _ in summary["data"]["client_counts"])
    assert 0.0 <= summary["final"]["client_auroc_mean"] <= 1.0


def test_list_names_everything():
    result = _invoke(["list"])
    for name in ("localsgdm", "coda", "codaplus", "codasca", "npa", "digits", "breast_cancer", "synthetic",
                 "iid", "class", "dirichlet", "loop", "vmap"):  # fmt: skip
        assert name in result.output

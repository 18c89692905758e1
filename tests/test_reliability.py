"""Bad input stops with one line, exit 2, and leaves the run folder as it was (issue 17).

The cases are those of ``benchmarks/reliability/reliability_table.py`` (the table in
docs/reliability.md); each expected message is spelled out here, and the
committed table must show the same message. Then: model.pt is committed before
summary.json, and a run failed on a NaN loss resumes from its last checkpoint.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.engines import Simulation
from fedxrisk.experiment import CHECKPOINT, RunConfig, load_run, run_experiment
from fedxrisk.run import folder as run_folder

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "reliability_table", ROOT / "benchmarks" / "reliability" / "reliability_table.py"
)
table = importlib.util.module_from_spec(_spec)
sys.modules["reliability_table"] = table  # dataclasses look their module up
_spec.loader.exec_module(table)
COMMITTED = {r["id"]: r for r in json.loads((ROOT / "benchmarks/results/reliability.json").read_text())}

RESTART = "delete it and run `fedxrisk run --resume TMP/run` to restart the run from round 0, or start afresh with another --out"
EXPECTED = {
    "foreign-out": "--out TMP/mine is not empty and holds no fedxrisk run (history.csv, notes.txt); choose a new or empty folder",
    "lr-inf": "algorithm.lr must be a finite number, got inf",
    "lr-inf-config": "algorithm.lr must be a finite number, got inf",
    "window-growth-inf": "algorithm.window_growth must be a finite number, got inf",
    "device-tpu": "engine.device 'tpu' is not a torch device; use cpu, cuda, cuda:N or mps",
    "config-latin1": "TMP/cfg.toml: not UTF-8 text (byte 0xe9 at offset 5)",
    "out-under-file": "--out TMP/file/run cannot be created (Not a directory)",
    "out-uncreatable": "--out /proc/fedxrisk-run cannot be created (No such file or directory)",
    "idx-bad-deflate": "TMP/mnist/train-images-idx3-ubyte.gz: cannot read (Error -3 while decompressing data: invalid stored block lengths)",
    "npz-width-mismatch": "TMP/data.npz: x_train rows have shape (4,) but x_test rows (5,); they must match",
    "npz-1d-x": "TMP/data.npz: x_train: features must be [N, features…] (one row per sample), got shape (60,)",
    "image-bomb": "corrupt or unreadable data file TMP/img/dog/huge.png (TMP/img/dog/huge.png: cannot decode image (Image size (900000000 pixels) exceeds limit of 178956970 pixels, could be decompression bomb DOS attack.))",
    "ckpt-random": f"checkpoint unreadable: TMP/run/checkpoint.pt (not a torch checkpoint); {RESTART}",
    "ckpt-truncated": f"checkpoint unreadable: TMP/run/checkpoint.pt (truncated or not a zip archive); {RESTART}",
    "ckpt-empty": f"checkpoint unreadable: TMP/run/checkpoint.pt (empty file); {RESTART}",
    "lr-nan": "algorithm.lr must be a finite number, got nan",
    "lr-decay-nan": "algorithm.lr_decay must be a finite number, got nan",
    "seed-negative": "experiment.seed must be ≥ 0, got -1",
    "dirichlet-nan": "data.dirichlet_alpha must be a finite number, got nan",
    "clients-per-rank-vmap": "engine.clients_per_rank = 'foo' applies to engine = 'distributed' only (engine is 'vmap'); drop it",
    "positive-classes-empty": "data.positive_classes is empty: name at least one class, or leave the key out for the default (the upper half of the classes)",
    "batch-too-large": "data.batch_size = 100000 exceeds every client's data (largest shard: 629 samples); training with batches of 629",
    "npz-nan": "TMP/data.npz: x_train: 3 non-finite value(s) (NaN/inf) in rows 0, 1, 2 (0-based); fix or drop those rows",
    "npz-inf-test": "TMP/data.npz: x_test: 1 non-finite value(s) (NaN/inf) in row 4 (0-based); fix or drop those rows",
    "csv-nan": "TMP/tab: missing values (blank, '?' or NA) in column(s) 'a' (1 of 40 rows); set data.on_missing to drop_rows, drop_columns or impute (docs/data.md)",
    "idx-float-nan": "TMP/mnist/train-images-idx3-ubyte.gz: 2 non-finite value(s) (NaN/inf) in rows 3, 5 (0-based); fix or drop those rows",
    "y-test-half": "TMP/data.npz: y_test: labels must be integer class ids, found 0.5 at row 2 (0-based)",
    "csv-no-features": "TMP/tab/data.csv: no feature columns besides 'label' (header ['label']); expected: …",
    "test-one-class": "TMP/data.npz: the test set holds only negatives (30 rows, positive classes [1]); AUROC is undefined without both classes",
    "stray-label": "TMP/data.npz: y_train: class id(s) 7 at row 10 (0-based) but no class 2; class ids must be 0..C-1 without gaps (binary data: 0/1 only)",
    "npz-empty-train": "TMP/data.npz: x_train and y_train hold no rows",
    "npz-zero-bytes": "TMP/data.npz: not a readable .npz archive (empty file); expected: …",
    "npz-string-x": "TMP/data.npz: x_train: features must be numbers, found <U4 values such as 'high'",
    "csv-label-negative": "TMP/tab/data.csv: labels must be class ids ≥ 0, found -1 at row 5",
    "csv-latin1": "TMP/tab/data.csv: not UTF-8 text (byte 0xe9 at offset 5); save it as UTF-8",
    "manifest-short-row": "TMP/man/manifest.csv row 5: 1 field(s), the header has 2",
    "privacy-sigma-zero": "privacy.noise_multiplier must be a finite number > 0 (σ = 0 adds no noise: ε would be infinite), got 0; drop [privacy] for a run without DP",
    "privacy-fixed-no-client": "privacy.sampling_rate = 0.01 with sampling 'fixed' draws round(q·K) = 0 of K = 2 clients per round; set sampling_rate above 0.25 (one client) or sampling = 'poisson'",
    "csv-duplicate-column": "TMP/tab/data.csv: column 'a' appears 2 times in the header; rename one",
    "init-from-integers": "model.init_from: 'TMP/int.pt' holds integer tensors for floating-point weights in fc.weight, fc.bias (torch.int64); save the trained model's float weights",
    "reset-head-alone": "model.reset_head without model.init_from does nothing (every weight is freshly initialised); set model.init_from (--init-from) to the weights to start from, or drop reset_head",
    "resume-damaged-summary": "TMP/run/summary.json is unreadable (JSONDecodeError) and model.pt exists: the run may have finished; nothing to resume (move summary.json away to resume anyway)",
}  # fmt: skip


def test_every_case_has_an_expected_message():
    assert sorted(EXPECTED) == sorted(c.id for c in table.CASES)


def test_docs_table_is_the_rendering_of_the_committed_results():
    rows = json.loads((ROOT / "benchmarks/results/reliability.json").read_text())
    rendered = (ROOT / "benchmarks/results/reliability.md").read_text()
    assert table.render(rows) == rendered
    doc = (ROOT / "docs/reliability.md").read_text()
    assert (
        f"<!-- BEGIN GENERATED benchmarks/results/reliability.md -->\n{rendered}<!-- END GENERATED -->" in doc
    )


@pytest.mark.parametrize("case", table.CASES, ids=lambda c: c.id)
def test_bad_input_stops_with_one_line_before_anything_is_written(case, tmp_path):
    row = table.run_case(case, tmp_path)
    if case.runs:  # accepted with a warning, before training
        assert (row["message"], row["exit"]) == (f"Warning: {EXPECTED[case.id]}", 0)
    else:
        assert row["message"] == f"Error: {EXPECTED[case.id]}"
        assert row["exit"] == 2
        assert row["untouched"]  # absent stays absent; a user's folder or a damaged run is left as it was
    assert COMMITTED[case.id]["message"] == row["message"]  # docs/reliability.md shows this very line


def test_a_batch_larger_than_some_shards_is_a_warning_and_larger_than_all_is_capped():
    from fedxrisk.run.build import check_batch_size

    with pytest.warns(UserWarning) as caught:
        assert check_batch_size(5, [3, 10, 4]) == 5
        assert check_batch_size(11, [3, 10, 4]) == 10
    assert [str(w.message) for w in caught] == [
        "data.batch_size = 5 exceeds the data of 2 client(s) (smallest shard: 3 samples): they repeat samples "
        "within a batch",
        "data.batch_size = 11 exceeds every client's data (largest shard: 10 samples); training with batches of 10",
    ]


def test_a_capped_batch_trains_like_the_largest_shard(tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        capped = run_experiment(RunConfig(**{**CFG, "batch_size": 10**5}), tmp_path / "capped")
    largest = max(pos + neg for pos, neg in capped.summary["data"]["client_counts"])
    exact = run_experiment(RunConfig(**{**CFG, "batch_size": largest}), tmp_path / "exact")
    assert capped.summary["final"] == exact.summary["final"]


CFG = dict(
    clients=2, rounds=4, stages=1, lr=0.1, local_steps=2, eval_every=1, checkpoint_every=2, tensorboard=False
)


def _params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt", weights_only=True)["params"]


def test_model_pt_is_written_before_the_summary_commits_the_run(tmp_path, monkeypatch):
    order = []
    real = run_folder.replace_atomic
    monkeypatch.setattr(
        run_folder, "replace_atomic", lambda path, *a, **k: (order.append(path.name), real(path, *a, **k))
    )
    run_experiment(RunConfig(**CFG), tmp_path / "run")
    assert order.index("model.pt") < order.index("summary.json")


@pytest.mark.parametrize("keep_checkpoint", [True, False])
def test_resume_finishes_a_run_whose_summary_exists_but_not_its_model(tmp_path, monkeypatch, keep_checkpoint):
    """A kill between summary.json and model.pt (the order older versions wrote them in)."""
    reference = run_experiment(RunConfig(**CFG), tmp_path / "ref")
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(run_folder, "save_model", lambda path, *a: None)  # killed: no model.pt
        run_experiment(RunConfig(**CFG), out)
    if keep_checkpoint:  # the round-2 checkpoint the old order left behind
        stopped = tmp_path / "stopped"
        with pytest.raises(KeyboardInterrupt):
            run_experiment(RunConfig(**CFG), stopped, lambda r, d, t: _interrupt(d == 3))
        (out / CHECKPOINT).write_bytes((stopped / CHECKPOINT).read_bytes())
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert not (out / "model.pt").exists()
    result = CliRunner().invoke(main, ["run", "--resume", str(out), "-q"])
    assert result.exit_code == 0, result.output
    expected = _params(reference.out_dir)
    assert all(torch.equal(a, expected[k]) for k, a in _params(out).items())
    assert load_run(out).summary["final"] == reference.summary["final"]
    again = CliRunner().invoke(main, ["run", "--resume", str(out), "-q"])
    assert again.exit_code == 2 and "already finished (status: completed); nothing to resume" in again.output


def _interrupt(now: bool) -> None:
    if now:
        raise KeyboardInterrupt


def test_nan_round_is_1_based_and_the_failed_run_resumes_with_a_lower_lr(tmp_path, monkeypatch):
    out = tmp_path / "run"
    finite = Simulation._finite
    monkeypatch.setattr(Simulation, "_finite", lambda self, comm: self.round != 3 and finite(self, comm))
    result = CliRunner().invoke(main, ["run", *_flags(CFG), "--out", str(out), "-q"])
    assert result.exit_code == 1
    assert " ".join(result.output.split()) == (
        f"error: non-finite loss or model (NaN/inf) at round 3; training stopped. History so far is kept in "
        f"{out}; continue from the last finite checkpoint with smaller steps: fedxrisk run --resume {out} "
        "--set algorithm.lr=<lower>"
    )
    assert [r["round"] for r in csv.DictReader(open(out / "history.csv"))] == ["1", "2"]  # round 3 failed
    assert run_folder.load_checkpoint(out / CHECKPOINT)["simulation"]["round"] == 2  # the last finite one
    monkeypatch.undo()

    refused = CliRunner().invoke(main, ["run", "--resume", str(out), "--set", "data.clients=3"])
    assert refused.exit_code == 2
    assert "--resume takes --set algorithm.lr or algorithm.lr_decay only" in refused.output
    resumed = CliRunner().invoke(main, ["run", "--resume", str(out), "--set", "algorithm.lr=0.01", "-q"])
    assert resumed.exit_code == 0, resumed.output
    run = load_run(out)
    assert run.summary["status"] == "completed" and run.summary["config"]["lr"] == 0.01
    assert [r["round"] for r in run.history] == [1, 2, 3, 4] and run.summary["resumed_at_rounds"] == [2]
    assert [r["lr"] for r in run.history] == [0.1, 0.1, 0.01, 0.01]  # rounds 1-2 kept from before the failure
    assert "lr = 0.01" in (out / "config.toml").read_text()


def _flags(cfg: dict) -> list[str]:
    names = {
        "local_steps": "--local-steps",
        "eval_every": "--eval-every",
        "checkpoint_every": "--checkpoint-every",
    }
    return [x for k, v in cfg.items() if k != "tensorboard" for x in (names.get(k, f"--{k}"), str(v))]


STORE_HOST_GONE = """
import socket
from datetime import timedelta
import fedxrisk  # first, as `torchrun -m fedxrisk` does
import torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # nobody listens: the store's host (rank 0) is gone
try:
    dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=1), wait_for_workers=False)
except Exception as e:
    print("caught", type(e).__name__)
"""


@pytest.mark.slow  # a real process per case
@pytest.mark.parametrize("launched", [False, True])
def test_a_lost_store_host_prints_no_cpp_warnings_in_a_torchrun_rank(launched):
    """torch's C++ store client warns (with a C++ stack) on every failed contact with a dead rank 0;
    in a rank launched by torchrun, importing fedxrisk keeps only errors."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TORCH_CPP_LOG_LEVEL")}
    env["PYTHONPATH"] = str(ROOT / "src")
    if launched:
        env.update(RANK="1", WORLD_SIZE="2")
    proc = subprocess.run([sys.executable, "-c", STORE_HOST_GONE], env=env, capture_output=True, text=True)
    assert proc.stdout.strip() == "caught DistNetworkError", proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("[W")]
    assert (warnings == []) if launched else ("TCP client failed to connect" in warnings[0]), proc.stderr

"""Flower's app writers run the same check as the run and the ServerApp (issue 39): a config or a
model the server would refuse is refused by `new-app` / `evaluate` in one line (exit 2), with
nothing written."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr")

from click.testing import CliRunner  # noqa: E402

from fedxrisk.flower.__main__ import main  # noqa: E402
from fedxrisk.run.folder import model_bytes  # noqa: E402


def _refused(args, folder) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert not folder.exists() or not any(folder.iterdir())  # nothing written
    return lines[0]


@pytest.mark.parametrize(
    "sets, reason",
    [
        (['server={"lr": -1}'], "server.lr must be a finite number > 0, got -1"),
        (['server={"momentum": 0.9}'], "unknown key 'server.momentum'"),
        (["personal=head", "selection=best", "validation=0.2"], "personal = 'head' with selection = 'best'"),
        (["positives-per-batch=40"], "positives-per-batch must lie in [1, batch-size − 1] = [1, 31], got 40"),
    ],
)
def test_new_app_refuses_what_the_server_would(tmp_path, sets, reason):
    app = tmp_path / "app"
    line = _refused(["new-app", str(app), *[a for s in sets for a in ("--set", s)]], app)
    assert reason in line


def test_new_app_writes_a_config_the_server_accepts(tmp_path):
    result = CliRunner().invoke(main, ["new-app", str(tmp_path / "app"), "--set", 'server={"lr": 0.5}',
                                       "--set", "algorithm=localsgdm"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "app" / "pyproject.toml").is_file()


def _model(path, shape=(4,)):
    state = {"fc.weight": torch.ones(1, shape[0]), "fc.bias": torch.zeros(1)}
    path.write_bytes(model_bytes("linear", shape, 1, state, {}))
    return path


def _eval(tmp_path, *args):
    app = tmp_path / "app"
    return _refused(
        ["evaluate", str(app), *args, "--set", "secure-aggregation=true", "--set", "min-nodes=2"], app
    )


def test_evaluate_refuses_a_model_pt_that_is_not_the_runs(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _model(run / "model.pt")
    (run / "summary.json").write_text(json.dumps({"model_sha256": "0" * 64}))
    for model in (run, run / "model.pt"):
        assert "is not the model this run wrote" in _eval(tmp_path, "--model", str(model))


def test_evaluate_refuses_a_model_that_does_not_exist(tmp_path):
    assert (
        _eval(tmp_path, "--model", str(tmp_path / "nope.pt"))
        == f"Error: --model {tmp_path / 'nope.pt'} does not exist"
    )


def test_evaluate_refuses_against_a_model_of_another_input_shape(tmp_path):
    a, b = _model(tmp_path / "a.pt"), _model(tmp_path / "b.pt", (5,))
    line = _eval(tmp_path, "--model", str(a), "--against", str(b), "--exact")
    assert "takes inputs [5] but --model" in line and "[4]" in line


def test_evaluate_is_private_by_default_and_exact_only_when_named(tmp_path):
    """Issue 40 item 4: the default evaluation is the private release (with or without SecAgg+: the
    sites add the noise); the paired test needs --exact, whose output states what it discloses."""
    a, b, app = _model(tmp_path / "a.pt"), _model(tmp_path / "b.pt"), tmp_path / "app1"
    plain = CliRunner().invoke(main, ["evaluate", str(app), "--model", str(a), "--set", "min-nodes=2"])
    assert plain.exit_code == 0, plain.output
    assert (
        "private evaluation: one (1, 1e-05)-DP release" in plain.output and "NOT PRIVATE" not in plain.output
    )
    assert "dp=(1.0, 1e-05)" in (app / "fedxrisk_app.py").read_text()
    line = _eval(tmp_path, "--model", str(a), "--against", str(b))
    assert "--against and --site-auroc need --exact" in line
    assert "drop --dp-epsilon" in _eval(tmp_path, "--model", str(a), "--exact", "--dp-epsilon", "2")
    exact = CliRunner().invoke(main, ["evaluate", str(tmp_path / "app2"), "--model", str(a), "--exact",
                                      "--set", "min-nodes=2"])  # fmt: skip
    assert exact.exit_code == 0 and "NOT PRIVATE — exact mode" in exact.output
    assert "dp=None" in (tmp_path / "app2" / "fedxrisk_app.py").read_text()


def test_evaluate_refuses_a_linked_folder(tmp_path):
    a, real, link = _model(tmp_path / "a.pt"), tmp_path / "real", tmp_path / "link"
    real.mkdir()
    (real / "notes.txt").write_text("mine")
    link.symlink_to(real)
    result = CliRunner().invoke(main, ["evaluate", str(link), "--model", str(a)])
    assert result.exit_code == 2 and "symbolic link" in result.output
    assert sorted(p.name for p in real.iterdir()) == ["notes.txt"]

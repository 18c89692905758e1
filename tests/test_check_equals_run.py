"""`fedxrisk check` is the run's check (issue 39): each config `fedxrisk run` refuses is refused by
`check` with the same one line, before any data is read; combinations that would silently do
nothing get a meaning or a refusal; every error of a file is listed at once."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main

RUN = ["--rounds", "1", "--eval-every", "1", "--clients", "2", "--engine", "loop", "-q"]


def _errors(result) -> list[str]:
    return [line[len("Error: ") :] for line in result.stderr.splitlines() if line.startswith("Error: ")]


def _check_and_run(tmp_path, *sets: str) -> tuple[list[str], list[str], object]:
    args = [a for s in sets for a in ("--set", s)]
    check = CliRunner().invoke(main, ["check", *args])
    run = CliRunner().invoke(main, ["run", *RUN, *args, "--out", str(tmp_path / "run")])
    assert check.exit_code == 2 and run.exit_code == 2, (check.output, run.output)
    return _errors(check), _errors(run), run


REFUSED = {  # the --set that `fedxrisk run` refused after loading data, and the reason's start
    "server.tau=0": "server.tau must be a finite number > 0",
    "server.beta2=1": "server.beta2 must lie in [0, 1)",
    "server.lr=0": "server.lr must be a finite number > 0",
    'server.optimizer="adamm"': "server.optimizer must be one of sgd, adam, yogi, adagrad",
    "server.lr=-5": "server.lr must be a finite number > 0, got -5.0",
    "server.beta1=7": "server.beta1 must lie in [0, 1), got 7.0",
    'model.personal="bn"': "model.personal = 'bn': the model 'mlp' has no BatchNorm layer",
    "data.positives_per_batch=40": "data.positives_per_batch must lie in [1, batch_size − 1] = [1, 31], got 40",
}


@pytest.mark.parametrize("setting", list(REFUSED))
def test_check_refuses_what_run_refuses_with_the_same_line(tmp_path, setting):
    check, run, _ = _check_and_run(tmp_path, setting)
    assert len(check) == 1 and check[0].startswith(REFUSED[setting]), check
    assert run == check  # the same one line, and run wrote nothing
    assert not (tmp_path / "run").exists()


def test_a_server_optimizer_the_run_accepts_is_ok_for_check():
    result = CliRunner().invoke(main, ["check", "--set", 'server.optimizer="adam"', "--set", "server.lr=0.5"])
    assert result.exit_code == 0 and result.stdout.splitlines()[0] == "ok"
    assert "needs the data" in result.stderr  # what check cannot see is named


def test_every_error_of_a_file_is_listed_at_once(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        '[experiment]\nrounds = -3\n[algorithm]\nlocal_steps = 0\n[server]\nmomentum = 0.9\nlr = "x"\n'
    )
    errors = _errors(CliRunner().invoke(main, ["check", str(path)]))
    assert len(errors) == 4, errors
    assert errors[0].startswith("unknown key 'server.momentum'")
    assert errors[1].startswith("server.lr: expected")
    assert errors[2:] == ["experiment.rounds must be ≥ 1, got -3", "algorithm.local_steps must be ≥ 1, got 0"]


# -- combinations that silently did nothing ------------------------------------------------------


def test_personal_head_on_the_linear_model_is_refused_with_the_way_out(tmp_path):
    check, run, _ = _check_and_run(tmp_path, 'model.model="linear"', 'model.personal="head"')
    assert run == check and len(check) == 1
    assert "head is the whole model" in check[0] and "personal = 'none'" in check[0]


def test_validation_noise_without_a_validation_release_is_refused(tmp_path):
    privacy = ["privacy.clip=1.0", "privacy.noise_multiplier=1.0", "privacy.validation_noise_multiplier=3"]
    check, run, _ = _check_and_run(tmp_path, *privacy)
    assert run == check and check[0].startswith("privacy.validation_noise_multiplier is set but nothing")
    sets = [a for s in (*privacy, 'experiment.selection="best"', "data.validation=0.2") for a in ("--set", s)]
    assert CliRunner().invoke(main, ["check", *sets]).exit_code == 0  # with a release, it applies


def test_model_layers_declared_for_personal_match_the_built_models():
    """run/combos.MODEL_LAYERS (read without torch) says what personal_names finds in each model."""
    from fedxrisk.models import MODELS
    from fedxrisk.problem import personal_names
    from fedxrisk.run.combos import MODEL_LAYERS

    assert set(MODEL_LAYERS) == set(MODELS)
    shapes = {"linear": (8,), "mlp": (8,), "cnn1d": (1, 16)}
    for name, layers in MODEL_LAYERS.items():
        build = MODELS["densenet121" if name == "densenet121_imagenet" else name]  # same layers, no weights
        model = build(shapes.get(name, (3, 32, 32)))
        for personal in ("bn", "head"):
            try:
                kept = personal_names(model, personal)
            except ValueError:
                kept = frozenset()
            whole = set(kept) == {n for n, _ in [*model.named_parameters(), *model.named_buffers()]}
            assert layers[personal] == (bool(kept) and not whole), (name, personal)


def _coda_plus(optimizer):
    from fedxrisk.algorithms import ALGORITHMS, Schedule
    from fedxrisk.data import make_federated
    from fedxrisk.engines import Simulation
    from fedxrisk.engines.server_opt import with_server_optimizer
    from fedxrisk.models import build_model
    from fedxrisk.problem import Problem

    data = make_federated("digits", 3, "class", 0.3, 0)
    alg = ALGORITHMS["codaplus"](Problem(build_model("mlp", data.data.input_shape, 0), data.data.pos_ratio))
    alg = alg if optimizer is None else with_server_optimizer(alg, optimizer)
    sim = Simulation(
        alg, data, Schedule.build(3, 2, 0.1, 3), 8, 0, "loop"
    )  # stages = rounds: every round ends one
    for _ in range(3):
        sim.run_round()
    return sim.states["w"]


def test_a_server_optimizer_survives_coda_plus_stage_restarts_at_stages_equal_rounds():
    """Every round ends a stage and CODA+ restarts from the stage average: the server step used to be
    discarded (the same model as without [server]); it now acts on the restart point."""
    from fedxrisk.engines.server_opt import ServerOptimizer

    plain = _coda_plus(None)
    stepped = _coda_plus(ServerOptimizer("sgd", lr=2.0, beta1=0.0))
    identity = _coda_plus(ServerOptimizer("sgd", lr=1.0, beta1=0.0))  # x − 1·(x − restart) = restart
    assert max((stepped[k] - plain[k]).abs().max().item() for k in plain) > 1e-3
    assert all(torch.allclose(identity[k], plain[k], atol=1e-6) for k in plain)


def test_fedxrisk_run_with_server_and_coda_plus_at_stages_equal_rounds_changes_model_pt(tmp_path):
    """The issue's case end to end: CODA+ with stages = rounds, [server] sgd; model.pt used to have the
    sha256 of the run without [server]."""
    import json

    base = ["run", "-a", "codaplus", "--rounds", "2", "--stages", "2", "--clients", "2", "--eval-every", "2",
            "--engine", "loop", "-q"]  # fmt: skip
    digests = []
    for name, sets in (
        ("plain", []),
        ("server", ["--set", 'server.optimizer="sgd"', "--set", "server.lr=2.0"]),
    ):
        result = CliRunner().invoke(main, [*base, *sets, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        digests.append(json.loads((tmp_path / name / "summary.json").read_text())["model_sha256"])
    assert digests[0] != digests[1]

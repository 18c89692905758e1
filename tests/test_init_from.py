"""Starting from saved weights (``model.init_from``, ``reset_head``) and two-stage ``[pretrain]`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.cli import main
from fedxrisk.experiment import (
    ConfigError,
    RunConfig,
    build,
    load_run,
    resume_experiment,
    run_experiment,
)
from fedxrisk.models import MODELS, DenseNet, build_model
from fedxrisk.run import recipes
from fedxrisk.run.configfile import config_to_toml, load_config
from fedxrisk.run.folder import PRETRAIN_DIR
from fedxrisk.run.stage import pretrain_config
from fedxrisk.run.weights import head_name, load_weights

# BatchNorm model: buffers must travel with the weights
BASE = dict(
    model="cnn", clients=2, rounds=2, stages=1, local_steps=2, batch_size=16, eval_every=1, tensorboard=False
)
METRICS = ("test_auroc", "test_ap", "test_pauc30_norm", "test_pauc50_mcclish", "client_auroc_mean")


def _weights(path) -> dict[str, torch.Tensor]:
    blob = torch.load(path / "model.pt", weights_only=True)
    return {**blob["params"], **blob["buffers"]}


def _start(setup) -> dict[str, torch.Tensor]:
    """Every client's starting model, stacked: equal rows or the test fails below."""
    params, buffers = setup.algorithm.model(setup.simulation.states)
    return {**params, **buffers}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return run_experiment(RunConfig(**BASE), tmp_path_factory.mktemp("a") / "run")


def test_round0_of_a_run_from_a_finished_run_equals_its_final_metrics(finished, tmp_path):
    cfg = RunConfig(**BASE | {"rounds": 1, "algorithm": "codaplus"}, init_from=str(finished.out_dir))
    run = run_experiment(cfg, tmp_path / "b")
    first = run.history[0]
    assert (first["round"], first["step"], first["bytes_up_per_client"]) == (0, 0, 0)
    for key in METRICS:
        assert first[key] == finished.summary["final"][key], key
    assert run.summary["init"] == {
        "from": str(finished.out_dir),
        "reset_head": False,
        "head": "head",
        "keys_loaded": 16,
    }
    assert [r["round"] for r in load_run(run.out_dir).history] == [0, 1]


@pytest.mark.parametrize("engine", ["loop", pytest.param("vmap", marks=pytest.mark.slow)])
def test_every_algorithm_starts_from_exactly_the_loaded_weights(finished, engine):
    saved = _weights(finished.out_dir)
    for name in [n for n, cls in ALGORITHMS.items() if cls.task == "binary"]:  # BASE is binary data
        cfg = RunConfig(
            **BASE | {"algorithm": name, "engine": engine, "batch_size": 32}, init_from=str(finished.out_dir)
        )
        cfg.local_steps = ALGORITHMS[name].fixed_window or 2
        cfg.stages = 2 if name == "coda" else 1  # CoDA refuses one stage (it would be CODA+)
        start = _start(build(cfg))
        assert set(start) == set(saved), name
        for k, v in saved.items():
            assert torch.equal(start[k], v.expand_as(start[k])), (name, k)


def test_reset_head_keeps_a_fresh_seeded_head_and_loads_the_rest(finished):
    cfg = RunConfig(**BASE | {"seed": 3}, init_from=str(finished.out_dir), reset_head=True)
    start, saved = _start(build(cfg)), _weights(finished.out_dir)
    fresh = build_model("cnn", (1, 8, 8), 3).state_dict()
    for k, v in saved.items():
        expected = fresh[k] if k.startswith("head.") else v
        assert torch.equal(start[k][0], expected), k
    assert not torch.equal(fresh["head.weight"], saved["head.weight"])


def test_state_dict_files_plain_nested_and_dataparallel(tmp_path):
    model = build_model("mlp", (1, 8, 8), 7)
    files = {
        "plain.pt": model.state_dict(),
        "nested.pt": {"epoch": 3, "state_dict": model.state_dict()},
        "ddp.pth": {f"module.{k}": v for k, v in model.state_dict().items()},
    }
    for name, obj in files.items():
        torch.save(obj, tmp_path / name)
        target = build_model("mlp", (1, 8, 8), 0)
        load_weights(target, "mlp", tmp_path / name)
        for k, v in model.state_dict().items():
            assert torch.equal(target.state_dict()[k], v), (name, k)


def test_every_bundled_model_names_its_last_linear_layer_as_head():
    shapes = {
        "densenet121": (3, 32, 32),
        "densenet121_imagenet": None,
        "resnet20": (3, 8, 8),
        "cnn28": (1, 28, 28),
        "cnn1d": (40,),
    }
    for name in MODELS:
        shape = shapes.get(name, (1, 8, 8))
        if shape is None:  # needs local ImageNet weights; same class as densenet121
            continue
        model = build_model(name, shape)
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        assert head_name(model) == linears[-1], name


# -- bad input -------------------------------------------------------------------------------
def _cli(tmp_path, *args):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["run", "--rounds", "1", "--stages", "1", "--clients", "2", "--out", str(out), "-q", *args]
    )
    return result, out


def test_missing_path_and_not_a_model_file_exit_2_before_writing(tmp_path):
    result, out = _cli(tmp_path, "--init-from", str(tmp_path / "nope"))
    assert result.exit_code == 2 and not out.exists()
    assert f"Error: model.init_from: '{tmp_path / 'nope'}' does not exist" in result.output
    (tmp_path / "notes.txt").write_text("hello")
    result, out = _cli(tmp_path, "--init-from", str(tmp_path / "notes.txt"))
    assert result.exit_code == 2 and not out.exists()
    assert (
        f"Error: model.init_from: '{tmp_path / 'notes.txt'}' is not a PyTorch weights file (" in result.output
    )
    (tmp_path / "empty").mkdir()
    result, out = _cli(tmp_path, "--init-from", str(tmp_path / "empty"))
    assert result.exit_code == 2 and not out.exists()
    message = (
        f"Error: model.init_from: folder '{tmp_path / 'empty'}' has no model.pt (not a finished fedxrisk run)"
    )
    assert message in result.output
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "meta.pt")
    result, out = _cli(tmp_path, "--init-from", str(tmp_path / "meta.pt"))
    assert result.exit_code == 2 and not out.exists()
    assert f"'{tmp_path / 'meta.pt'}' holds no state dict (expected a dict of tensors" in result.output


def test_mismatch_names_missing_unexpected_and_shape_mismatched_keys(finished, tmp_path):
    state = dict(_weights(finished.out_dir))
    del state["features.0.bias"]
    state["extra.weight"] = torch.zeros(2, 3)
    state["head.weight"] = torch.zeros(1, 5)
    torch.save(state, tmp_path / "w.pt")
    with pytest.raises(ConfigError) as e:
        build(RunConfig(**BASE, init_from=str(tmp_path / "w.pt")))
    assert str(e.value) == (
        f"model.init_from: '{tmp_path / 'w.pt'}' does not fit model 'cnn': missing (1): features.0.bias [16]; "
        "unexpected (1): extra.weight [2, 3]; shape mismatch (1): head.weight file [1, 5] vs model [1, 128]"
    )
    # a run of another model: the message says which model the file holds
    result, out = _cli(tmp_path, "--model", "linear", "--init-from", str(finished.out_dir))
    assert result.exit_code == 2 and not out.exists()
    assert (
        "does not fit model 'linear' (the file holds a 'cnn' model): missing (2): fc.weight [1, 64], fc.bias [1]; "
        in result.output
    )


def test_reset_head_ignores_the_head_shape(finished, tmp_path):
    state = dict(
        _weights(finished.out_dir), **{"head.weight": torch.zeros(1000, 128), "head.bias": torch.zeros(1000)}
    )
    torch.save(state, tmp_path / "imagenet_like.pt")
    setup = build(RunConfig(**BASE, init_from=str(tmp_path / "imagenet_like.pt"), reset_head=True))
    assert setup.init["keys_loaded"] == 14  # 16 minus head.weight, head.bias


class NoHead(nn.Module):
    def __init__(self, input_shape, num_outputs=1):
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], num_outputs, 8)

    def forward(self, x):
        return self.conv(x).flatten(1)


def test_reset_head_on_a_model_without_a_head(monkeypatch, finished):
    monkeypatch.setitem(MODELS, "nohead", NoHead)
    with pytest.raises(ConfigError) as e:
        build(RunConfig(**BASE | {"model": "nohead"}, reset_head=True))
    assert str(e.value) == (
        "model.reset_head: model 'nohead' has no classifier head (no head_name attribute and no nn.Linear layer)"
    )


# -- two stages --------------------------------------------------------------------------------
TWO = dict(BASE, algorithm="codasca", rounds=2, checkpoint_every=1)
PRE = {"rounds": 2, "lr": 0.05}


@pytest.fixture(scope="module")
def two_stage(tmp_path_factory):
    """The run, and each stage's starting models (all clients) as training began."""
    starts, train = [], recipes.train

    def spy(setup, folder, callbacks, ckpt):
        starts.append({k: v.clone() for k, v in _start(setup).items()})
        return train(setup, folder, callbacks, ckpt)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recipes, "train", spy)
        result = run_experiment(RunConfig(**TWO, pretrain=PRE), tmp_path_factory.mktemp("two") / "run")
    return result, starts


def test_two_stage_main_stage_starts_from_exactly_the_pretrained_model(two_stage):
    two_stage, (_, main_start) = two_stage
    out = two_stage.out_dir
    pre = load_run(out / PRETRAIN_DIR)
    assert pre.summary["algorithm"] == "localsgdm" and pre.summary["rounds"] == 2
    assert two_stage.summary["init"]["from"] == PRETRAIN_DIR
    assert two_stage.summary["init"]["pretrain"]["final"] == pre.summary["final"]
    for key in METRICS:  # round 0 of the AUC stage evaluates the pretrained model
        assert two_stage.history[0][key] == pre.summary["final"][key], key
    saved = _weights(out / PRETRAIN_DIR)
    assert set(main_start) == set(saved)
    for k, v in saved.items():  # every client of the AUC stage starts from stage 1's model.pt
        assert torch.equal(main_start[k], v.expand_as(main_start[k])), k
    resumed = _start(build(RunConfig(**TWO, pretrain=PRE), init=out / PRETRAIN_DIR))  # the resume path
    for k, v in saved.items():
        assert torch.equal(resumed[k], v.expand_as(resumed[k])), k


def test_two_stage_config_round_trips_and_names_bad_pretrain_keys(tmp_path):
    cfg = RunConfig(**TWO, pretrain={"algorithm": "centralized", "rounds": 3, "momentum": 0.5})
    (tmp_path / "c.toml").write_text(config_to_toml(cfg))
    assert load_config(tmp_path / "c.toml").to_dict() == cfg.to_dict()
    assert load_config(tmp_path / "c.toml", ["pretrain.rounds=7"]).pretrain["rounds"] == 7
    stage = pretrain_config(cfg)
    assert (stage.algorithm, stage.clients, stage.partition, stage.options) == (
        "localsgdm",
        1,
        "iid",
        {"momentum": 0.5},
    )
    with pytest.raises(ConfigError, match=r"^unknown key 'pretrain.momentun' \(did you mean 'momentum'\?\)"):
        load_config(tmp_path / "c.toml", ["pretrain.momentun=0.5"])
    with pytest.raises(ConfigError, match=r"^pretrain.rounds must be ≥ 1, got 0$"):
        load_config(tmp_path / "c.toml", ["pretrain.rounds=0"])
    with pytest.raises(ConfigError, match=r"^pretrain.momentum must lie in \[0, 1\), got 1.5 \(localsgdm\)$"):
        load_config(tmp_path / "c.toml", ["pretrain.momentum=1.5"])
    with pytest.raises(
        ConfigError, match=r"^pretrain.algorithm: unknown algorithm 'sgd'; choose 'centralized' or one of "
    ):
        load_config(tmp_path / "c.toml", ["pretrain.algorithm='sgd'"])


def _interrupt_at(call: int):
    calls = []

    def callback(row, done, total):
        calls.append(done)
        if len(calls) == call:
            raise KeyboardInterrupt

    return callback


LONGER = RunConfig(**TWO | {"rounds": 3}, pretrain=PRE | {"rounds": 3})


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return run_experiment(LONGER, tmp_path_factory.mktemp("three") / "run")


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(2, id="during-pretrain", marks=pytest.mark.slow),
        pytest.param(6, id="during-main", marks=pytest.mark.slow),
    ],
)
def test_two_stage_resumes_from_either_stage(uninterrupted, tmp_path, call):
    # callbacks: pretrain rounds 1, 2, 3; main rounds 0, 1, 2, 3 → call 2 stops stage 1 after
    # round 2 (checkpointed), call 6 stops the main stage after round 2
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(LONGER, out, _interrupt_at(call))
    assert not (out / "summary.json").exists()
    resumed = resume_experiment(out)
    assert resumed.summary["final"] == uninterrupted.summary["final"]
    assert resumed.summary["init"]["pretrain"]["final"] == uninterrupted.summary["init"]["pretrain"]["final"]
    assert [r["round"] for r in resumed.history] == [0, 1, 2, 3]


def test_bundled_two_stage_config_runs_from_one_command(tmp_path):
    config = Path(__file__).resolve().parents[1] / "configs" / "two_stage.toml"
    result, out = _cli(tmp_path, "--config", str(config), "--pretrain-rounds", "2", "--eval-every", "1")
    assert result.exit_code == 0, result.output
    run, pre = load_run(out), load_run(out / PRETRAIN_DIR)
    assert (pre.summary["algorithm"], pre.summary["rounds"], pre.summary["status"]) == (
        "localsgdm",
        2,
        "completed",
    )
    assert run.summary["init"]["pretrain"]["rounds"] == 2 and run.summary["init"]["reset_head"] is True
    assert [r["round"] for r in run.history] == [0, 1] and run.summary["algorithm"] == "codasca"
    expected = {
        "algorithm": "localsgdm",
        "rounds": 2,
        "local_steps": 8,
        "lr": 0.1,
        "stages": 1,
        "momentum": 0.9,
    }
    assert load_config(out / "config.toml").pretrain == expected


def test_torchvision_densenet_file_with_old_key_names_loads_with_a_fresh_head(tmp_path):
    small = dict(blocks=(2, 1), growth=8, init_features=16)  # DenseNet-121's layout, fewer layers
    torch.manual_seed(1)
    imagenet = DenseNet((3, 32, 32), 1000, **small).state_dict()
    old = {k.replace("norm1", "norm.1").replace("conv2", "conv.2"): v for k, v in imagenet.items()}
    assert "features.denseblock1.denselayer1.norm.1.weight" in old
    torch.save(old, tmp_path / "densenet121-a639ec97.pth")
    torch.manual_seed(0)
    model = DenseNet((3, 32, 32), 5, **small)
    info = load_weights(model, "densenet121", tmp_path / "densenet121-a639ec97.pth", reset_head=True)
    assert info["head"] == "classifier" and model.classifier.weight.shape == (5, 24)
    for k, v in model.state_dict().items():
        if not k.startswith("classifier."):
            assert torch.equal(v, imagenet[k]), k


def test_compare_varies_the_pretrain_stage():
    from fedxrisk.compare import build_variants

    base = {"experiment": {"rounds": 2}, "algorithm": {"stages": 1}, "pretrain": {"rounds": 1}}
    variants = build_variants(base, vary={"pretrain.rounds": [1, 3]})
    assert [v.label for v in variants] == ["codasca pretrain.rounds=1", "codasca pretrain.rounds=3"]
    assert [v.configs[0].pretrain for v in variants] == [{"rounds": 1}, {"rounds": 3}]

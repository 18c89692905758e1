"""Issue 34's one-line refusals around a finished run: evaluate / predict / plot to an output that
cannot be made or a device that does not exist, a config.toml edited after the run, a damaged
summary.json on resume, a full disk at the first checkpoint, and weights that cannot be a start."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.errors import ConfigError
from fedxrisk.experiment import RunConfig, build, run_experiment

TINY = dict(rounds=2, stages=1, eval_every=1, clients=2, tensorboard=False, checkpoint_every=1)


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(result) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "run"
    run_experiment(RunConfig(**TINY), out)
    np.savez(out.parent / "x.npz", x=np.random.default_rng(0).normal(size=(5, 1, 8, 8)).astype(np.float32))
    return out


@pytest.fixture
def copy(run, tmp_path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def _commands(run: Path, out: str) -> dict[str, list]:
    return {
        "evaluate": ["evaluate", run, "--bootstrap", 0, "--out", out, "-q"],
        "predict": ["predict", run, run.parent / "x.npz", "--out", f"{out}/scores.csv", "-q"],
        "plot": ["plot", run, "--out", out],
    }


@pytest.mark.parametrize("command", ["evaluate", "predict", "plot"])
def test_an_output_folder_that_cannot_be_made_is_one_line(run, command):
    line = one_line(cli(*_commands(run, "/proc/fedxrisk-out/x")[command]))
    assert "/proc/fedxrisk-out" in line and "cannot be created" in line


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_an_unknown_device_is_one_line(run, tmp_path, command):
    args = _commands(run, str(tmp_path / "o"))[command]
    assert "device 'tpu'" in one_line(cli(*args, "--device", "tpu"))
    assert not (tmp_path / "o").exists()


def test_evaluate_refuses_a_config_edited_to_another_dataset(copy):
    path = copy / "config.toml"
    path.write_text(path.read_text().replace('dataset = "digits"', 'dataset = "synthetic"'))
    line = one_line(cli("evaluate", copy, "--bootstrap", 0, "-q"))
    assert "config.toml was edited after the run" in line and "dataset: 'digits' vs 'synthetic'" in line
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith("evaluation")) == []


def test_resume_of_a_finished_run_with_a_damaged_summary_is_one_line(copy):
    model = (copy / "model.pt").read_bytes()
    (copy / "summary.json").write_text('{"status": "compl')
    assert "summary.json is unreadable (JSONDecodeError) and model.pt exists" in one_line(
        cli("run", "--resume", copy, "-q")
    )
    assert (copy / "model.pt").read_bytes() == model


@pytest.fixture
def small_disk(tmp_path):
    """A 48 kB tmpfs (root only, else skipped): room for config.toml and history.csv, not a CNN's checkpoint."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)]).returncode
    ):
        pytest.skip("needs root to mount a tmpfs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_the_first_checkpoint_on_a_full_disk_is_one_line(small_disk):
    """A real ENOSPC mid-checkpoint: torch's own file writer said RuntimeError ("unexpected pos")."""
    out = small_disk / "run"
    args = ["--rounds", 2, "--stages", 1, "--eval-every", 1, "--clients", 2, "--checkpoint-every", 1]
    line = one_line(cli("run", *args, "--model", "cnn", "--out", out, "-q"))
    assert line.startswith(f"Error: cannot write {out}/checkpoint.pt: No space left on device")
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "history.csv"]


def test_init_from_integer_tensors_is_refused(run, tmp_path):
    state = torch.load(run / "model.pt", weights_only=True)["params"]
    torch.save({k: (v * 100).round().to(torch.int64) for k, v in state.items()}, tmp_path / "int.pt")
    with pytest.raises(ConfigError, match="holds integer tensors for floating-point weights"):
        build(RunConfig(**TINY, init_from=str(tmp_path / "int.pt")))


def test_reset_head_without_init_from_is_refused():
    with pytest.raises(ConfigError, match="model.reset_head without model.init_from does nothing"):
        build(RunConfig(**TINY, reset_head=True))


def test_a_selected_model_below_chance_on_its_own_validation_is_a_warning(run, tmp_path):
    """A start whose logit is negated, trained with a vanishing step: every round ranks inverted."""
    state = dict(torch.load(run / "model.pt", weights_only=True)["params"])
    for key in list(state)[-2:]:  # the head's weight and bias
        state[key] = -state[key]
    torch.save(state, tmp_path / "inverted.pt")
    cfg = RunConfig(**TINY | {"checkpoint_every": 0}, init_from=str(tmp_path / "inverted.pt"), lr=1e-9,
                    selection="best", validation=0.2)  # fmt: skip
    with pytest.warns(UserWarning, match=r"selected model's val_auroc is 0\.\d+ < 0\.5"):
        result = run_experiment(cfg, tmp_path / "r")
    assert (
        result.summary["selected"]["value"] < 0.5
        and "worse than chance" in result.summary["selected"]["warning"]
    )

"""Issue 34's one-line refusals around a finished run: evaluate / predict / plot to an output that
cannot be made or a device that does not exist, a config.toml edited after the run, a damaged
summary.json on resume, a full disk at the first checkpoint, and weights that cannot be a start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.errors import ConfigError
from fedxrisk.experiment import RunConfig, build, run_experiment
from helpers import TINY_RUN

TINY = TINY_RUN  # conftest's finished_run


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(result) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def _commands(finished_run: Path, out: str) -> dict[str, list]:
    return {
        "evaluate": ["evaluate", finished_run, "--bootstrap", 0, "--out", out, "-q"],
        "predict": [
            "predict",
            finished_run,
            finished_run.parent / "x.npz",
            "--out",
            f"{out}/scores.csv",
            "-q",
        ],
        "plot": ["plot", finished_run, "--out", out],
    }


@pytest.mark.parametrize("command", ["evaluate", "predict", "plot"])
def test_an_output_folder_that_cannot_be_made_is_one_line(finished_run, command):
    line = one_line(cli(*_commands(finished_run, "/proc/fedxrisk-out/x")[command]))
    assert "/proc/fedxrisk-out" in line and "cannot be created" in line


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_an_unknown_device_is_one_line(finished_run, tmp_path, command):
    args = _commands(finished_run, str(tmp_path / "o"))[command]
    assert "device 'tpu'" in one_line(cli(*args, "--device", "tpu"))
    assert not (tmp_path / "o").exists()


def test_evaluate_refuses_a_config_edited_to_another_dataset(run_copy):
    path = run_copy / "config.toml"
    path.write_text(path.read_text().replace('dataset = "digits"', 'dataset = "synthetic"'))
    line = one_line(cli("evaluate", run_copy, "--bootstrap", 0, "-q"))
    assert "config.toml was edited after the run" in line and "dataset: 'digits' vs 'synthetic'" in line
    assert sorted(p.name for p in run_copy.iterdir() if p.name.startswith("evaluation")) == []


def test_resume_of_a_finished_run_with_a_damaged_summary_is_one_line(run_copy):
    model = (run_copy / "model.pt").read_bytes()
    (run_copy / "summary.json").write_text('{"status": "compl')
    assert "summary.json is unreadable (JSONDecodeError) and model.pt exists" in one_line(
        cli("run", "--resume", run_copy, "-q")
    )
    assert (run_copy / "model.pt").read_bytes() == model


def test_the_first_checkpoint_on_a_full_disk_is_one_line(tmpfs):
    """A real ENOSPC mid-checkpoint: torch's own file writer said RuntimeError ("unexpected pos").
    48 kB: room for config.toml and history.csv, not a CNN's checkpoint."""
    out = tmpfs("48k") / "run"
    args = ["--rounds", 2, "--stages", 1, "--eval-every", 1, "--clients", 2, "--checkpoint-every", 1]
    line = one_line(cli("run", *args, "--model", "cnn", "--out", out, "-q"))
    assert line.startswith(f"Error: cannot write {out}/checkpoint.pt: No space left on device")
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "history.csv"]


def test_init_from_integer_tensors_is_refused(finished_run, tmp_path):
    state = torch.load(finished_run / "model.pt", weights_only=True)["params"]
    torch.save({k: (v * 100).round().to(torch.int64) for k, v in state.items()}, tmp_path / "int.pt")
    with pytest.raises(ConfigError, match="holds integer tensors for floating-point weights"):
        build(RunConfig(**TINY, init_from=str(tmp_path / "int.pt")))


def test_reset_head_without_init_from_is_refused():
    with pytest.raises(ConfigError, match="model.reset_head without model.init_from does nothing"):
        build(RunConfig(**TINY, reset_head=True))


def test_a_selected_model_below_chance_on_its_own_validation_is_a_warning(finished_run, tmp_path):
    """A start whose logit is negated, trained with a vanishing step: every round ranks inverted."""
    state = dict(torch.load(finished_run / "model.pt", weights_only=True)["params"])
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


@pytest.mark.parametrize(("validation", "metric"), [(0.2, "val_auroc"), (0.0, "client_auroc_mean")])
def test_a_final_model_below_chance_is_flagged_without_selection(finished_run, tmp_path, validation, metric):
    """The same inverted start with selection = "last": flagged on validation, or without validation
    on the clients' own training shards (issue 42: nothing below chance goes out silently)."""
    state = dict(torch.load(finished_run / "model.pt", weights_only=True)["params"])
    for key in list(state)[-2:]:
        state[key] = -state[key]
    torch.save(state, tmp_path / "inverted.pt")
    cfg = RunConfig(**TINY | {"checkpoint_every": 0}, init_from=str(tmp_path / "inverted.pt"), lr=1e-9,
                    validation=validation)  # fmt: skip
    with pytest.warns(UserWarning, match=rf"final model's {metric} is 0\.\d+ < 0\.5"):
        result = run_experiment(cfg, tmp_path / "r")
    flag = result.summary["below_chance"]
    assert (flag["of"], flag["metric"]) == ("final", metric) and flag["value"] == result.history[-1][
        metric
    ] < 0.5
    fine = run_experiment(RunConfig(**TINY | {"checkpoint_every": 0}, validation=validation), tmp_path / "ok")
    assert fine.summary["below_chance"] is None  # the control: the same run from its own start


def test_predict_refuses_uint8_pixels_for_a_model_trained_on_0_1_images(finished_run, tmp_path):
    """digits' reader records no range; the run does, so 0–255 pixels are refused, not mis-scored."""
    x = np.random.default_rng(0).uniform(0, 1, size=(6, 1, 8, 8))
    np.savez(tmp_path / "pixels.npz", x=(x * 255).astype(np.uint8))
    line = one_line(cli("predict", finished_run, tmp_path / "pixels.npz", "--out", tmp_path / "s.csv", "-q"))
    assert "the model was trained on inputs in [0, 1]" in line and not (tmp_path / "s.csv").exists()
    np.savez(tmp_path / "scaled.npz", x=x.astype(np.float32))
    assert (
        cli("predict", finished_run, tmp_path / "scaled.npz", "--out", tmp_path / "s.csv", "-q").exit_code
        == 0
    )


def test_predict_refuses_pre_standardized_rows_for_a_model_trained_on_raw_values(tmp_path):
    from fedxrisk.inference import InputError
    from fedxrisk.prediction import predict

    rng = np.random.default_rng(0)
    x = rng.normal(loc=[50, 200, 5, 1000], scale=[5, 20, 1, 100], size=(120, 4)).astype(np.float32)
    y = (x[:, 0] > 50).astype(np.int64)
    np.savez(tmp_path / "d.npz", x_train=x[:80], y_train=y[:80], x_test=x[80:], y_test=y[80:])
    cfg = RunConfig(dataset="npz", data_dir=str(tmp_path / "d.npz"), imratio=None, partition="iid", clients=2,
                    rounds=1, stages=1, eval_every=1, tensorboard=False, checkpoint_every=0, model="linear")  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    standardized = (x[80:] - x[:80].mean(0)) / x[:80].std(0)
    np.savez(tmp_path / "std.npz", x=standardized)
    with pytest.raises(InputError, match="training standard deviations away"):
        predict(tmp_path / "run", tmp_path / "std.npz")
    header = "a,b,c,d\n" + "\n".join(",".join(map(str, r)) for r in standardized.tolist())
    (tmp_path / "std.csv").write_text(header + "\n")
    with pytest.raises(InputError, match="training standard deviations away"):
        predict(tmp_path / "run", tmp_path / "std.csv")
    np.savez(tmp_path / "raw.npz", x=x[80:])
    assert len(predict(tmp_path / "run", tmp_path / "raw.npz").ids) == 40  # the raw rows are scored


def test_roc_and_pr_plots_name_the_run_and_the_positive_class_and_pr_has_its_baseline(
    finished_run, tmp_path, monkeypatch
):
    from matplotlib.figure import Figure

    from fedxrisk.evaluation import evaluate

    seen: list[tuple[str, list[str]]] = []
    real = Figure.savefig

    def savefig(fig, *args, **kwargs):
        ax = fig.axes[0]
        seen.append((ax.get_title(), [t.get_text() for t in ax.get_legend().get_texts()]))
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    result = evaluate(finished_run, bootstrap=0, out=tmp_path / "e")
    (roc_title, _), (pr_title, pr_legend) = seen
    positive = "+".join(map(str, result["positive_class"]["names"] or result["positive_class"]["ids"]))
    assert roc_title == f"ROC — run run, positive: {positive}"
    assert pr_title == f"precision-recall — run run, positive: {positive}"
    prevalence = result["overall"]["score"]["prevalence"]
    assert any(t.startswith("prevalence ") and "random ranking" in t for t in pr_legend)
    assert 0 < prevalence < 1


def test_plot_legends_name_the_settings_that_differ_not_defaults_or_raw_tables():
    from fedxrisk.plots import variant_labels

    plain = RunConfig().to_dict()
    dp = [RunConfig(privacy={"clip": 1.0, "noise_multiplier": s}).to_dict() for s in (1.1, 2.0)]
    labels = variant_labels([plain, *dp])
    assert labels == [
        "codasca",
        "codasca privacy.clip=1 privacy.noise_multiplier=1.1",
        "codasca privacy.clip=1 privacy.noise_multiplier=2",
    ]
    two = variant_labels(
        [RunConfig(algorithm="codasca", lr=1.09).to_dict(), RunConfig(algorithm="localsgdm").to_dict()]
    )
    assert two == ["codasca lr=1.09", "localsgdm"]  # localsgdm's lr is its default: not named

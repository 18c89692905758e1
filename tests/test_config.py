"""Configs: TOML ↔ RunConfig, re-running from summary.json, and one clear error per bad setting."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.experiment import ConfigError, RunConfig, load_run
from fedxrisk.run.configfile import (
    SECTIONS,
    config_from_sections,
    config_to_toml,
    load_config,
    section_of,
    tomllib,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMALL = ["--set", "data.clients=2", "--set", "experiment.rounds=3", "--set", "algorithm.stages=1"]
SMALL += ["--set", "algorithm.local_steps=2", "--set", "experiment.eval_every=2", "--quiet"]


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_every_runconfig_field_has_a_section():
    for f in dataclasses.fields(RunConfig):
        if f.name not in ("options", "pretrain", "privacy", "server"):  # sections of their own
            assert section_of(f.name) in SECTIONS


def test_toml_round_trip_keeps_every_value(tmp_path):
    cfg = RunConfig(
        algorithm="codaplus", imratio=None, positive_classes=[1, 7], lr=0.05, local_steps=4, rounds=12,
        window_growth=2.0, checkpoint_every=0, options={"prox": 0.01, "loss": "aucm", "clip_grad": None},
    )  # fmt: skip
    path = tmp_path / "c.toml"
    path.write_text(config_to_toml(cfg, "a header\nline two"))
    doc = tomllib.loads(path.read_text())
    assert doc["data"]["imratio"] == "none" and doc["algorithm"]["prox"] == 0.01
    back = load_config(path)
    assert back == cfg
    assert back.to_dict() == cfg.to_dict()


def test_flags_override_the_file_and_set_overrides_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[experiment]\nrounds = 7\nseed = 3\n[algorithm]\nalgorithm = "localsgdm"\nlr = 0.2\n')
    out = tmp_path / "run"
    args = ["run", "--config", str(path), "--seed", "5", "--lr", "0.3", "--set", "algorithm.lr=0.4"]
    result = _invoke(*args, "-K", "2", "--rounds", "2", "--stages", "1", "-I", "1", "--out", str(out), "-q")
    assert result.exit_code == 0, result.output
    cfg = load_run(out).summary["config"]
    assert (cfg["seed"], cfg["lr"], cfg["rounds"], cfg["algorithm"]) == (5, 0.4, 2, "localsgdm")


def test_run_from_summary_json_reproduces_the_metrics(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert (
        _invoke(
            "run", "--set", "data.imratio=0.2", "--set", "algorithm.eta_g=1.1", *SMALL, "--out", str(first)
        ).exit_code
        == 0
    )
    result = _invoke("run", "--config", str(first / "summary.json"), "--out", str(second), "-q")
    assert result.exit_code == 0, result.output
    a, b = (json.loads((d / "summary.json").read_text()) for d in (first, second))
    assert a["config"] == b["config"] and a["config"]["options"] == {"eta_g": 1.1}
    for key in ("final", "selected", "test_oracle", "communication", "hyperparameters"):
        assert a[key] == b[key]
    assert (first / "config.toml").read_text() == (second / "config.toml").read_text()
    assert load_config(first / "config.toml").to_dict() == a["config"]


BAD = [  # (config file text or None, --set overrides, the message's key part)
    ("[data]\nimratoi = 0.2\n", [], "unknown key 'data.imratoi' (did you mean 'imratio'?); [data] allows:"),
    ("[training]\nrounds = 3\n", [], "unknown key 'training'; a config file allows: algorithm, data,"),
    ("rounds = 3\n", [], "'rounds' belongs in [experiment], as experiment.rounds"),
    ('[experiment]\nrounds = "ten"\n', [], "experiment.rounds: expected an integer, got 'ten' (str)"),
    ("[experiment]\nrounds = 2.5\n", [], "experiment.rounds: expected an integer, got 2.5 (float)"),
    ("[data]\nallow_missing_class = 1\n", [], "data.allow_missing_class: expected true/false, got 1"),
    ("[data]\nimratio = 1.5\n", [], "data.imratio must lie in (0, 1), got 1.5"),
    ("[experiment]\nrounds = 0\n", [], "experiment.rounds must be ≥ 1, got 0"),
    ("[experiment]\ncheckpoint_every = -1\n", [], "experiment.checkpoint_every must be ≥ 0"),
    ('[algorithm]\nalgorithm = "sgd"\n', [], "algorithm.algorithm: unknown algorithm 'sgd'; choose one of"),
    ('[algorithm]\nalgorithm = "localsgdm"\neta_g = 1.1\n', [], "unknown key 'algorithm.eta_g'"),
    ('[algorithm]\nalgorithm = "localsgdm"\nmomentum = 1.5\n', [], "algorithm.momentum must lie in [0, 1)"),
    (
        '[engine]\nengine = "gpu"\n',
        [],
        "unknown engine 'gpu' (engine.engine); choose one of ['auto', 'compile', 'distributed', 'loop', 'vmap']",
    ),
    ("[data\n", [], "not valid TOML"),
    (None, ["algorithm.lr=abc"], "algorithm.lr: expected a number or \"none\", got 'abc' (str)"),
    (None, ["lr=0.1"], "--set 'lr': name the section, e.g. algorithm.lr=0.05"),
    (None, ["algorithm.lr=-1"], "algorithm.lr must be > 0, got -1.0"),
]


@pytest.mark.parametrize(("text", "sets", "message"), BAD)
def test_invalid_config_gives_one_clear_message_and_writes_nothing(tmp_path, text, sets, message):
    args = ["run", "--out", str(tmp_path / "out")]
    if text is not None:
        (tmp_path / "bad.toml").write_text(text)
        args += ["--config", str(tmp_path / "bad.toml")]
    for s in sets:
        args += ["--set", s]
    result = _invoke(*args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert message in lines[0]
    assert not (tmp_path / "out").exists()


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_api_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"data\.clients: expected an integer"):
        config_from_sections({"data": {"clients": "4"}})


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.toml")), ids=lambda p: p.name)
def test_bundled_configs_are_valid(path):
    """Every shipped config validates (paper configs ask for a GPU: checked here on the CPU)."""
    cfg = load_config(path, ["engine.device=cpu"])
    assert cfg.device == "cpu"

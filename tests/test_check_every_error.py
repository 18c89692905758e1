"""`fedxrisk check` lists every error of a config file at once, those found while reading the
`[privacy]`, `[pretrain]` and `[server]` tables too (issue 39), and `fedxrisk run` refuses with the
same lines, one each, exit 2, writing nothing."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fedxrisk.cli import main

CONFIGS = {  # a config file → the start of each error line, in the order both commands print them
    "privacy": (
        "[privacy]\nclip = -1.0\nnoise_multiplier = 0.0\ndelta = 2.0\nbogus = 1\n",
        [
            "unknown key privacy.bogus;",
            "privacy.noise_multiplier must be a finite number > 0",
            "privacy.delta must lie in (0, 1), got 2.0",
            "privacy clip (the L2 norm C of a client's update) must be > 0, got -1.0",
        ],
    ),
    "privacy read": (
        '[privacy]\nnoise_multiplier = 1.0\nlevel = 3\nsampling_rate = "half"\n',
        [
            "privacy.clip is missing",
            "privacy.level: expected a string, got 3 (int)",
            "privacy.sampling_rate: expected a number, got 'half' (str)",
        ],
    ),
    "pretrain": (
        "[pretrain]\nrounds = -3\nlocal_steps = 0\n",
        ["pretrain.rounds must be ≥ 1, got -3", "pretrain.local_steps must be ≥ 1, got 0"],
    ),
    "pretrain read": (
        '[pretrain]\nrounds = "x"\nzzz = 1\nlr = -1.0\nlocal_steps = 0\n',
        [
            "pretrain.rounds: expected an integer, got 'x' (str)",
            "unknown key 'pretrain.zzz';",
            "pretrain.lr must be > 0, got -1.0",
            "pretrain.local_steps must be ≥ 1, got 0",
        ],
    ),
    "three sections": (
        "[experiment]\nrounds = -2\n[data]\nclients = 0\n[server]\nlr = -1\ntau = 0\nmomentum = 0.9\n"
        '[privacy]\nclip = 1.0\nnoise_multiplier = 1.0\ndelta = 2.0\nlevel = "site"\n',
        [
            "unknown key 'server.momentum'",
            "experiment.rounds must be ≥ 1, got -2",  # the declared ranges: in the config file's order
            "data.clients must be ≥ 1, got 0",
            "server.lr must be a finite number > 0, got -1.0",
            "server.tau must be a finite number > 0, got 0.0",
            "privacy.level must be one of ('client', 'instance'), got 'site'",
            "privacy.delta must lie in (0, 1), got 2.0",
        ],
    ),
    "parts of one rule": (  # [data], [experiment], [model]: values a single rule used to stop at the first of
        '[experiment]\nselection = "worst"\nearly_stopping = -1\n[data]\nstream = "maybe"\nworkers = -1\n'
        'image_size = 0\naugment = "rotate"\n[model]\npersonal = "all"\n[algorithm]\nfinetune_steps = -1\n',
        [
            "unknown selection 'worst' (experiment.selection)",  # the declared ones first, in file order
            "experiment.early_stopping must be ≥ 0 (0: off), got -1",
            "data.image_size must lie in [1, 4096], got 0",
            "unknown personal 'all' (model.personal)",
            "algorithm.finetune_steps must be ≥ 0 (0: no fine-tuning), got -1",
            "data.stream must be true, false or \"auto\", got 'maybe'",
            "data.workers must be between 0 (decode in the training process) and 64, got -1",
            "unknown data.augment 'rotate'",
            "data.image_size, data.normalize and data.augment apply to image datasets",
        ],
    ),
}


def _errors(result) -> list[str]:
    return [line[len("Error: ") :] for line in result.stderr.splitlines() if line.startswith("Error: ")]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_check_and_run_name_every_error_of_the_file(tmp_path, name):
    text, expected = CONFIGS[name]
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    check = CliRunner().invoke(main, ["check", str(path)])
    assert check.exit_code == 2, check.output
    errors = _errors(check)
    assert len(errors) == len(expected), errors
    for line, start in zip(errors, expected):
        assert line.startswith(start), (line, start)
    run = CliRunner().invoke(main, ["run", "--config", str(path), "--out", str(tmp_path / "run"), "-q"])
    assert run.exit_code == 2 and _errors(run) == errors  # the same lines, nothing written
    assert not (tmp_path / "run").exists()


def test_a_library_caller_gets_every_error_and_the_first_as_the_message():
    from fedxrisk.errors import ConfigError, ConfigErrors
    from fedxrisk.run.configfile import config_from_sections, pretrain_from_table
    from fedxrisk.run.privacy import privacy_from_table

    with pytest.raises(ConfigErrors) as info:
        config_from_sections({"pretrain": {"rounds": -3, "local_steps": 0}})
    assert [str(e) for e in info.value.errors] == [
        "pretrain.rounds must be ≥ 1, got -3",
        "pretrain.local_steps must be ≥ 1, got 0",
    ]
    assert str(info.value) == "pretrain.rounds must be ≥ 1, got -3 (and 1 more: `fedxrisk check` lists them)"
    with pytest.raises(ConfigError, match=r"^unknown key 'pretrain.zzz'"):  # the raising readers: the first
        pretrain_from_table({"zzz": 1, "rounds": "x"})
    with pytest.raises(ConfigError, match=r"^unknown key privacy.bogus"):
        privacy_from_table({"bogus": 1, "delta": "x"})

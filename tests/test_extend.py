"""``fedxrisk run --resume RUN --rounds N``: a finished run trained on equals a run planned longer."""

from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.experiment import ConfigError, RunConfig, resume_experiment, run_experiment

CFG = dict(clients=3, local_steps=2, batch_size=16, eval_every=1, checkpoint_every=2, stages=1,
           tensorboard=False)  # fmt: skip


def _comparable(run) -> dict:
    def same_nan(v):  # NaN (an empty val_* cell) equals NaN here, whichever float object holds it
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    rows = [{k: same_nan(v) for k, v in r.items() if k != "wall_seconds"} for r in run.history]
    s = run.summary
    return {
        "final": s["final"],
        "selected": s["selected"],
        "test_oracle": s["test_oracle"],
        "communication": s["communication"],
        "rows": rows,
    }


@pytest.mark.parametrize("algorithm", ["localsgdam", "fcsg_m"])
def test_extended_run_equals_the_run_planned_with_all_rounds(tmp_path, algorithm):
    planned = run_experiment(RunConfig(algorithm=algorithm, rounds=6, **CFG), tmp_path / "planned")
    run_experiment(RunConfig(algorithm=algorithm, rounds=3, **CFG), tmp_path / "short")
    extended = resume_experiment(tmp_path / "short", rounds=6)
    assert _comparable(extended) == _comparable(planned)  # bit for bit, history included
    assert [r["round"] for r in extended.history] == [1, 2, 3, 4, 5, 6]
    a, b = (
        torch.load(p / "model.pt", weights_only=True)["params"]
        for p in (tmp_path / "planned", tmp_path / "short")
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "rounds = 6" in (tmp_path / "short" / "config.toml").read_text()


def test_extension_refused_where_no_extension_equals_a_planned_run(tmp_path):
    run_experiment(RunConfig(algorithm="localsgdam", rounds=4, **{**CFG, "stages": 2}), tmp_path / "staged")
    with pytest.raises(ConfigError, match="ran 2 stages over 4 rounds: with 8 rounds every stage is longer"):
        resume_experiment(tmp_path / "staged", rounds=8)
    with pytest.raises(ConfigError, match="--rounds 4 does not extend .*: it already ran 4 rounds"):
        resume_experiment(tmp_path / "staged", rounds=4)
    run_experiment(
        RunConfig(algorithm="localsgdam", rounds=2, **{**CFG, "checkpoint_every": 0}), tmp_path / "nock"
    )
    with pytest.raises(ConfigError, match="kept no final_state.pt"):
        resume_experiment(tmp_path / "nock", rounds=4)


def test_stage_end_algorithm_extension_warns_and_cli_extends(tmp_path):
    run_experiment(RunConfig(algorithm="codasca", rounds=2, **CFG), tmp_path / "coda")
    with pytest.warns(
        UserWarning, match="codasca restarts at a stage's end, which this run reached at round 2"
    ):
        resume_experiment(tmp_path / "coda", rounds=3)
    result = CliRunner().invoke(main, ["run", "--resume", str(tmp_path / "coda"), "--rounds", "4", "-q"])
    assert result.exit_code == 0, result.output
    assert '"rounds": 4' in (tmp_path / "coda" / "summary.json").read_text()


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("mend", ["extra", "missing"])
def test_a_checkpoint_that_does_not_fit_the_run_is_refused_in_one_line_and_the_folder_kept(tmp_path, mend):
    """A checkpoint whose saved state has other entries than the run (a ``[server]`` +
    ``model.personal`` run saved before the server step left personal entries alone held them in
    its server state) failed mid-round with a traceback; now one line, exit 2, nothing rewritten,
    on both ways back in: extending a finished run and resuming a killed one."""
    cfg = RunConfig(algorithm="localsgdm", model="mlp", personal="head", rounds=2,
                    server={"optimizer": "adam", "lr": 0.01}, **CFG)  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    for name in ("final_state.pt", "checkpoint.pt"):
        path = tmp_path / "run" / name
        if name == "checkpoint.pt":  # a run killed after its checkpoint: resumed without --rounds
            (tmp_path / "run" / "summary.json").unlink()
            path.write_bytes((tmp_path / "run" / "final_state.pt").read_bytes())
        ckpt = torch.load(path, weights_only=False)
        states = ckpt["simulation"]["states"]
        if mend == "extra":  # the server state of the old release: the personal head included
            for part in ("x", "m", "v"):
                states["server_opt"][part]["net.4.weight"] = states["w"]["net.4.weight"].clone()
        else:
            states["server_opt"]["v"].pop("net.0.bias", None)
        torch.save(ckpt, path)
        before = _files(tmp_path / "run")
        args = [
            "run",
            "--resume",
            str(tmp_path / "run"),
            *(["--rounds", "4"] if name == "final_state.pt" else []),
        ]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        [line] = [x for x in result.output.splitlines() if x.startswith("Error:")]
        assert "the checkpoint's saved state does not fit this run" in line
        assert {"extra": "server_opt.", "missing": "it lacks server_opt.v.net.0.bias"}[mend] in line
        assert "Traceback" not in result.output
        assert _files(tmp_path / "run") == before  # nothing rewritten


def test_a_two_stage_resume_with_a_new_step_size_keeps_config_toml_when_its_checkpoint_is_refused(tmp_path):
    """``--resume RUN --set algorithm.lr=…`` of a two-stage run rewrote config.toml before its
    checkpoint was read; a checkpoint that does not fit now leaves every file as it was."""
    cfg = RunConfig(algorithm="localsgdm", model="mlp", rounds=2, pretrain={"rounds": 1}, **CFG)
    run_experiment(cfg, tmp_path / "run")
    (tmp_path / "run" / "summary.json").unlink()  # killed after its last checkpoint
    ckpt = torch.load(tmp_path / "run" / "final_state.pt", weights_only=False)
    ckpt["simulation"]["states"]["w"]["bogus"] = torch.zeros(3, 1)  # an entry the run has not
    torch.save(ckpt, tmp_path / "run" / "checkpoint.pt")
    before = _files(tmp_path / "run")
    result = CliRunner().invoke(
        main, ["run", "--resume", str(tmp_path / "run"), "--set", "algorithm.lr=0.05"]
    )
    assert result.exit_code == 2, result.output
    [line] = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert "the checkpoint's saved state does not fit this run" in line and "bogus" in line, line
    assert _files(tmp_path / "run") == before  # config.toml included

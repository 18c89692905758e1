"""Threads for a run, and a configuration mistake printed once under torchrun."""

from __future__ import annotations

import torch
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.cli.run import set_threads


def test_small_models_default_to_one_thread_and_threads_override(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert set_threads(None, "mlp") == 1
        assert set_threads(2, "mlp") == 2
        assert set_threads(None, "densenet121") == 2  # torch's default left alone
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)
        assert set_threads(None, "mlp") == 2  # the environment's choice is kept
    finally:
        torch.set_num_threads(before)


def test_bad_threads_and_a_config_error_under_torchrun_printed_by_rank_0_only(monkeypatch):
    bad = CliRunner().invoke(main, ["run", "--threads", "-1"])
    assert bad.exit_code == 2 and "Invalid value for '--threads'" in bad.output
    args = ["run", "--set", "data.imratoi=1"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    quiet = CliRunner().invoke(main, args)
    assert quiet.exit_code == 2 and quiet.output == ""
    monkeypatch.setenv("RANK", "0")
    loud = CliRunner().invoke(main, args)
    assert loud.exit_code == 2 and loud.output.count("unknown key 'data.imratoi'") == 1

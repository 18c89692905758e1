"""Evaluation and prediction batch sizes follow data.memory_budget and the input size (issue 25 item 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedxrisk.data.stream import PREFETCH, eval_batch_size, prefetch_steps
from fedxrisk.data.stream_choice import ACTIVATION_FACTOR, EVAL_SHARE, MAX_EVAL_BATCH, StreamChoice
from fedxrisk.experiment import ConfigError, RunConfig, build, run_experiment
from fedxrisk.inference import load_trained
from fedxrisk.metrics import predict
from fedxrisk.problem import Problem
from helpers import image_folder_config

IMAGE_224 = 4 * 3 * 224 * 224  # float32 bytes of one 3×224×224 input


def test_eval_batch_follows_budget_and_input_size():
    budget = 4_000_000_000
    assert eval_batch_size((3, 224, 224), budget) == int(
        EVAL_SHARE * budget // (IMAGE_224 * ACTIVATION_FACTOR)
    )
    assert eval_batch_size((3, 224, 224), budget) == 51
    assert eval_batch_size((3, 224, 224), 2 * budget) == 103  # twice the budget, twice the batch
    assert eval_batch_size((3, 32, 32), budget) == 2543  # 32×32: 2,543 per pass (was 4,096)
    assert eval_batch_size((1, 8, 8), budget) == MAX_EVAL_BATCH  # small inputs: capped
    assert eval_batch_size((3, 224, 224), 1000) == 1  # never below one sample
    assert eval_batch_size((3, 224, 224), budget, setting=7) == 7  # data.eval_batch_size wins
    with pytest.raises(ValueError, match="data.eval_batch_size must be a positive integer, got 0"):
        eval_batch_size((3,), budget, setting=0)


class _Recorder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)
        self.seen: list[int] = []

    def forward(self, x):
        self.seen.append(len(x))
        return self.fc(x)


def test_predict_forwards_eval_batch_size_samples_at_a_time():
    model = _Recorder()
    problem = Problem(model, 0.5, eval_batch_size=5)
    params, buffers = problem.init_model()
    x = torch.randn(12, 4)
    scores = predict(problem, params, buffers, x)
    assert model.seen == [5, 5, 2]
    whole = predict(problem, params, buffers, x, chunk=100)  # same scores, whatever the chunk
    assert np.allclose(scores, whole, atol=1e-6) and model.seen[-1] == 12


def _cfg(image_folder, **kw) -> RunConfig:
    return image_folder_config(image_folder, **{**dict(model="linear", rounds=1, stream=True), **kw})


def test_run_uses_the_planned_eval_batch_and_predict_the_budgeted_one(image_folder, tmp_path):
    setup = build(_cfg(image_folder, memory_budget="2GB"))
    plan = setup.stream.memory  # data/budget.py: the eval batch the budget leaves room for
    assert setup.simulation.algorithm.problem.eval_batch_size == plan["eval_batch"] > 1
    assert plan["eval_batch"] * plan["eval_sample"] <= plan["budget"]
    assert (
        build(
            _cfg(image_folder, memory_budget="2GB", eval_batch_size=3)
        ).simulation.algorithm.problem.eval_batch_size
        == 3
    )
    run_experiment(_cfg(image_folder, memory_budget="2GB"), tmp_path / "run")
    # predict has no training step: half the budget / (64 × the float32 input), as before
    assert load_trained(tmp_path / "run").problem.eval_batch_size == eval_batch_size((3, 32, 32), 2 * 10**9)
    with pytest.raises(ConfigError, match="data.eval_batch_size must be a positive integer, got -2"):
        build(_cfg(image_folder, eval_batch_size=-2))
    with pytest.raises(ConfigError, match=r"data.memory_budget = 10.0 MB is less than this process takes"):
        build(_cfg(image_folder, memory_budget="10MB"))


def test_prefetch_steps_stay_within_a_quarter_of_the_budget(image_folder):
    fed = build(_cfg(image_folder)).data  # 2 clients, 3×32×32 inputs
    step = 4 * 3 * 32 * 32 * 16 * 2  # batch 16, 2 clients
    assert prefetch_steps(fed, StreamChoice(True, "", budget=10**12, workers=2), 16) == PREFETCH
    assert prefetch_steps(fed, StreamChoice(True, "", budget=4 * step * 2 * 2, workers=2), 16) == 2
    assert prefetch_steps(fed, StreamChoice(True, "", budget=1, workers=2), 16) == 1

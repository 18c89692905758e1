"""data.memory_budget bounds the whole training process, or the run is refused in one line (issue 34)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedxrisk.data.budget import activation_bytes
from fedxrisk.models.small import SmallCNN
from helpers import PROCESS_WAIT, write_image_folder

SRC = str(Path(__file__).resolve().parents[1] / "src")
BUDGET_MB = 800

# A streamed run in a fresh process: vmap (fedxrisk run's default engine) steps its 4 clients
# at once, 32 samples each at 3×64×64 (≈ 0.5 GB of activations for the small CNN unchunked).
CHILD = """
import json, sys
from fedxrisk.experiment import RunConfig, run_experiment
folder, out, budget = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = RunConfig(algorithm="codasca", dataset="folder", data_dir=folder, clients=4, imratio=None, partition="iid",
                model="cnn", rounds=1, stages=1, local_steps=1, batch_size=32, engine="vmap", stream=True,
                workers=1, eval_every=1, checkpoint_every=0, tensorboard=False, memory_budget=budget, image_size=64,
                positive_classes=["b"])
run_experiment(cfg, out)
peak = [int(ln.split()[1]) * 1024 for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0]
print(json.dumps({"peak": peak}))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


@pytest.mark.slow  # a real process on 64x64 images
def test_streamed_run_stays_within_a_small_budget(tmp_path):
    folder = tmp_path / "images"
    write_image_folder(folder, per_class=110, size=64)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(out), f"{BUDGET_MB}MB"],
                          env=_env(), capture_output=True, text=True, timeout=PROCESS_WAIT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = json.loads(proc.stdout.splitlines()[-1])["peak"]
    memory = json.loads((out / "summary.json").read_text())["data"]["stream"]["memory"]
    assert memory["budget"] == BUDGET_MB * 10**6
    assert memory["clients_per_step"] < 4  # all four clients' activations would not fit: chunked
    assert peak <= BUDGET_MB * 10**6, f"peak RSS {peak / 1e6:.0f} MB over the {BUDGET_MB} MB budget"


@pytest.mark.slow  # a real process on 64x64 images
def test_a_batch_the_budget_cannot_hold_is_refused_in_one_line_before_writing(tmp_path):
    folder = tmp_path / "images"
    write_image_folder(folder, per_class=60, size=64)
    config = tmp_path / "run.toml"
    config.write_text(
        f'[experiment]\nrounds = 1\n[data]\ndataset = "folder"\ndata_dir = "{folder}"\nclients = 2\n'
        'positive_classes = ["b"]\nbatch_size = 32\nimage_size = 224\nstream = true\nworkers = 0\n'
        'memory_budget = "1GB"\n[model]\nmodel = "cnn"\n[engine]\nengine = "loop"\n'
    )
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fedxrisk", "run", "--config", str(config), "--imratio", "none", "--out", str(out)],
                          env=_env(), capture_output=True, text=True, timeout=PROCESS_WAIT)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith("warning: ")]  # notices aside
    assert len(errors) == 1 and errors[0].startswith(
        "Error: data.memory_budget = 1.00 GB cannot hold a training step of data.batch_size = 32 at 3×224×224"
    ), proc.stderr
    assert "raise data.memory_budget or lower data.batch_size" in errors[0]
    assert not out.exists()


def test_activations_grow_with_the_input_and_the_probe_leaves_the_model_alone():
    model = SmallCNN((3, 16, 16))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    small = activation_bytes(model, (3, 16, 16))
    large = activation_bytes(SmallCNN((3, 32, 32)), (3, 32, 32))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm stats too
    assert all(p.grad is None for p in model.parameters())
    # 16 + 32 channels of float32 per pixel are kept for backward (conv, BatchNorm, ReLU outputs)
    assert small[0] >= 4 * (16 + 32) * 16 * 16 and small[1] >= 4 * 16 * 16 * 16
    assert 3.5 < large[0] / small[0] < 4.5 and 3.5 < large[1] / small[1] < 4.5  # 4× the pixels


def test_clients_chunked_by_the_budget_train_as_all_at_once(tmp_path, monkeypatch):
    import fedxrisk.data.budget as budget
    from fedxrisk.experiment import run_experiment
    from helpers import image_folder_config

    folder = tmp_path / "images"
    write_image_folder(folder, per_class=24, size=8)
    cfg = image_folder_config(
        folder, clients=3, engine="vmap", model="cnn", rounds=2, local_steps=2, stream=True
    )
    whole = run_experiment(cfg, tmp_path / "whole").summary["final"]
    chosen: list = []
    plain = budget.chunking

    def one_at_a_time(engine, plan, clients):  # as when only one client's step fits
        plan.clients_per_step = 1
        chosen.append(plain(engine, plan, clients))
        return chosen[-1]

    monkeypatch.setattr(budget, "chunking", one_at_a_time)
    chunked = run_experiment(cfg, tmp_path / "chunked").summary["final"]
    assert chosen == [{"chunk_size": 1}]
    loss = whole.pop("train_loss"), chunked.pop("train_loss")  # a mean of float sums: order-dependent
    assert whole == chunked and loss[0] == pytest.approx(loss[1], rel=1e-5)
    models = [torch.load(tmp_path / name / "model.pt", weights_only=False) for name in ("whole", "chunked")]
    states = [{**m["params"], **m["buffers"]} for m in models]
    assert states[0].keys() == states[1].keys()
    for key in states[0]:  # the trained weights, to float tolerance
        assert torch.allclose(states[0][key].float(), states[1][key].float(), atol=1e-5), key


def test_the_plan_shares_the_budget_and_refuses_what_cannot_fit(monkeypatch):
    import pytest

    import fedxrisk.data.budget as budget

    monkeypatch.setattr(budget, "resident_bytes", lambda: 100_000_000)  # the process before training
    shape, batch, clients = (3, 32, 32), 8, 4
    model = SmallCNN(shape)
    train, _ = activation_bytes(model, shape)
    need = batch * budget.TRAIN_OVERHEAD * train  # one client's step
    step = 4 * 3 * 32 * 32 * batch * clients  # one decoded step of the 4 clients
    fixed = budget.HEADROOM_MIN + 100_000_000 + 2 * step  # headroom, process, step in use + 1 ahead
    plan = budget.plan_memory(model, shape, int(fixed + 2.5 * need), batch, clients, batched=True, workers=1)
    assert (plan.clients_per_step, plan.step_bytes, plan.train_sample) == (2, step, int(need / batch))
    extra = int(fixed + 2.5 * need) - fixed - 2 * int(need / batch) * batch - (plan.prefetch - 1) * step
    assert plan.eval_batch == extra // plan.eval_sample  # what training leaves
    roomy = budget.plan_memory(model, shape, 10**11, batch, clients, batched=True, workers=1)
    assert (roomy.clients_per_step, roomy.prefetch, roomy.eval_batch) == (4, 4, 4096)
    assert budget.plan_memory(model, shape, 10**11, batch, clients, batched=False).clients_per_step == 1
    with pytest.raises(
        budget.BudgetError, match="cannot hold a training step of data.batch_size = 8 at 3×32×32"
    ):
        budget.plan_memory(model, shape, int(fixed + 0.5 * need), batch, clients, batched=True, workers=1)
    with pytest.raises(budget.BudgetError, match="is less than this process takes before training"):
        budget.plan_memory(model, shape, 90_000_000, batch, clients, batched=True)

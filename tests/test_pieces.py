"""Issue 31.4: the pieces for one's own loop (losses, PESG, samplers) against the built-in path.

The README's "Pieces for your own loop" code blocks are executed as written; the model they
train must equal ``run_experiment``'s CODA+ run with one client (same batches, same steps).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fedxrisk import (
    PESG,
    APLoss,
    AUCMLoss,
    AUCSquareLoss,
    DualSampler,
    PartialAUCLoss,
    RunConfig,
    ShuffleSampler,
    run_experiment,
)
from fedxrisk.data import make_federated
from fedxrisk.models import build_model
from fedxrisk.objectives import auc_square_loss, aucm_loss
from fedxrisk.objectives.conditional import APSurrogate, csg_objective
from fedxrisk.objectives.pairwise import pairwise_surrogate, pauc_kl_loss
from fedxrisk.problem import Problem
from helpers import make_sim, max_abs_diff

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks(section: str) -> list[str]:
    """The ```python blocks of the README section titled ``section``."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end >= 0 else None]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


@pytest.fixture(scope="module")
def readme_run():
    """The README's single-site blocks, executed in one namespace."""
    blocks = readme_blocks("Pieces for your own loop")
    assert len(blocks) >= 3
    ns: dict = {}
    for block in blocks[:3]:
        assert sum(1 for line in block.splitlines() if line.strip()) <= 10, block
        exec(compile(block, "README.md", "exec"), ns)
    return ns


def test_the_readme_loop_equals_the_codaplus_run_with_one_client(readme_run, tmp_path):
    ns = readme_run
    steps = 2 * 2 * len(ns["sampler"])  # two stages of two epochs
    cfg = RunConfig(
        algorithm="codaplus", dataset="digits", clients=1, partition="iid", imratio=0.1, seed=0,
        rounds=steps, local_steps=1, stages=2, lr=0.5, lr_decay=3.0, batch_size=32,
        positives_per_batch=8, engine="loop", eval_every=steps, checkpoint_every=0, tensorboard=False,
        options={"prox": 2e-3},
    )  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    reference = torch.load(tmp_path / "run" / "model.pt")["params"]
    mine = {k: v.detach() for k, v in ns["model"].named_parameters()}
    start = {k: v.detach() for k, v in build_model("mlp", (1, 8, 8), seed=0).named_parameters()}
    moved = max_abs_diff(mine, start)
    assert moved > 1e-2  # it trained
    assert max_abs_diff(mine, reference) < 1e-5


def test_the_readme_pauc_and_ap_losses_are_the_librarys_objectives(readme_run):
    ns = readme_run
    model, x, y = ns["model"], ns["x"], ns["y"]
    with torch.no_grad():
        s = torch.sigmoid(model(x)).squeeze(-1)
    assert float(ns["pauc"].detach()) == pytest.approx(
        float(pauc_kl_loss(s[y == 1], s[y == 0], 1.0)), rel=1e-6
    )
    problem = Problem(model, float(y.mean()))
    params, buffers = problem.init_model()
    surrogate = APSurrogate(margin=0.6)
    expected = csg_objective(surrogate, problem, params, buffers, surrogate.from_batch({"x": x, "y": y}))
    assert float(ns["ap"].detach()) == pytest.approx(float(expected), rel=1e-5)
    assert -1 < float(ns["ap"].detach()) < 0
    ell = pairwise_surrogate(s[y == 1], s[y == 0], "squared_hinge", 1.0)  # u: 1 → 0.9 + 0.1·mean exp(ℓ)
    u = 0.9 + 0.1 * torch.exp(ell).mean(1)
    assert float(ns["value"].detach()) == pytest.approx(float(torch.log(u).mean()), rel=1e-5)
    assert torch.allclose(ns["tracked"].log_u[y == 1], torch.log(u), atol=1e-6)
    assert float(ns["tracked"].log_u[y == 0].abs().max()) == 0  # negatives keep no u


def test_the_sampler_gives_the_runs_class_aware_batches():
    """DualSampler(client k) draws what client k of a class-aware run (positives_per_batch = 4) draws,
    epoch after epoch; ShuffleSampler what a plain run draws. Same positions, same inputs."""
    run = make_sim("codaplus", clients=3, batch_size=16, imratio=0.2, seed=5, positives=4)
    plain = make_sim("codaplus", clients=3, batch_size=16, imratio=0.2, seed=5)
    x, y = run.data.client_view(2)
    mine = DualSampler(y, batch_size=16, sampling_rate=0.25, seed=5, client=2)
    shuffled = ShuffleSampler(run.data.shard_sizes[1], 16, seed=5, client=1)
    drawn = [b for _ in range(3) for b in mine]  # three epochs: the stream goes on
    positions = [run.sampler.next() for _ in drawn]
    assert drawn == [p[2].tolist() for p in positions] and len(drawn) == 3 * len(mine)
    assert torch.equal(run.data.batch(positions[-1])["x"][2], x[drawn[-1]])
    assert all(y[b[:4]].tolist() == [1] * 4 and y[b[4:]].sum() == 0 for b in drawn)
    assert [b for b in shuffled] == [plain.sampler.next()[1].tolist() for _ in range(len(shuffled))]
    assert mine.sampling_rate == 0.25


@pytest.mark.parametrize("loss_cls, fn", [(AUCSquareLoss, auc_square_loss), (AUCMLoss, aucm_loss)])
def test_the_auc_losses_wrap_the_objectives_with_their_own_variables(loss_cls, fn):
    torch.manual_seed(0)
    s, y = torch.rand(12), (torch.arange(12) % 3 == 0).float()
    loss = loss_cls(imratio=0.2)
    with torch.no_grad():
        loss.a.fill_(0.3), loss.b.fill_(0.1), loss.alpha.fill_(0.5)
    args = (s, y, torch.tensor(0.3), torch.tensor(0.1), torch.tensor(0.5))
    expected = fn(*args, 0.2) if fn is auc_square_loss else fn(*args, 0.2, 1.0)
    assert float(loss(s[:, None], y[:, None]).detach()) == pytest.approx(float(expected), rel=1e-6)
    auto = loss_cls()  # p = the batch's positive share (LibAUC's auto)
    assert float(auto(s, y).detach()) == pytest.approx(
        float(loss_cls(imratio=float(y.mean()))(s, y).detach()), rel=1e-6
    )
    assert {n for n, _ in loss.named_parameters()} == {"a", "b", "alpha"}
    with pytest.raises(ValueError, match="imratio"):
        loss_cls(imratio=1.5)


def test_pesg_code_form_equals_codaplus_code_form_run(tmp_path):
    """AUCM + closed-form α at the new a, b + clipping + weight decay + restart from the last iterate
    (the authors' script): PESG equals codaplus form = "code" with one client."""
    x, y = make_federated("digits", 1, "iid", 0.1, seed=0).client_view(0)
    sampler = DualSampler(y, batch_size=32, positives=8, seed=0)
    model = build_model("mlp", (1, 8, 8), seed=0)
    loss_fn = AUCMLoss(imratio=sampler.sampling_rate)
    opt = PESG(
        model.parameters(), loss_fn=loss_fn, lr=0.1, weight_decay=1e-5, epoch_decay=2e-3, clip_grad=1.0,
        dual_step="closed_form", dual_order="sequential",
    )  # fmt: skip
    steps, stream = 0, (b for _ in range(4) for b in sampler)  # drawn one batch at a time
    for _stage in range(2):
        for batch in itertools.islice(stream, 15):
            loss = loss_fn(torch.sigmoid(model(x[batch])).squeeze(-1), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        opt.update_regularizer(3, restart="last")
    cfg = RunConfig(
        algorithm="codaplus", clients=1, partition="iid", rounds=steps, local_steps=1, stages=2, lr=0.1,
        batch_size=32, positives_per_batch=8, engine="loop", eval_every=steps, checkpoint_every=0,
        tensorboard=False, options={"form": "code"},
    )  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    reference = torch.load(tmp_path / "run" / "model.pt")["params"]
    assert max_abs_diff({k: v.detach() for k, v in model.named_parameters()}, reference) < 1e-5
    assert 0 <= float(loss_fn.alpha.detach()) <= 999


def test_pesg_momentum_is_torch_sgd_momentum_on_the_primal_variables():
    """epoch_decay = 0: PESG's primal step is SGD with heavy-ball momentum; α ascends by its gradient."""
    torch.manual_seed(0)
    x, y = torch.randn(40, 5), (torch.arange(40) % 4 == 0).float()
    nets = [torch.nn.Linear(5, 1) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    losses = [AUCSquareLoss(imratio=0.25) for _ in range(2)]
    pesg = PESG(nets[0].parameters(), loss_fn=losses[0], lr=0.3, momentum=0.9, weight_decay=1e-3)
    sgd = torch.optim.SGD(
        [*nets[1].parameters(), losses[1].a, losses[1].b], lr=0.3, momentum=0.9, weight_decay=1e-3
    )
    for i in range(5):
        rows = slice(8 * i, 8 * i + 8)
        values = [fn(torch.sigmoid(net(x[rows])).squeeze(-1), y[rows]) for fn, net in zip(losses, nets)]
        for opt, value in zip((pesg, sgd), values):
            opt.zero_grad()
            losses[1].alpha.grad = None
            value.backward()
        sgd.step()
        with torch.no_grad():
            losses[1].alpha += 0.3 * losses[1].alpha.grad
        pesg.step()
    params = [{k: v.detach() for k, v in net.named_parameters()} for net in nets]
    assert max_abs_diff(params[0], params[1]) < 1e-6
    assert float(losses[0].alpha.detach()) == pytest.approx(float(losses[1].alpha.detach()), abs=1e-6) != 0


def test_pesg_refuses_bad_settings_in_one_line():
    model = torch.nn.Linear(3, 1)
    with pytest.raises(ValueError, match="closed_form.*AUCMLoss"):
        PESG(model.parameters(), loss_fn=AUCSquareLoss(), lr=0.1, dual_step="closed_form")
    with pytest.raises(TypeError, match="loss_fn"):
        PESG(model.parameters(), loss_fn=torch.nn.BCELoss(), lr=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one"):
        DualSampler(np.array([0, 1, 0]), batch_size=2)


def test_pesg_resumes_from_its_state_dict_as_if_never_stopped():
    """Everything PESG keeps (v0, stage sums, momentum) is in its state_dict: 4 steps, save, load into a
    fresh optimizer, 4 more and a stage end equal 8 steps and a stage end in one go."""
    torch.manual_seed(1)
    x, y = torch.randn(64, 6), (torch.arange(64) % 4 == 0).float()

    def steps(net, loss_fn, opt, rows):
        for i in rows:
            value = loss_fn(torch.sigmoid(net(x[8 * i : 8 * i + 8])).squeeze(-1), y[8 * i : 8 * i + 8])
            opt.zero_grad()
            value.backward()
            opt.step()

    def fresh(seed=0):
        torch.manual_seed(seed)
        net, loss_fn = torch.nn.Linear(6, 1), AUCMLoss(imratio=0.25)
        groups = [{"params": [net.weight]}, {"params": [net.bias], "lr": 0.05}]  # parameter groups work
        return net, loss_fn, PESG(groups, loss_fn=loss_fn, lr=0.1, momentum=0.5, epoch_decay=0.1)

    whole = fresh()
    steps(*whole, range(8))
    whole[2].update_regularizer(2)
    first = fresh()
    steps(*first, range(4))
    saved = (first[0].state_dict(), first[1].state_dict(), first[2].state_dict())
    second = fresh(seed=5)  # other weights: everything must come from the saved state
    for obj, state in zip(second, saved):
        obj.load_state_dict(state)
    steps(*second, range(4, 8))
    second[2].update_regularizer(2)
    for a, b in zip(whole[:2], second[:2]):
        assert (
            max_abs_diff(
                {k: v.detach() for k, v in a.named_parameters()},
                {k: v.detach() for k, v in b.named_parameters()},
            )
            == 0
        )
    assert [g["lr"] for g in second[2].param_groups] == [0.05, 0.025, 0.05, 0.05]


@pytest.mark.parametrize(
    "algorithm, options, sgd",
    [
        ("fcsg", {}, {}),
        # FCSG-M's u ← (1 − β)u + β·est, u_1 = est: torch's momentum 1 − β with dampening 1 − β
        ("fcsg_m", {"beta": 0.3}, {"momentum": 0.7, "dampening": 0.7}),
    ],
)
def test_aploss_with_sgd_on_plain_batches_equals_the_fcsg_run_with_one_client(
    algorithm, options, sgd, tmp_path
):
    """APLoss + torch SGD over ShuffleSampler batches = the FCSG (FCSG-M) run with K = 1: the same AP
    objective, the same plain batches, the same steps."""
    x, y = make_federated("digits", 1, "iid", 0.1, seed=0).client_view(0)
    sampler = ShuffleSampler(len(y), batch_size=32, seed=0)
    model, loss_fn = build_model("mlp", (1, 8, 8), seed=0), APLoss(margin=0.6)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, **sgd)
    steps = 0
    for batch in itertools.islice((b for _ in range(3) for b in sampler), 60):
        value = loss_fn(torch.sigmoid(model(x[batch])).squeeze(-1), y[batch])
        opt.zero_grad()
        value.backward()
        opt.step()
        steps += 1
    cfg = RunConfig(
        algorithm=algorithm, clients=1, partition="iid", rounds=steps, local_steps=1, stages=1, lr=0.5,
        batch_size=32, engine="loop", eval_every=steps, checkpoint_every=0, tensorboard=False, options=options,
    )  # fmt: skip
    run_experiment(cfg, tmp_path / "run")
    reference = torch.load(tmp_path / "run" / "model.pt")["params"]
    mine = {k: v.detach() for k, v in model.named_parameters()}
    start = {k: v.detach() for k, v in build_model("mlp", (1, 8, 8), seed=0).named_parameters()}
    assert max_abs_diff(mine, start) > 1e-2
    assert max_abs_diff(mine, reference) < 1e-5


def test_partial_auc_loss_with_its_u_estimates_equals_the_local_pair_run_with_one_client(tmp_path):
    """PartialAUCLoss(data_len) + torch SGD over DualSampler batches = localpair (objective = "pauc")
    with K = 1: the same u per positive (moving average, in-order duplicates), the same weighted pairs."""
    x, y = make_federated("digits", 1, "iid", 0.1, seed=0).client_view(0)
    sampler = DualSampler(y, batch_size=32, positives=8, seed=0)
    model = build_model("mlp", (1, 8, 8), seed=0)
    loss_fn = PartialAUCLoss(lam=0.5, data_len=len(y), gamma=0.2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    steps = 0
    for batch in itertools.islice((b for _ in range(3) for b in sampler), 40):
        value = loss_fn(torch.sigmoid(model(x[batch])).squeeze(-1), y[batch], torch.tensor(batch))
        opt.zero_grad()
        value.backward()
        opt.step()
        steps += 1
    options = {"objective": "pauc", "positives_per_batch": 8, "lam": 0.5, "gamma": 0.2}
    cfg = RunConfig(
        algorithm="localpair", clients=1, partition="iid", rounds=steps, local_steps=1, stages=1, lr=0.5,
        batch_size=32, engine="loop", eval_every=steps, checkpoint_every=0, tensorboard=False, options=options,
    )  # fmt: skip
    result = run_experiment(cfg, tmp_path / "run")
    reference = torch.load(tmp_path / "run" / "model.pt")["params"]
    mine = {k: v.detach() for k, v in model.named_parameters()}
    start = {k: v.detach() for k, v in build_model("mlp", (1, 8, 8), seed=0).named_parameters()}
    assert max_abs_diff(mine, start) > 1e-2
    assert max_abs_diff(mine, reference) < 1e-5
    assert float(value.detach()) == pytest.approx(result.history[-1]["train_loss"], rel=1e-4)  # λ·mean log u
    assert float(loss_fn.log_u.abs().max()) > 0  # the u estimates moved


def test_partial_auc_loss_needs_the_index_once_it_keeps_u():
    loss_fn = PartialAUCLoss(data_len=10)
    with pytest.raises(ValueError, match="index"):
        loss_fn(torch.rand(4), torch.tensor([1.0, 0, 0, 1]))
    with pytest.raises(ValueError, match="gamma"):
        PartialAUCLoss(gamma=0.0)


def test_aucm_loss_keeps_one_a_b_alpha_per_label():
    torch.manual_seed(2)
    s, y = torch.rand(16, 3), (torch.rand(16, 3) < 0.3).float()
    loss = AUCMLoss(margin=0.5, num_labels=3)
    with torch.no_grad():
        loss.a.copy_(torch.tensor([0.1, 0.2, 0.3])), loss.alpha.copy_(torch.tensor([1.0, 0.0, 2.0]))
    expected = aucm_loss(s, y, loss.a.detach(), loss.b.detach(), loss.alpha.detach(), y.mean(0), 0.5)
    assert loss.a.shape == (3,) and float(loss(s, y).detach()) == pytest.approx(float(expected), rel=1e-6)

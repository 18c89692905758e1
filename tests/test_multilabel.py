"""Multi-label AUC: per-label a, b, α; loop = vmap; per-label metrics match scikit-learn."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import LabeledData, binarize, make_federated
from fedxrisk.engines import Simulation
from fedxrisk.experiment import RunConfig, run_experiment
from fedxrisk.metrics import evaluate
from fedxrisk.models import build_model
from fedxrisk.objectives import auc_square_loss, aucm_loss
from fedxrisk.problem import Problem
from fedxrisk.tree import index
from helpers import max_abs_diff, run_all

L = 3


def _multilabel(n: int = 120, d: int = 6, seed: int = 0) -> LabeledData:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x[:, :L] + rng.normal(scale=1.0, size=(n, L)) > 0.8).astype(np.float32)
    groups = {"source": np.repeat([0, 1, 2], n // 3)[: n - 30]}
    return LabeledData(
        "ml", x[: n - 30], y[: n - 30], x[n - 30 :], y[n - 30 :], L, groups, ("c0", "c1", "c2")
    )


def _sim(alg: str, engine: str, options=None, mode: str = "global") -> Simulation:
    data = make_federated(binarize(_multilabel()), 3, "source", None, 0)
    net = build_model("mlp", data.data.input_shape, 0, L)
    problem = Problem(net, data.data.pos_ratio, "average", mode, num_labels=L)
    algorithm = ALGORITHMS[alg](problem, **(options or {}))
    return Simulation(algorithm, data, Schedule.build(4, 2, 0.5, 2), 8, 0, engine)


@pytest.mark.parametrize(
    "alg, options, mode",
    [
        ("codasca", None, "global"),
        ("codaplus", {"form": "code"}, "batch"),
        ("coda", None, "local"),
        ("localsgdm", None, "global"),
        ("localscgdam", {"first_order": True, "alpha_h": 1.0, "beta_x": 1.0, "beta_y": 1.0}, "global"),
        ("localsgdam", None, "global"),
    ],
)
def test_multilabel_loop_and_vmap_agree(alg, options, mode):
    loop = run_all(_sim(alg, "loop", options, mode))
    vmap = run_all(_sim(alg, "vmap", options, mode))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    if alg != "localsgdm":
        assert loop.states["alpha"].shape == (3, L)  # [clients, labels]
        assert loop.states["a"].shape == (3, L)
        assert float(loop.states["alpha"].abs().min()) > 0  # every label's α moved


@pytest.mark.parametrize("loss", [auc_square_loss, aucm_loss])
def test_multilabel_loss_is_the_mean_of_per_label_losses(loss):
    g = torch.Generator().manual_seed(0)
    s, y = torch.rand(16, L, generator=g), (torch.rand(16, L, generator=g) > 0.6).float()
    a, b, alpha, p = (torch.rand(L, generator=g) for _ in range(4))
    per_label = [loss(s[:, j], y[:, j], a[j], b[j], alpha[j], p[j]) for j in range(L)]
    torch.testing.assert_close(loss(s, y, a, b, alpha, p), torch.stack(per_label).mean())


@pytest.mark.parametrize("alg", ["localscgdam", "localsgdam"])
def test_scgdam_family_keeps_one_a_b_alpha_per_label_and_averages_the_label_losses(alg):
    """Issue 13.1: on a 3-label task each label has its own (a, b, α); the loss is the mean of the
    per-label AUC losses, so ∂F/∂α_j is label j's own derivative divided by L."""
    from fedxrisk.objectives.compositional import inner_map

    options = {"alpha_h": 1.0, "beta_x": 1.0, "beta_y": 1.0} if alg == "localscgdam" else None
    sim = _sim(alg, "loop", options)
    algorithm, problem = sim.algorithm, sim.algorithm.problem
    state = index(sim.states, 0)
    assert state["a"].shape == state["b"].shape == state["alpha"].shape == (L,)
    g = torch.Generator().manual_seed(1)
    a, b, alpha = (torch.rand(L, generator=g) for _ in range(3))
    state.update(a=a, b=b, alpha=alpha)
    batch = {k: v[0] for k, v in sim.data.batch(np.arange(24).reshape(1, 24) % 10).items()}
    w = state["w"]
    if alg == "localscgdam":  # the outer loss is taken at the inner point g(x)
        w = inner_map(problem, {"w": w, "a": a, "b": b}, state["buffers"], batch, algorithm.rho)[0]["w"]
        _, galpha, f = algorithm.compositional_gradient(state, batch)
    else:
        (_, galpha), (f, _) = torch.func.grad_and_value(algorithm._objective, argnums=(0, 1), has_aux=True)(
            {"w": w, "a": a, "b": b}, alpha, state["buffers"], state["p"], batch
        )
    s = torch.sigmoid(problem.logits(w, state["buffers"], batch["x"])[0]).detach()
    alpha_leaf = alpha.clone().requires_grad_(True)
    per_label = [
        auc_square_loss(s[:, j], batch["y"][:, j], a[j], b[j], alpha_leaf[j], state["p"][j]) for j in range(L)
    ]
    expected = torch.stack(per_label).mean()
    (expected_galpha,) = torch.autograd.grad(expected, alpha_leaf)
    torch.testing.assert_close(f, expected.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(galpha, expected_galpha, atol=1e-6, rtol=1e-6)


def test_per_label_metrics_match_sklearn():
    sim = run_all(_sim("codasca", "vmap"))
    params, buffers = sim.global_model()
    m = evaluate(sim.algorithm.problem, params, buffers, sim.data)
    problem = sim.algorithm.problem
    with torch.no_grad():
        problem.model.eval()
        scores = problem.logits(params, buffers, sim.data.data.x_test)[0].numpy()
        problem.model.train()
    y = sim.data.data.y_test.numpy()
    expected = [roc_auc_score(y[:, j], scores[:, j]) for j in range(L)]
    np.testing.assert_allclose(m["test_auroc_per_label"], expected, rtol=1e-12)
    np.testing.assert_allclose(
        m["test_ap_per_label"], [average_precision_score(y[:, j], scores[:, j]) for j in range(L)]
    )
    assert m["test_auroc"] == pytest.approx(np.mean(expected))


def test_multilabel_run_writes_per_label_auroc(tmp_path):
    data = _multilabel()
    np.savez(tmp_path / "data.npz", x_train=data.x_train, y_train=data.y_train, x_test=data.x_test,
             y_test=data.y_test, source_train=data.groups_train["source"])  # fmt: skip
    cfg = RunConfig(algorithm="codasca", dataset="npz", data_dir=str(tmp_path), imratio=None, clients=3,
                    partition="source", rounds=2, stages=1, local_steps=2, eval_every=1, batch_size=8)  # fmt: skip
    result = run_experiment(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["final"]["test_auroc_per_label"]) == L
    assert summary["final"]["test_auroc"] == pytest.approx(np.mean(summary["final"]["test_auroc_per_label"]))
    assert len(result.history) == 2 and summary["data"]["client_counts"][0][0] == [
        int(v)
        for v in data.y_train[:40].sum(0)  # source 0 = rows 0..39
    ]
    with pytest.raises(ValueError, match="multi-label: imratio"):
        make_federated(binarize(data), 3, "iid", 0.1, 0)


def test_cli_reads_a_data_dir_and_imratio_none(tmp_path):
    from click.testing import CliRunner

    from fedxrisk.cli import main

    data = _multilabel()
    np.savez(tmp_path / "data.npz", x_train=data.x_train, y_train=data.y_train, x_test=data.x_test,
             y_test=data.y_test, source_train=data.groups_train["source"])  # fmt: skip
    args = ["run", "--dataset", "npz", "--data-dir", str(tmp_path), "--imratio", "none", "--partition", "source",
            "-K", "3", "--rounds", "1", "--stages", "1", "-I", "1", "--out", str(tmp_path / "run"), "-q"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["imratio"] is None and len(summary["final"]["test_auroc_per_label"]) == L

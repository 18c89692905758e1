"""Issue 33: every AUC method at its defaults survives a label-skewed split (mostly-positive clients).

Before the safeguards of :mod:`fedxrisk.objectives.auc`, CODASCA/CODA+/CoDA at lr 3 were NaN
within ~6 rounds on such splits: a's step exceeded 2/curvature on the mostly-positive clients.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS
from fedxrisk.data import make_federated
from fedxrisk.objectives import auxiliary_curvatures, stable_scale
from fedxrisk.run.recipes import run_experiment
from fedxrisk.run.spec import RunConfig

AUC_METHODS = ("codasca", "codaplus", "coda", "npa", "localsgdam", "localscgdam", "fedxl1", "fedxl2",
               "localpair", "fcsg", "fcsg_m", "acc_fcsg_m", "local_scgd", "local_scgdm")  # fmt: skip
SKEWED = dict(clients=8, partition="dirichlet", dirichlet_alpha=0.3, imratio=None, allow_missing_class=True)


@pytest.fixture(scope="module")
def tabular(tmp_path_factory) -> str:
    """1,200 rows, 12 features, ~12 % positives with a linear signal (like campaign at a small size)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1200, 12))
    y = (x[:, :3].sum(1) + rng.normal(scale=1.0, size=1200) > 2.3).astype(np.int64)
    path = tmp_path_factory.mktemp("data") / "skewed.npz"
    np.savez(path, X=x, y=y)
    return str(path)


def test_the_split_has_mostly_positive_clients(tabular):
    data = make_federated("npz", 8, "dirichlet", None, 0, None, 0.3, True, tabular)
    ratios = [data.client_pos_ratio(k) for k in range(8)]
    assert 0.08 < data.data.pos_ratio < 0.16
    assert max(ratios) > 0.5  # lr 3 × 2(1 − p) × share > 2 there: the unsafeguarded a-step diverges


# 20 rounds per method: CODASCA in the quick subset, every method in the full suite
@pytest.mark.parametrize(
    "method", [pytest.param(m, marks=[] if m == "codasca" else pytest.mark.slow) for m in AUC_METHODS]
)
def test_auc_method_defaults_survive_label_skew(method, tabular, tmp_path):
    assert method in ALGORITHMS
    cfg = RunConfig(algorithm=method, dataset="npz", data_dir=tabular, rounds=20, eval_every=20,
                    checkpoint_every=0, tensorboard=False, **SKEWED)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_experiment(cfg, tmp_path / "run")
    final = result.history[-1]
    assert math.isfinite(final["train_loss"])
    assert final["test_auroc"] > 0.5, final


def test_stable_scale_is_one_where_the_paper_step_is_stable_and_caps_it_elsewhere():
    curvature = torch.tensor([0.1, 1.0 / 3.0, 1.8])
    assert torch.allclose(stable_scale(3.0, curvature) * 3.0 * curvature, torch.tensor([0.3, 1.0, 1.0]))
    y = torch.tensor([1.0, 1.0, 1.0, 0.0])  # 3 of 4 positives, p = 0.1
    l_a, l_b, l_alpha = auxiliary_curvatures(y, torch.tensor(0.1))
    a = torch.tensor(0.3, requires_grad=True)  # the exact curvature of the loss in a (autograd)
    s = torch.tensor([0.2, 0.5, 0.9, 0.4])
    from fedxrisk.objectives import auc_square_loss

    (g,) = torch.autograd.grad(auc_square_loss(s, y, a, torch.tensor(0.0), torch.tensor(0.0), 0.1), a,
                               create_graph=True)  # fmt: skip
    (h,) = torch.autograd.grad(g, a)
    assert float(l_a) == pytest.approx(float(h)) == pytest.approx(2 * 0.9 * 0.75)
    assert float(l_b) == pytest.approx(2 * 0.1 * 0.25) and float(l_alpha) == pytest.approx(2 * 0.1 * 0.9)


def test_tune_trial_zero_uses_the_step_size_fedxrisk_run_uses(tmp_path):
    """Balanced data (p ≈ 0.5): `fedxrisk run` lowers CODASCA's lr 3; tune's trial 0 must too."""
    from click.testing import CliRunner

    from fedxrisk.cli import main
    from fedxrisk.run.tune import load_records, tune_config

    args = ["--set", 'data.imratio="none"', "--rounds", "3", "--eval-every", "1", "--clients", "4"]
    result = CliRunner().invoke(main, ["tune", *args, "--trials", "1", "-q", "--out", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    cfg = RunConfig(imratio=None, rounds=3, eval_every=1, clients=4, tensorboard=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the same run as tune's trials (its validation split included)
        ran = run_experiment(tune_config(cfg, None), tmp_path / "run")
    lr = ran.summary["config"]["lr"]
    assert lr < 2.0  # lowered from 3 for p ≈ 0.5
    assert load_records(tmp_path / "t", None)[0].params["lr"] == lr

"""Issue 31.4: the Flower pieces (fedxrisk.flower.api) with a model that is not registered and
site data from a function, run through the real ClientApp/ServerApp in one process."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from torch import nn  # noqa: E402

from fedxrisk.algorithms import ALGORITHMS, Schedule  # noqa: E402
from fedxrisk.data import make_federated  # noqa: E402
from fedxrisk.engines import Simulation  # noqa: E402
from fedxrisk.errors import ConfigError  # noqa: E402
from fedxrisk.flower.api import make_client_app, make_server_app, register_model, site_data  # noqa: E402
from fedxrisk.flower.config import FlowerConfig  # noqa: E402
from fedxrisk.models import MODELS  # noqa: E402
from fedxrisk.problem import Problem  # noqa: E402
from fedxrisk.run.folder import load_model  # noqa: E402
from flower_grid import InProcessGrid  # noqa: E402
from helpers import max_abs_diff, run_all  # noqa: E402
from test_pieces import readme_blocks  # noqa: E402

NODES = {1000 + i: {"partition-id": i} for i in range(2)}
SHIPPED = dict(MODELS)


@pytest.fixture(autouse=True)
def _registry_restored():
    """The apps register their model in MODELS; later tests (the catalogue's) see the registry as shipped."""
    yield
    MODELS.clear()
    MODELS.update(SHIPPED)


def loop_reference(model_fn, algorithm: str, rounds: int, local_steps: int, lr: float, stages: int, **opt):
    """The loop engine on the two iid shards, the network built as build_model seeds a model."""
    data = make_federated("digits", 2, "iid", 0.3, 0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = model_fn()
    alg = ALGORITHMS[algorithm](Problem(net, data.data.pos_ratio), **opt)
    sim = Simulation(alg, data, Schedule.build(rounds, local_steps, lr, stages), 8, 0, "loop")
    start = {k: v.detach().clone() for k, v in net.named_parameters()}
    trained = run_all(sim).global_model()[0]
    assert max_abs_diff(trained, start) > 1e-3  # the comparison is not between two untrained models
    return trained


def run_apps(client_app, server_app, tmp_path, run_config: dict | None = None):
    grid = InProcessGrid(client_app, run_config or {}, NODES)
    server_app(grid, Context(1, 0, {}, RecordDict(), dict(run_config or {})))
    return torch.load(tmp_path / "model.pt"), json.loads((tmp_path / "summary.json").read_text())


def test_the_readme_flower_apps_train_the_loop_engines_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {}  # the block stands alone
    block = readme_blocks("Pieces for your own loop")[3]
    assert sum(1 for line in block.splitlines() if line.strip()) <= 10
    exec(compile(block, "README.md", "exec"), ns)
    model, summary = run_apps(ns["client_app"], ns["server_app"], tmp_path / "runs" / "flower-own")
    reference = loop_reference(ns["model_fn"], "codasca", rounds=3, local_steps=2, lr=0.1, stages=2)
    assert summary["status"] == "completed" and summary["rounds"] == 3
    assert model["model"].startswith("custom.") and max_abs_diff(model["params"], reference) < 1e-6
    MODELS.clear()  # a fresh process reading the run: registering model_fn again is enough
    MODELS.update(SHIPPED)
    register_model(ns["model_fn"])
    loaded = load_model(tmp_path / "runs" / "flower-own")
    assert max_abs_diff({k: v.detach() for k, v in loaded.named_parameters()}, model["params"]) == 0


def test_own_apps_take_run_config_overrides_and_options(tmp_path):
    """``flwr run --run-config`` keys override the app's settings; ``options`` is a dict."""

    def small():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 1))

    def data(context):
        shard = make_federated("digits", 2, "iid", 0.3, 0).client_view(context.node_config["partition-id"])
        return shard[0].numpy(), shard[1].numpy()  # arrays work too

    settings = dict(
        algorithm="codaplus", rounds=5, stages=1, local_steps=1, batch_size=8, lr=0.2, options={"prox": 0.01}
    )
    apps = make_client_app(small, data, **settings), make_server_app(small, out_dir=str(tmp_path), **settings)
    model, summary = run_apps(*apps, tmp_path, {"rounds": 2, "my-own-key": "ignored"})
    assert summary["rounds"] == 2
    reference = loop_reference(small, "codaplus", rounds=2, local_steps=1, lr=0.2, stages=1, prox=0.01)
    assert max_abs_diff(model["params"], reference) < 1e-6


def test_bad_settings_and_bad_site_data_are_named():
    def net():
        return nn.Linear(64, 1)

    with pytest.raises(ConfigError, match="rounds"):
        make_client_app(net, lambda c: None, rounds=0)
    with pytest.raises(ConfigError, match="unknown run-config key"):
        make_server_app(net, learning_rate=0.1)
    cfg = FlowerConfig()
    with pytest.raises(ValueError, match="data_fn must return"):
        site_data(torch.zeros(3), cfg, {})
    with pytest.raises(ValueError, match="binary 0/1"):
        site_data((torch.zeros(3, 2), torch.tensor([0.0, 2.0, 1.0])), cfg, {})
    with pytest.raises(ValueError, match="no positive"):
        site_data((torch.zeros(3, 2), torch.zeros(3)), cfg, {})


def test_validation_data_from_data_fn_feeds_selection(tmp_path):
    """(x, y, x_val, y_val) from data_fn: the server's val_auroc is the AUROC of the sites' pooled
    validation scores under the saved model (from their histograms, within its bound)."""
    from fedxrisk.metrics import auroc, predict

    def small():
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 1))

    def split(k):
        x, y = make_federated("digits", 2, "iid", 0.3, 0).client_view(k)
        return x[:-40], y[:-40], x[-40:], y[-40:]

    settings = dict(
        algorithm="codaplus",
        rounds=4,
        stages=1,
        eval_every=1,
        local_steps=2,
        batch_size=8,
        lr=0.3,
        selection="best",
        validation="official",  # the val arrays data_fn returns (check() asks for validation with selection)
    )
    apps = (
        make_client_app(small, lambda c: split(c.node_config["partition-id"]), **settings),
        make_server_app(small, out_dir=str(tmp_path), **settings),
    )
    model, summary = run_apps(*apps, tmp_path)
    rows = (tmp_path / "history.csv").read_text().splitlines()
    header, chosen = rows[0].split(","), summary["selected"]
    assert chosen["monitor"] == "val_auroc" and 1 <= chosen["round"] <= 4
    row = dict(zip(header, rows[chosen["round"]].split(",")))
    net = small()
    net.load_state_dict(model["params"])
    problem = Problem(net, 0.3)
    x_val = torch.cat([split(k)[2] for k in range(2)])
    y_val = torch.cat([split(k)[3] for k in range(2)])
    exact = auroc(y_val.numpy(), predict(problem, model["params"], model["buffers"], x_val))
    assert abs(float(row["val_auroc"]) - exact) <= float(row["val_auroc_bound"]) + 1e-9

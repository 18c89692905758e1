"""Paper-scale models: architecture sizes, functional_call + vmap with BatchNorm buffers, weight loading."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import functional_call, vmap

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.data import LabeledData, binarize, make_federated
from fedxrisk.engines import Simulation
from fedxrisk.models import build_model, densenet121_imagenet
from fedxrisk.models.densenet import WEIGHTS_ENV, DenseNet, load_pretrained
from fedxrisk.problem import Problem
from fedxrisk.tree import stack
from helpers import max_abs_diff, run_all


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_architectures_have_the_published_sizes():
    assert _count(build_model("densenet121", (3, 32, 32), 0, 1000)) == 7_978_856  # torchvision's DenseNet-121
    assert _count(build_model("resnet20", (3, 32, 32), 0, 10)) == 269_722  # He et al.'s 0.27 M (option A)
    assert build_model("cnn28", (1, 28, 28), 0, 5)(torch.zeros(2, 1, 28, 28)).shape == (2, 5)


def _images(shape: tuple[int, ...], n: int = 24) -> LabeledData:
    rng = np.random.default_rng(0)
    x = rng.random((n, *shape), dtype=np.float32)
    y = np.arange(n) % 4
    return LabeledData("img", x[:16], y[:16], x[16:], y[16:], 4)


@pytest.mark.parametrize("model, shape", [("resnet20", (3, 8, 8)), ("cnn28", (1, 28, 28))])
def test_models_train_identically_on_loop_and_vmap(model, shape):
    def sim(engine: str) -> Simulation:
        data = make_federated(binarize(_images(shape)), 2, "class", None, 0)
        problem = Problem(build_model(model, shape, 0), data.data.pos_ratio)
        return Simulation(ALGORITHMS["codasca"](problem), data, Schedule.build(1, 1, 0.1), 4, 0, engine)

    loop, vm = run_all(sim("loop")), run_all(sim("vmap"))
    assert max_abs_diff(loop.states, vm.states) < 1e-4
    if model == "resnet20":
        assert float(loop.states["buffers"]["bn.num_batches_tracked"][0]) == 1


def test_densenet_forward_under_vmap_updates_each_clients_batchnorm():
    # DenseNet-121's code path with fewer layers per block (2 instead of 6, 12, 24, 16), to stay fast
    torch.manual_seed(0)
    net = DenseNet((3, 32, 32), 1, blocks=(2, 2, 2, 2))
    params = [{k: v.detach() + 0.01 * i for k, v in net.named_parameters()} for i in range(2)]
    buffers = [{k: v.clone() for k, v in net.named_buffers()} for _ in range(2)]
    x = torch.rand(2, 2, 3, 32, 32, generator=torch.Generator().manual_seed(0))

    def forward(p, b, xi):
        b = {k: v.clone() for k, v in b.items()}
        return functional_call(net, (p, b), (xi,)), b

    batched, new_buffers = vmap(forward, randomness="different")(stack(params), stack(buffers), x)
    for i in range(2):
        out, buf = forward(params[i], buffers[i], x[i])
        torch.testing.assert_close(batched[i], out, atol=1e-5, rtol=1e-5)
        key = "features.norm5.running_mean"
        torch.testing.assert_close(new_buffers[key][i], buf[key], atol=1e-5, rtol=1e-5)
    assert batched.shape == (2, 2, 1)


def test_densenet_weights_load_from_a_local_file_only(tmp_path, monkeypatch):
    source = build_model("densenet121", (3, 32, 32), 1, 1000)
    old_style = {  # torchvision's original key names: "norm.1" for "norm1"
        k.replace(".norm1.", ".norm.1.").replace(".conv2.", ".conv.2."): v
        for k, v in source.state_dict().items()
    }
    torch.save(old_style, tmp_path / "w.pth")
    loaded = load_pretrained(build_model("densenet121", (3, 32, 32), 2), tmp_path / "w.pth")
    ref = source.state_dict()
    for k, v in loaded.state_dict().items():
        if not k.startswith("classifier"):
            assert torch.equal(v, ref[k]), k
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path / "w.pth"))
    assert torch.equal(densenet121_imagenet((3, 32, 32)).features.conv0.weight, ref["features.conv0.weight"])
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path / "missing.pth"))
    with pytest.raises(FileNotFoundError, match="never downloads"):
        densenet121_imagenet((3, 32, 32))

"""Fast simulation paths (compile, chunked vmap, auto, vectorized sampler) against the references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedxrisk.data.sampler import ClientSampler
from fedxrisk.engines import simulation
from fedxrisk.engines.simulation import AutoEngine, CompiledEngine, VmapEngine, choose_engine
from fedxrisk.experiment import RunConfig, validate
from helpers import make_sim, max_abs_diff, run_all

# torch.compile's own internals call torch.jit.script_method; nothing of ours does
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def _agree(alg: str, engine: str, engine_options=None, **kw) -> tuple:
    loop = run_all(make_sim(alg, "loop", **kw))
    fast = make_sim(alg, engine, **kw)
    if engine_options:
        fast.engine = type(fast.engine)(**engine_options)
        fast.engine.configure(fast)
    run_all(fast)
    assert loop.ledger.summary() == fast.ledger.summary()
    return max_abs_diff(loop.states, fast.states), fast


@pytest.mark.slow  # torch.compile of a whole round (test_compiled_step_keeps_inputs_untouched compiles quickly)
def test_compiled_engine_matches_loop_across_an_lr_change():
    # two stages: the learning rate changes, so the compiled step sees new scalars; the code
    # form's options (sequential α step, variates kept, own prox reference) run inside it
    kw = dict(clients=3, rounds=4, local_steps=2, stages=2, model="linear", options={"form": "code"})
    diff, sim = _agree("codasca", "compile", **kw)
    assert sim.engine.failure is None, sim.engine.failure
    assert diff < 1e-5


@pytest.mark.slow  # torch.compile of a whole round (test_compiled_step_keeps_inputs_untouched compiles quickly)
def test_compiled_engine_matches_loop_with_batchnorm_buffers():
    # aot_eager runs the same dynamo + functionalization path without C++ codegen (fast)
    kw = dict(clients=2, rounds=2, local_steps=2, model="cnn", partition="class", buffer_policy="local")
    diff, sim = _agree("localsgdm", "compile", {"backend": "aot_eager"}, **kw)
    assert sim.engine.failure is None, sim.engine.failure
    assert diff < 1e-5


def _broken_backend(gm, example_inputs):
    raise RuntimeError("no compiler here")


@pytest.mark.slow  # a failing torch.compile (test_compiled_step_keeps_inputs_untouched compiles quickly)
def test_compiled_engine_falls_back_to_vmap_when_compilation_fails():
    loop = run_all(make_sim("localsgdm", "loop", clients=3, rounds=2))
    sim = make_sim("localsgdm", "compile", clients=3, rounds=2)
    sim.engine = CompiledEngine(backend=_broken_backend)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        run_all(sim)
    assert sim.engine.failure is not None
    assert max_abs_diff(loop.states, sim.states) < 1e-5


@pytest.mark.parametrize("alg", ["localsgdm", "codasca"])
def test_chunked_vmap_matches_loop(alg):
    # 5 clients in chunks of 2: the last chunk is short
    diff, sim = _agree(alg, "vmap", {"chunk_size": 2}, clients=5, rounds=2, local_steps=2)
    assert sim.engine.chunk_size == 2
    assert diff < 1e-5


def test_engine_options_reach_the_engine_and_bad_chunk_is_rejected():
    sim = make_sim("localsgdm", "vmap", clients=2, rounds=1)
    sim2 = type(sim)(
        sim.algorithm, sim.data, sim.schedule, 8, engine="vmap", engine_options={"chunk_size": 1}
    )
    assert sim2.engine.chunk_size == 1
    with pytest.raises(ValueError, match="chunk_size"):
        VmapEngine(chunk_size=0)


def test_auto_rule(monkeypatch):
    monkeypatch.setattr(simulation, "compiler_available", lambda: True)
    big = simulation.AUTO_COMPILE_MIN_CLIENT_STEPS
    assert choose_engine(1, 10**9) == "loop"
    assert choose_engine(64, 10) == "vmap"
    assert choose_engine(64, -(-big // 64)) == "compile"
    assert choose_engine(64, -(-big // 64), compilations=3) == "vmap"  # one compilation per learning rate
    assert choose_engine(64, big, conv_flops_per_sample=simulation.AUTO_LOOP_MIN_CONV_FLOPS) == "loop"
    monkeypatch.setattr(simulation, "compiler_available", lambda: False)
    assert choose_engine(64, big) == "vmap"


def test_auto_counts_flops_and_sends_resnet_class_models_to_the_loop():
    from fedxrisk.models.resnet import ResNet

    sim = make_sim("localsgdm", "auto", clients=2, rounds=1, model="cnn")
    small, conv = simulation.forward_flops_per_sample(sim)
    assert conv and 0 < small < simulation.AUTO_LOOP_MIN_CONV_FLOPS
    assert sim.engine.chosen == "vmap"
    sim.algorithm.problem.model = ResNet((1, 8, 8), width=32)  # same data, a ResNet-class model
    big, conv = simulation.forward_flops_per_sample(sim)
    assert conv and big >= simulation.AUTO_LOOP_MIN_CONV_FLOPS
    sim.engine.configure(sim)
    assert sim.engine.chosen == "loop"
    mlp = make_sim("localsgdm", "auto", clients=2, rounds=1)
    assert simulation.forward_flops_per_sample(mlp)[1] is False


def test_auto_engine_matches_loop_and_says_what_it_chose():
    diff, sim = _agree("codasca", "auto", clients=3, rounds=3, local_steps=2)
    assert isinstance(sim.engine, AutoEngine) and sim.engine.chosen == "vmap"  # a tiny run: no compile
    assert diff < 1e-5


def test_experiment_accepts_the_new_engines():
    for name in ("compile", "auto"):
        validate(RunConfig(engine=name))


class _PerClientSampler:
    """The per-client reference the vectorized sampler must reproduce."""

    def __init__(self, sizes, batch, seed, stream=0):
        self.sizes, self.batch = sizes, batch
        self.rngs = [np.random.default_rng([seed, stream, k]) for k in range(len(sizes))]
        self.queues = [np.empty(0, dtype=np.int64) for _ in sizes]

    def draw(self, count):
        rows = []
        for k, rng in enumerate(self.rngs):
            q = self.queues[k]
            while len(q) < count:
                q = np.concatenate([q, rng.permutation(self.sizes[k])])
            self.queues[k], rows = q[count:], rows + [q[:count]]
        return np.stack(rows)


def test_vectorized_sampler_reproduces_the_per_client_stream_and_resumes():
    sizes = [5, 40, 33, 1, 8]
    ref, fast = _PerClientSampler(sizes, 8, seed=3), ClientSampler(sizes, 8, seed=3)
    for _ in range(7):
        np.testing.assert_array_equal(fast.next(), ref.draw(8))
    np.testing.assert_array_equal(fast.sample(50), ref.draw(50))  # larger than any queue: buffer grows
    saved = fast.state_dict()
    expected = [ref.draw(8) for _ in range(4)]
    resumed = ClientSampler(sizes, 8, seed=99)
    resumed.load_state_dict(saved)
    for want in expected:
        np.testing.assert_array_equal(resumed.next(), want)
        np.testing.assert_array_equal(fast.next(), want)
    assert all(((row >= 0) & (row < n)).all() for row, n in zip(fast.next(), sizes))


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_compiled_step_keeps_inputs_untouched():
    sim = make_sim("localsgdm", "compile", clients=2, rounds=1)
    sim.engine = CompiledEngine(backend="aot_eager")
    before = {k: v.clone() for k, v in sim.states["w"].items()}
    states = sim.states
    sim.run_round()
    assert all(torch.equal(before[k], states["w"][k]) for k in before)


@pytest.mark.slow  # torch.compile of a whole round (test_compiled_step_keeps_inputs_untouched compiles quickly)
def test_compiled_engine_with_chunks_matches_loop():
    diff, sim = _agree(
        "codasca", "compile", {"backend": "aot_eager", "chunk_size": 2}, clients=3, rounds=2, local_steps=2
    )
    assert sim.engine.failure is None, sim.engine.failure
    assert diff < 1e-5

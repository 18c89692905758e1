"""Issue 40 item 1: at instance level no label escapes the clipped, noised gradient.

The attack, for every registered algorithm instance-level DP accepts: two runs with the same
(test-mode, reproducible) sampling and noise streams on data that differ in the label of one
record the Poisson sampler never drew. Whatever the run releases — every tree a client hands the
collective, what comes back, the global model, a site's personal model — must be bit-for-bit
equal: the record was not in any batch, so DP-SGD's output cannot depend on it. The record is
the client's first (local position 0): empty batch slots used to be copies of it, and CODA+ and
CODASCA scaled their a/b/α steps by the label share of the whole padded batch. The control:
flipping a record that *was* sampled changes what is released (the test can see a label).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from fedxrisk.algorithms import ALGORITHMS, Schedule
from fedxrisk.algorithms.base import with_hooks
from fedxrisk.data import make_federated
from fedxrisk.engines import Simulation
from fedxrisk.engines.privacy import NoiseSource, instance_private, unsupported_instance_reason
from fedxrisk.errors import ConfigError
from fedxrisk.models import build_model
from fedxrisk.objectives import auxiliary_curvatures, auxiliary_scales
from fedxrisk.problem import Problem
from fedxrisk.tree import leaves

pytest.importorskip("dp_accounting")
P, CLIP, SIGMA, LR, BATCH = 0.3, 1.0, 1.0, 3.0, 8  # LR: the CODA family's default η, where η·ℓ > 1


class Recording:
    """A collective that keeps a copy of every tree it is handed and returns."""

    def __init__(self, inner: Any, log: list):
        self.inner, self.log = inner, log

    def __getattr__(self, attr: str) -> Any:
        method = getattr(self.inner, attr)
        if attr not in ("mean", "gather", "pool"):
            return method

        def recorded(*args: Any) -> Any:
            out = method(*args)
            self.log.append(copy.deepcopy((attr, args, out)))
            return out

        return recorded


def _build(name: str, data: Any, seed: int) -> tuple[Any, Simulation]:
    net = build_model("mlp", data.data.input_shape, 0)
    alg = ALGORITHMS[name](Problem(net, P))
    reason = unsupported_instance_reason(alg)
    if reason is not None:
        return reason, None
    private = instance_private(alg, CLIP, SIGMA, pos_ratio=P if alg.uses_pos_ratio else None)
    steps = alg.fixed_window or 2
    schedule = Schedule.build(2, steps, LR, 1)
    return None, Simulation(private, data, schedule, BATCH, 0, noise=NoiseSource.reproducible(seed))


class LabelBlind:
    """DP-SGD on a copy of the batch whose labels are all 0: the mechanism itself sees no label."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __call__(self, loss: Any, params: Any, batch: dict[str, torch.Tensor]) -> Any:
        return self.inner(loss, params, dict(batch, y=torch.zeros_like(batch["y"])))


def _released(name: str, data: Any, seed: int, blind: bool = False) -> list[torch.Tensor]:
    """Every tensor the run releases: each collective's input and output, the global model, and
    each site's personal model (Ditto's v); ``blind``: DP-SGD fed no label (:class:`LabelBlind`)."""
    _, sim = _build(name, data, seed)
    if blind:
        estimator = LabelBlind(sim.algorithm.gradient_estimator)
        sim.algorithm = with_hooks(sim.algorithm, gradient_estimator=estimator)
    log: list = []
    inner = sim._collective
    sim._collective = lambda: Recording(inner(), log)  # noqa: SLF001  (the spy)
    while not sim.done:
        sim.run_round()
    released = [t for entry in log for _, t in leaves({"x": _tree(entry)})]
    released += [t for _, t in leaves({"g": sim.global_model()[0]})]
    personal = getattr(sim.algorithm, "personal_model", None)
    if personal is not None:
        released += [t for _, t in leaves({"v": personal(sim.states)[0]})]
    return released


def _tree(entry: Any) -> Any:
    if isinstance(entry, torch.Tensor):
        return entry
    if isinstance(entry, dict):
        return {str(k): _tree(v) for k, v in entry.items()}
    if isinstance(entry, (tuple, list)):
        return {str(i): _tree(v) for i, v in enumerate(entry)}
    return {}


def _sampled(name: str, data: Any, seed: int) -> list[list[int]]:
    """Client 0's local positions in each training batch of the run (the sampler replayed on a
    copy: the same test-mode source, the same draws)."""
    _, sim = _build(name, data, seed)
    sampler = copy.deepcopy(sim.sampler)
    steps = sum(plan.window for plan in sim.plans)
    return [[int(i) for i in sampler.next()[0] if i >= 0] for _ in range(steps)]


def _flip(data: Any, client: int, local: int) -> Any:
    out = copy.deepcopy(data)
    g = int(out.shards[client][local])
    out.data.y_train[g] = 1 - out.data.y_train[g]
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def data() -> Any:
    return make_federated("digits", 2, "iid", P, 0)


def _skip_refused(name: str, data: Any) -> None:
    """Skip an algorithm instance-level DP refuses, after checking the refusal is one line."""
    reason, _ = _build(name, data, 0)
    if reason is not None:
        assert "\n" not in reason and reason.strip()
        with pytest.raises(ConfigError) as e:
            net = build_model("mlp", data.data.input_shape, 0)
            instance_private(ALGORITHMS[name](Problem(net, P)), CLIP, SIGMA, P)
        assert "\n" not in str(e.value)
        pytest.skip(f"refused at instance level: {reason}")


@pytest.mark.parametrize("name", sorted(n for n, c in ALGORITHMS.items() if c.task == "binary"))
def test_an_unsampled_label_changes_nothing_released(name, data):
    _skip_refused(name, data)
    # a test-mode stream in which client 0's first record is never drawn (it used to fill the padding)
    seed = next(s for s in range(50) if all(0 not in batch for batch in _sampled(name, data, s)))
    batches = _sampled(name, data, seed)
    drawn = {i for batch in batches for i in batch}
    assert batches[0], "the first batch is empty"
    other = next(i for i in range(1, data.shard_sizes[0]) if i not in drawn)
    base = _released(name, data, seed)
    for local in (0, other):  # unsampled: the padding's former source, and any other record
        same = _same(base, _released(name, _flip(data, 0, local), seed))
        assert same, f"the label of unsampled record {local} changes what {name} releases"
    # the control flips a record of the first step (later, a sigmoid saturated at η = 3 can pass no
    # gradient to w and the projection of a, b onto [0, 1] can absorb the rest)
    control = _same(base, _released(name, _flip(data, 0, batches[0][0]), seed))
    assert not control, "flipping a sampled record changed nothing: the test sees nothing"


@pytest.mark.parametrize("name", sorted(n for n, c in ALGORITHMS.items() if c.task == "binary"))
def test_no_label_reaches_a_step_except_through_the_mechanism(name, data):
    """With DP-SGD fed no label (its input's labels zeroed), flipping *every* label of every client
    changes nothing released: nothing outside the clipped, noised gradient reads a label (CODA+'s
    a/b/α step scales once read the batch's label share, sampled records included). The control:
    with the mechanism seeing labels, the flip changes the release."""
    _skip_refused(name, data)
    flipped = copy.deepcopy(data)
    flipped.data.y_train = 1 - flipped.data.y_train
    blind = _released(name, data, 0, blind=True)
    assert _same(blind, _released(name, flipped, 0, blind=True)), f"{name} reads labels outside DP-SGD"
    assert not _same(_released(name, data, 0), _released(name, flipped, 0)), "the control sees nothing"


@pytest.mark.parametrize("engine", ["loop", "vmap"])
def test_padding_slots_are_zero_dummies_not_copies_of_a_record(engine, data):
    """Every engine builds its DP batches with ``private_batch``: the empty slots of a padded
    Poisson batch hold zeros in every entry (x, y, indices), so no record's value reaches them."""
    _, sim = _build("localsgdm", data, 0)
    sim = Simulation(sim.algorithm, data, sim.schedule, BATCH, 0, engine, noise=NoiseSource.reproducible(0))
    seen = []
    make = sim._batch  # noqa: SLF001  (the batches the engine hands its local steps)
    sim._batch = lambda positions, step=-1: seen.append(make(positions, step)) or seen[-1]
    sim.run_round()
    assert seen
    for batch in seen:
        empty = batch["mask"] == 0
        assert empty.any() and (~empty).any()
        for key in ("x", "y", "index", "local_index"):
            assert not batch[key][empty].any(), f"padded slots of {key!r} hold a record's value"
        assert batch["x"][~empty].abs().sum() > 0  # the records themselves are there


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_label_free_stabilizer_keeps_every_batchs_step_within_its_curvature(p):
    """The DP stabilizer reads no label, yet on every batch η·scale·ℓ ≤ 1 for a, b and α (ℓ the
    batch's exact curvature), and it is no smaller than needed: on an all-positive (a) or
    all-negative (b) batch it equals the exact scale."""
    lr, extra = 3.0, 2e-3
    free = auxiliary_scales(None, torch.tensor(p), lr, extra)
    g = torch.Generator().manual_seed(0)
    batches = [
        torch.ones(16),
        torch.zeros(16),
        *((torch.rand(16, generator=g) < q).float() for q in (0.2, 0.7)),
    ]
    for y in batches:
        exact = dict(zip("ab", auxiliary_curvatures(y, torch.tensor(p))))
        for key in "ab":
            assert lr * free[key] * (exact[key] + extra) <= 1 + 1e-6
        assert lr * free["alpha"] * 2 * p * (1 - p) <= 1 + 1e-6
    assert torch.equal(free["a"], auxiliary_scales(torch.ones(16), torch.tensor(p), lr, extra)["a"])
    assert torch.equal(free["b"], auxiliary_scales(torch.zeros(16), torch.tensor(p), lr, extra)["b"])

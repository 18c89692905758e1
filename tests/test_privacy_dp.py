"""Differential privacy at the engine level (issue 23): client-level DP around the collective,
client sampling, the accountant, instance-level DP-SGD."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedxrisk.engines import Simulation
from fedxrisk.engines.privacy import (
    ClientDP,
    ClientSampling,
    NoiseSource,
    PrivateAggregator,
    check_client_dp,
    epsilon,
    instance_private,
    noise_for_epsilon,
)
from fedxrisk.engines.privacy.instance import privatize
from fedxrisk.errors import ConfigError
from fedxrisk.tree import index, leaves
from helpers import make_sim, max_abs_diff, run_all

pytest.importorskip("dp_accounting")


def dp_sim(
    alg: str, engine: str, dp: ClientDP | None = None, instance: tuple | None = None, **kw
) -> Simulation:
    """make_sim's run with client-level DP ``dp`` and/or instance-level DP ``instance`` = (C, σ)."""
    base = make_sim(alg, engine, **kw)
    p = base.algorithm.problem.pos_ratio  # declared public for the test
    algorithm = base.algorithm if instance is None else instance_private(base.algorithm, *instance, p)
    noise = NoiseSource.reproducible(0)  # equal batches and noise on every engine
    return Simulation(
        algorithm, base.data, base.schedule, base.batch_size, base.seed, engine, privacy=dp, noise=noise
    )


class _Algo:
    name = "toy"


def _aggregator(clip: float, sigma: float, k: int, initial: dict, sampling=None, seed: int = 0):
    config = ClientDP(clip, sigma, sampling or ClientSampling())
    return PrivateAggregator(config, _Algo(), initial, seed, k)


# -- clipping -------------------------------------------------------------------


def test_clipping_bounds_every_clients_joint_update_exactly():
    torch.manual_seed(0)
    k, clip = 6, 1.5
    initial = {"w": torch.zeros(5, 3), "alpha": torch.tensor(0.0)}
    scales = torch.tensor([0.01, 0.2, 1.0, 3.0, 10.0, 100.0])  # some below C, some far above
    tree = {"w": torch.randn(k, 5, 3) * scales[:, None, None], "alpha": torch.randn(k) * scales}
    agg = _aggregator(clip, 0.0, k, initial)
    raw = torch.sqrt((tree["w"].double() ** 2).sum((1, 2)) + tree["alpha"].double() ** 2)
    for c in range(k):  # one client at a time, no noise: the answer is its clipped update
        mask = torch.zeros(k, dtype=torch.bool)
        mask[c] = True
        agg.last.clear()
        out = agg.aggregate(tree, mask, 0, 1.0)
        norm = math.sqrt(float((out["w"].double() ** 2).sum() + out["alpha"].double() ** 2))
        assert norm <= clip + 1e-6
        if raw[c] > clip:
            assert norm == pytest.approx(clip, abs=1e-6)
            ratio = out["w"] / tree["w"][c]  # clipping scales, never turns: same factor on every leaf
            assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), rtol=1e-5)
            assert float(out["alpha"] / tree["alpha"][c]) == pytest.approx(
                float(ratio.flatten()[0]), rel=1e-5
            )
        else:
            assert torch.allclose(out["w"], tree["w"][c], atol=1e-7)
    assert torch.allclose(agg.norms.double(), raw[-1:], rtol=1e-6)


def test_update_is_taken_against_the_last_answer():
    k = 3
    agg = _aggregator(10.0, 0.0, k, {"w": torch.ones(4)})
    first = agg.aggregate({"w": torch.full((k, 4), 2.0)}, torch.ones(k, dtype=torch.bool), 0, k)
    assert torch.equal(first["w"], torch.full((4,), 2.0))  # ref 1, updates 1: ‖·‖ = 2 ≤ 10
    agg.aggregate({"w": torch.full((k, 4), 20.0)}, torch.ones(k, dtype=torch.bool), 1, k)
    assert agg.norms.tolist() == pytest.approx([36.0] * k)  # against the answer 2, not against 1
    both = {"w": torch.full((k, 4), 3.0), "stage_average": {"w": torch.full((k, 4), 7.0)}}
    agg.aggregate(both, torch.ones(k, dtype=torch.bool), 2, k)  # a stage end: w and its stage average
    assert torch.equal(agg.last["w"], torch.full((4,), 3.0))
    assert torch.equal(agg.reference("stage_average.w", torch.zeros(4)), agg.last["w"])  # not 7: the global


def test_clipping_in_a_real_round_bounds_every_client():
    clip = 0.05
    sim = dp_sim("codasca", "loop", ClientDP(clip, 0.0), clients=4, rounds=1, lr=1.0)
    sim.run_round()
    assert len(sim.privacy.norms) == 4 and bool((sim.privacy.norms > clip).all())
    start = sim.privacy.initial
    moved = math.sqrt(sum(float(((sim.privacy.last[p] - start[p]) ** 2).sum()) for p in ("w.net.0.weight",)))
    assert moved <= clip + 1e-6  # the mean of updates clipped to C moves no leaf further than C


# -- noise ----------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 4])
def test_noise_has_the_stated_std(m):
    """Updates far above C in known directions: after clipping the signal is known exactly, so the
    residual of the answer must be N(0, (σC/m)²) (KS test); a 10 % wrong σ must be rejected."""
    k, d, clip, sigma = 4, 20_000, 2.0, 0.7
    g = torch.Generator().manual_seed(1)
    direction = torch.randn(k, d, generator=g, dtype=torch.float64)
    direction /= direction.norm(dim=1, keepdim=True)
    tree = {"w": (direction * 1e3).float()}
    mask = torch.zeros(k, dtype=torch.bool)
    mask[:m] = True
    agg = _aggregator(clip, sigma, k, {"w": torch.zeros(d)})
    residuals = []
    for r in range(3):
        agg.last.clear()
        out = agg.aggregate(tree, mask, r, float(m))["w"].double()
        signal = (direction[:m] * clip).sum(0) / m
        residuals.append((out - signal).numpy())
    z = np.concatenate(residuals)
    std = sigma * clip / m
    # the noise is secret (fresh each run): accept at 1e-6 so the test fails by chance once in a
    # million runs; a 10 % wrong σ gives p ≈ 1e-40 over these 60,000 draws
    assert stats.kstest(z / std, "norm").pvalue > 1e-6
    assert stats.kstest(z / (1.1 * std), "norm").pvalue < 1e-12
    assert abs(z.std() / std - 1) < 0.02


def test_noise_depends_on_seed_and_round_only():
    agg = _aggregator(1.0, 1.0, 2, {"w": torch.zeros(3)})
    a, b = agg.noise(3, [("w", torch.Size([50]))]), agg.noise(3, [("w", torch.Size([50]))])
    assert torch.equal(a["w"], b["w"])
    assert not torch.equal(a["w"], agg.noise(4, [("w", torch.Size([50]))])["w"])


# -- engines agree --------------------------------------------------------------


@pytest.mark.parametrize("alg", ["localsgdm", "codasca"])
@pytest.mark.parametrize("sampling", [ClientSampling(), ClientSampling(0.5), ClientSampling(0.5, "fixed")])
def test_loop_and_vmap_agree_with_client_dp(alg, sampling):
    dp = ClientDP(0.5, 0.8, sampling, noise_seed=3)  # the reproducible test mode: same noise in both
    kw = dict(clients=4, rounds=4, stages=2, partition="class")
    loop, vmap = run_all(dp_sim(alg, "loop", dp, **kw)), run_all(dp_sim(alg, "vmap", dp, **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    plain = run_all(make_sim(alg, "loop", **kw))
    assert max_abs_diff(loop.states["w"], plain.states["w"]) > 1e-3  # the noise is really there


def test_without_noise_and_clipping_dp_is_the_plain_algorithm():
    dp = ClientDP(1e9, 0.0)
    kw = dict(clients=3, rounds=3, stages=2)
    for alg in ("localsgdm", "codasca", "localscgdam"):
        a, b = run_all(dp_sim(alg, "loop", dp, **kw)), run_all(make_sim(alg, "loop", **kw))
        assert max_abs_diff(a.states, b.states) < 1e-5


def test_aucm_alpha_stays_in_its_domain_after_noise():
    dp = ClientDP(0.1, 50.0)  # noise far larger than α
    sim = run_all(dp_sim("codaplus", "loop", dp, clients=3, rounds=4, options={"form": "code"}))
    assert bool((sim.states["alpha"] >= 0).all())


# -- refusals -------------------------------------------------------------------


@pytest.mark.parametrize(
    "alg, words",
    [("fedxl1", "pool"), ("fedxl2", "pool"), ("coda", "class sums"), ("localsgdm_rl", "class sums")],
)
def test_client_dp_refuses_what_it_cannot_cover_in_one_line(alg, words):
    with pytest.raises(ConfigError) as e:
        dp_sim(
            alg,
            "loop",
            ClientDP(1.0, 1.0),
            clients=2,
            stages=2,
            options={"positives_per_batch": 4} if "fedxl" in alg else {},
        )
    message = str(e.value)
    assert "\n" not in message and alg in message and words in message


def test_private_collective_refuses_gather_and_a_second_mean():
    sim = dp_sim("localsgdm", "loop", ClientDP(1.0, 1.0), clients=2)
    comm = sim._collective()
    with pytest.raises(ConfigError, match="localsgdm uses the collective 'gather'"):
        comm.gather({"w": torch.zeros(2, 3)})
    comm.mean({"w": torch.zeros(2, 3)})
    with pytest.raises(ConfigError, match="second one"):
        comm.mean({"w": torch.zeros(2, 3)})


def test_client_dp_refuses_local_batchnorm_statistics():
    sim = make_sim("localsgdm", "loop", clients=2, model="cnn", buffer_policy="local")
    with pytest.raises(ConfigError, match="buffer_policy 'local'"):
        check_client_dp(sim.algorithm)


@pytest.mark.parametrize(
    "alg, words",
    [
        ("fedxl1", "pairwise"),
        ("localpair", "pairwise"),
        ("localscgdam", "compositional"),
        ("fcsg", "conditional"),
        ("local_scgdm", "compositional"),
        ("coda", "class sums"),
    ],
)
def test_instance_dp_refuses_coupled_losses_in_one_line(alg, words):
    base = make_sim(
        alg,
        "loop",
        clients=2,
        stages=2,
        options={"positives_per_batch": 4} if alg in ("fedxl1", "localpair") else {},
    )
    with pytest.raises(ConfigError) as e:
        instance_private(base.algorithm, 1.0, 1.0)
    assert "\n" not in str(e.value) and alg in str(e.value) and words in str(e.value)


def test_instance_dp_refuses_batch_ratio_and_batchnorm():
    with pytest.raises(ConfigError, match="pos_ratio_mode 'batch'"):
        instance_private(make_sim("codasca", clients=2, pos_ratio_mode="batch").algorithm, 1.0, 1.0)
    with pytest.raises(ConfigError, match="BatchNorm"):
        instance_private(make_sim("localsgdm", clients=2, model="cnn").algorithm, 1.0, 1.0)


# -- accountant -----------------------------------------------------------------


def test_epsilon_without_sampling_equals_the_hand_computed_gaussian_rdp():
    """q = 1: RDP of T Gaussian releases at order a is T·a/(2σ²); ε by the conversion of
    Balle et al. 2020 (Prop. 12) minimised over the library's orders."""
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    for sigma, steps, delta in [(1.0, 10, 1e-5), (4.0, 200, 1e-6), (0.8, 1, 1e-3)]:
        best = min(
            steps * a / (2 * sigma**2) + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
            for a in DEFAULT_RDP_ORDERS
            if a > 1.01
        )
        assert epsilon(sigma, steps, delta) == pytest.approx(max(best, 0.0), rel=1e-9)


def test_epsilon_with_poisson_sampling_equals_the_librarys_own_computation():
    import dp_accounting

    for q, sigma, steps, delta in [(0.1, 1.1, 100, 1e-5), (0.01, 0.8, 1000, 1e-6)]:
        accountant = dp_accounting.rdp.RdpAccountant()
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
        assert epsilon(sigma, steps, delta, q) == pytest.approx(accountant.get_epsilon(delta), rel=1e-9)
    assert epsilon(1.0, 50, 1e-5, q=0.1) < epsilon(1.0, 50, 1e-5)  # amplification by sampling
    assert epsilon(0.0, 5, 1e-5) == math.inf


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_noise_for_epsilon_is_the_smallest_sigma_reaching_the_target():
    for target in (1.0, 8.0):
        sigma = noise_for_epsilon(target, 100, 1e-5, q=0.2)
        assert target - 0.01 <= epsilon(sigma, 100, 1e-5, q=0.2) <= target
        assert epsilon(sigma * 0.98, 100, 1e-5, q=0.2) > target
    with pytest.raises(ConfigError, match="target_epsilon"):
        noise_for_epsilon(0.0, 10, 1e-5)


# -- sampling -------------------------------------------------------------------


def test_sampled_sets_follow_seed_and_round_and_the_expected_fraction():
    poisson, fixed = ClientSampling(0.3), ClientSampling(0.3, "fixed")
    assert torch.equal(poisson.mask(7, 5, 100), poisson.mask(7, 5, 100))
    assert not torch.equal(poisson.mask(7, 5, 100), poisson.mask(7, 6, 100))
    assert not torch.equal(poisson.mask(7, 5, 100), poisson.mask(8, 5, 100))
    counts = torch.stack([poisson.mask(0, r, 100) for r in range(200)]).sum(1).double()
    assert abs(float(counts.mean()) - 30.0) < 4 * math.sqrt(100 * 0.3 * 0.7 / 200)  # 4 standard errors
    assert float(counts.std()) == pytest.approx(math.sqrt(100 * 0.3 * 0.7), rel=0.2)
    assert {int(fixed.mask(0, r, 100).sum()) for r in range(20)} == {30}
    with pytest.raises(ConfigError, match="rate"):
        ClientSampling(0.0)


def test_idle_clients_take_no_step_and_keep_their_control_variate():
    dp = ClientDP(1e9, 0.0, ClientSampling(0.5, "fixed"), noise_seed=5)
    sim = dp_sim("scaffold", "loop", dp, clients=4, rounds=3)
    sim.run_round()
    loss_after_first, c_local = sim.states["loss"].clone(), sim.states["c_local"]["net.0.weight"].clone()
    sim.run_round()
    idle = ~sim._participants
    assert idle.sum() == 2
    expected = dp.sampling.mask(5, 1, 4)
    assert torch.equal(sim._participants, expected)
    assert torch.equal(sim.states["loss"][idle], loss_after_first[idle])  # no step taken
    assert torch.equal(sim.states["c_local"]["net.0.weight"][idle], c_local[idle])
    w = sim.states["w"]["net.0.weight"]
    assert torch.equal(w[idle], w[~idle])  # the broadcast reached everyone


def test_resume_continues_with_the_same_references():
    dp = ClientDP(0.3, 0.5, ClientSampling(0.5), noise_seed=1)  # test mode: a resume redraws secret noise
    full = run_all(dp_sim("codasca", "loop", dp, clients=4, rounds=4))
    part = dp_sim("codasca", "loop", dp, clients=4, rounds=4)
    part.run_round(), part.run_round()
    state = part.state_dict()
    resumed = dp_sim("codasca", "loop", dp, clients=4, rounds=4)
    resumed.load_state_dict(state)
    run_all(resumed)
    assert max_abs_diff(full.states, resumed.states) == 0.0


# -- instance-level DP-SGD --------------------------------------------------------


def test_per_sample_clipping_masking_and_noise():
    per_sample = {
        "w": torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 10.0], [7.0, 7.0]]),
        "alpha": torch.zeros(4),
    }
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])  # the last slot is padding
    out = privatize(per_sample, mask, torch.zeros(3, dtype=torch.float64), 3.0, 1.0, 5.0)
    assert torch.allclose(out["w"], torch.tensor([0.6 + 0.3, 0.8 + 0.4 + 1.0]) / 3)
    z = NoiseSource.reproducible(1).spawn(0).standard_normal(200_000)
    noisy = privatize({"w": torch.zeros(1, 200_000)}, torch.ones(1), torch.from_numpy(z), 4.0, 2.0, 0.5)
    assert torch.allclose(noisy["w"].double(), torch.from_numpy(z) * 0.5 * 2.0 / 4.0)


@pytest.mark.parametrize("alg", ["localsgdm", "codaplus", "codasca"])
def test_instance_dp_without_noise_or_clipping_is_the_plain_algorithm(alg):
    """With B ≥ every shard, q = 1: every record in every batch, the denominator n_k, as full-batch steps."""
    kw = dict(clients=3, rounds=3, stages=2, batch_size=300)  # the shards: 300 records each
    plain = run_all(make_sim(alg, "loop", **kw))
    private = run_all(dp_sim(alg, "loop", instance=(1e9, 0.0), **kw))
    assert max_abs_diff(plain.states["w"], private.states["w"]) < 1e-5


@pytest.mark.parametrize("alg", ["localsgdm", "codasca"])
def test_loop_and_vmap_agree_with_instance_and_client_dp(alg):
    kw = dict(clients=3, rounds=3, stages=2, instance=(0.5, 1.0))
    dp = ClientDP(1.0, 0.3, ClientSampling(0.67, "fixed"), noise_seed=2)
    loop, vmap = run_all(dp_sim(alg, "loop", dp, **kw)), run_all(dp_sim(alg, "vmap", dp, **kw))
    assert max_abs_diff(loop.states, vmap.states) < 1e-5
    assert all(torch.isfinite(t).all() for _, t in leaves(index(loop.states, 0)))


@pytest.mark.parametrize(  # binary data: the survival algorithms' client DP is test_survival_cli's
    "alg",
    sorted(
        n
        for n, c in __import__("fedxrisk.algorithms", fromlist=["x"]).ALGORITHMS.items()
        if c.task == "binary"
    ),
)
def test_every_algorithm_runs_finite_under_client_dp_or_is_refused(alg):
    from fedxrisk.engines.privacy import unsupported_reason

    options = {"positives_per_batch": 4} if alg in ("fedxl1", "fedxl2", "localpair") else {}
    dp = ClientDP(1.0, 0.5, ClientSampling(0.67, "fixed"))
    base = make_sim(alg, "loop", clients=3, rounds=2, stages=2, lr=0.05, options=options)
    if unsupported_reason(base.algorithm) is not None:
        with pytest.raises(ConfigError):
            Simulation(base.algorithm, base.data, base.schedule, 8, 0, "loop", privacy=dp)
        return
    sim = run_all(Simulation(base.algorithm, base.data, base.schedule, 8, 0, "loop", privacy=dp))
    assert all(bool(torch.isfinite(t).all()) for _, t in leaves(sim.states) if t.is_floating_point())

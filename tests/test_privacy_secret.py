"""Client-level DP noise cannot be regenerated from a run's outputs (issue 30 item 1): attacks
with everything a run folder holds, the test mode's "not private" marks, and tune-style runs
differing only in the step size (their difference must not be noise-free)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedxrisk.engines.privacy import PrivateAggregator
from fedxrisk.engines.privacy.collective import NOISE_STREAM
from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.run.build import build
from fedxrisk.run.configfile import load_config
from fedxrisk.run.folder import load_checkpoint
from fedxrisk.run.recipes import run_experiment

pytest.importorskip("dp_accounting")
CLIP, SIGMA, K = 0.5, 1.0, 4


def cfg_with(*privacy: str, lr: float | None = None):
    sets = [
        "experiment.rounds=1", "data.clients=4", "experiment.eval_every=1", "experiment.tensorboard=false",
        "experiment.checkpoint_every=1", "algorithm.algorithm=localsgdm", "engine.engine=loop",
        f"privacy.clip={CLIP}", f"privacy.noise_multiplier={SIGMA}", *(f"privacy.{p}" for p in privacy),
        *([f"algorithm.lr={lr}"] if lr is not None else []),
    ]  # fmt: skip
    return load_config(None, sets)


@pytest.fixture
def spy(monkeypatch):
    """What the server sums in clear, round by round (the truth an attacker wants)."""
    sums: list[dict[str, torch.Tensor]] = []
    original = PrivateAggregator.clipped_sum

    def clipped_sum(self, tree, mask):
        out = original(self, tree, mask)
        sums.append({p: t.detach().clone() for p, t in out.items()})
        return out

    monkeypatch.setattr(PrivateAggregator, "clipped_sum", clipped_sum)
    return sums


def _integers(value) -> set[int]:
    """Every integer in a JSON/TOML-like tree (seeds, noise seeds, counts...)."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value} if value >= 0 else set()
    if isinstance(value, dict):
        return set().union(*(_integers(v) for v in value.values())) if value else set()
    if isinstance(value, (list, tuple)):
        return set().union(*(_integers(v) for v in value)) if value else set()
    return set()


def _candidate_noises(seed: int, shapes: dict[str, torch.Size]) -> list[dict[str, torch.Tensor]]:
    """The round-0 noise as main drew it (NumPy stream of (seed, round, tag), leaves in order) and as
    the test mode draws it, for one candidate seed."""
    old = np.random.default_rng(np.random.SeedSequence([seed, 0, NOISE_STREAM]))
    first = {p: torch.from_numpy(old.standard_normal(tuple(s))) for p, s in shapes.items()}
    source = NoiseSource.reproducible(seed).spawn(0, NOISE_STREAM)
    second = {p: source.gaussian(s, 1.0, dtype=torch.float64) for p, s in shapes.items()}
    return [first, second]


def attack(run: Path) -> float:
    """Recover round 0's clipped sum of the weights from everything in ``run``; the smallest error
    over every candidate seed, relative to the norm of the noise σC·z that hides the sum."""
    cfg = load_config(run / "config.toml")
    summary = json.loads((run / "summary.json").read_text())
    final = load_checkpoint(run / "final_state.pt")
    model = torch.load(run / "model.pt", weights_only=False)["params"]
    leaves = final["simulation"]["privacy"]["last"]  # the leaves of the round's mean, in order
    shapes = {p: t.shape for p, t in leaves.items()}
    start = build(cfg).simulation.privacy.initial  # the initial model: public (config + seed)
    seeds = {cfg.seed} | _integers(summary) | _integers(final["config"]) | _integers(cfg.privacy or {})
    seeds = {s for s in seeds if s < 2**63}
    released = {p: model[p[2:]].double() for p in shapes if p.startswith("w.")}
    best = float("inf")
    for seed in sorted(seeds):
        for z in _candidate_noises(seed, shapes):
            guess = {p: (released[p] - start[p].double()) * K - SIGMA * CLIP * z[p] for p in released}
            best = min(best, _error(guess))
    return best


def _error(guess: dict[str, torch.Tensor]) -> float:
    truth = _TRUTH[0]
    diff = sum(float(((guess[p] - truth[p]) ** 2).sum()) for p in guess) ** 0.5
    scale = SIGMA * CLIP * sum(truth[p].numel() for p in guess) ** 0.5  # ‖σC·z‖ ≈ σC·√d
    return diff / scale


_TRUTH: list[dict[str, torch.Tensor]] = []


def test_the_noise_of_a_default_run_cannot_be_regenerated_from_its_folder(tmp_path, spy):
    run_experiment(cfg_with(), tmp_path / "run")
    _TRUTH[:] = [spy[0]]
    # the sum is hidden by the whole noise: error ≈ ‖z‖ (float32 rounding would leave 1e-6)
    assert attack(tmp_path / "run") > 0.5
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["privacy"]["private"] is True and summary["privacy"]["noise"] == "secret"


def test_the_attack_works_on_the_test_mode_which_says_so(tmp_path, spy, capfd):
    run_experiment(cfg_with("reproducible_noise=3"), tmp_path / "run")
    _TRUTH[:] = [spy[0]]
    assert attack(tmp_path / "run") < 1e-5  # the attack is real: reproducible noise is undone
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["privacy"]["private"] is False and "NOT PRIVATE" in summary["privacy"]["noise"]
    assert "NOT PRIVATE" in capfd.readouterr().err
    assert "reproducible_noise = 3" in (tmp_path / "run" / "config.toml").read_text()


def test_runs_differing_only_in_lr_add_different_noise(spy):
    """Two tune trials: their released difference minus the difference of their clipped sums is the
    difference of their noises — identical noise would make it 0 (a noise-free difference)."""
    released = []
    for lr in (0.05, 0.1):
        sim = build(cfg_with(lr=lr)).simulation
        sim.run_round()
        released.append({p: t.double() for p, t in sim.privacy.last.items() if p.startswith("w.")})
    a, b = spy
    residual = [((released[0][p] - released[1][p]) * K - (a[p] - b[p])) / (SIGMA * CLIP) for p in released[0]]
    z = torch.cat([r.flatten() for r in residual])
    assert float(z.std()) == pytest.approx(2**0.5, rel=0.1)  # two independent N(0, 1) noises


def test_a_resumed_default_run_draws_fresh_noise(spy):
    """Resuming rebuilds the aggregator: a new secret, so round 0 would not be redrawn identically."""
    first, second = (build(cfg_with()).simulation for _ in range(2))
    first.run_round(), second.run_round()
    w = [p for p in first.privacy.last if p.startswith("w.")]
    assert all(torch.equal(spy[0][p], spy[1][p]) for p in w)  # same data, same clipped sum
    assert not any(torch.equal(first.privacy.last[p], second.privacy.last[p]) for p in w)


def test_the_old_noise_seed_key_is_refused_in_one_line():
    from fedxrisk.errors import ConfigError

    with pytest.raises(ConfigError, match="reproducible_noise") as e:
        cfg_with("noise_seed=3")
    assert "\n" not in str(e.value)
    assert cfg_with("noise_seed='none'").privacy["reproducible_noise"] is None  # old folders' config.toml

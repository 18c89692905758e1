"""Issue 40 item 4: the default federated evaluation releases no patient, attacked.

The attacker knows the model, every test patient but one, and that patient's features and label;
it sees what the server receives. It guesses whether the patient is in the test set (the add/remove
relation the release is accounted under, sensitivity 1) from the one histogram count the patient
would move — the likelihood-ratio test, the best there is against Gaussian noise. Against the
default private evaluation its guesses must satisfy the (ε, δ) bound TPR ≤ e^ε·FPR + δ and match
the noise the release promises (accuracy Φ(1/2σ)); against the exact mode (the control) it is
always right. On Flower (in process, the real ClientApp): the server's sum holds no exact count,
two evaluations of one model release different numbers, and without SecAgg+ every site's own
histogram arrives with the whole σ.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")
pytest.importorskip("dp_accounting")

from fedxrisk.flower.app import client_app  # noqa: E402
from fedxrisk.flower.config import FlowerConfig  # noqa: E402
from fedxrisk.flower.evaluate import DEFAULT_DP, DP_UNITS, OP, fixed_point, site_evaluate  # noqa: E402
from fedxrisk.flower.evaluate_app import run_on_grid  # noqa: E402
from fedxrisk.flower.wire import Packet  # noqa: E402
from fedxrisk.stats import logit_edges  # noqa: E402
from fedxrisk.stats.dp_eval import DP_BINS, DP_LIMIT, noise_sigma  # noqa: E402
from fedxrisk.stats.federated import bin_index, simulate  # noqa: E402
from flower_grid import InProcessGrid  # noqa: E402
from test_flower_evaluate import _scores, federation  # noqa: E402,F401

TRIALS = 300


def _site(tmp_path, x, y, name):
    folder = tmp_path / name
    folder.mkdir()
    np.savez(folder / "test.npz", x=x, y=y)
    return {"data-dir": str(folder)}


def _release(node, rc, state, sigma):
    """One site's reply to the private evaluation's histogram request, in clear (no SecAgg+)."""
    cfg = FlowerConfig.from_run_config(rc)
    _, step, limb = fixed_point(cfg, 2)
    config = {"op": OP, "models": 1, "bins": DP_BINS, "limit": DP_LIMIT, "secure": False, "step": step,
              "limb": limb, "dp_sigma": sigma, "units": DP_UNITS, "stage": "histograms"}  # fmt: skip
    reply = site_evaluate(node, rc, Packet(config=config, arrays={"model0": state}))
    assert not reply.error, reply.error
    return reply.arrays[OP]["counts"].numpy()[0]


@pytest.mark.slow
def test_an_attacker_knowing_all_but_one_patient_stays_within_epsilon(federation, tmp_path):  # noqa: F811
    rc, _, data, _, (state, _), cfg = federation
    x, y = data[0]
    target = int(np.flatnonzero(y == 1)[0])
    with_it = _site(tmp_path, x, y, "with")
    without = _site(tmp_path, np.delete(x, target, 0), np.delete(y, target), "without")
    score = _scores(cfg, state, x[target : target + 1])
    cell = (1, int(bin_index(score, logit_edges(DP_BINS, DP_LIMIT))[0]))  # the count the patient moves
    others = simulate([(np.delete(y, target).astype(bool), [np.delete(_scores(cfg, state, x), target)])],
                      logit_edges(DP_BINS, DP_LIMIT))[0][0]  # fmt: skip  # what the attacker knows

    def guesses(node, sigma):  # the likelihood-ratio test: "in" when the residual exceeds 1/2
        return np.array([_release(node, rc, state, sigma)[cell] - others[cell] > 0.5 for _ in range(TRIALS)])

    epsilon, delta = DEFAULT_DP
    sigma = noise_sigma(epsilon, delta)
    tpr, fpr = guesses(with_it, sigma).mean(), guesses(without, sigma).mean()
    slack = 3 * math.sqrt(0.25 / TRIALS)  # three binomial standard errors
    assert tpr <= math.exp(epsilon) * fpr + delta + 2 * slack
    promised = 0.5 * (1 + math.erf(1 / (2 * sigma) / math.sqrt(2)))  # Φ(1/2σ): the noise's own spread
    assert abs((tpr + 1 - fpr) / 2 - promised) < slack
    # the control, the exact mode's release (no noise): the attacker is always right
    assert guesses(with_it, 0.0)[:20].all() and not guesses(without, 0.0)[:20].any()


@pytest.mark.parametrize("secure", [True, False])
def test_the_server_receives_no_exact_count_and_two_evaluations_differ(federation, secure):  # noqa: F811
    rc, nodes, data, paths, states, cfg = federation
    rc = {**rc, "secure-aggregation": secure}
    grid = InProcessGrid(client_app, rc, nodes)
    first = run_on_grid(grid, FlowerConfig.from_run_config(rc), paths[:1])
    second = run_on_grid(InProcessGrid(client_app, rc, nodes), FlowerConfig.from_run_config(rc), paths[:1])
    assert first["mode"] == "private" and first["noise_added_by"] == "sites"
    true, _ = simulate(
        [(y.astype(bool), [_scores(cfg, states[0], x)]) for x, y in data], logit_edges(DP_BINS, DP_LIMIT)
    )
    released = np.asarray(first["totals"])[:, :-1]
    assert np.isclose(released, np.rint(released), atol=1e-3).mean() < 0.02  # no exact counts (chance: 0.2 %)
    assert not np.array_equal(released, np.asarray(second["totals"])[:, :-1])  # fresh secret noise
    sigma = noise_sigma(*DEFAULT_DP) * (1 if secure else math.sqrt(len(nodes)))
    assert first["sigma"] == pytest.approx(sigma)
    assert (released - true[0][:, :-1]).std() == pytest.approx(sigma, rel=0.15)  # in every cell
    if secure:
        return
    # without SecAgg+ each site's own histogram reaches the server: each carries the whole σ
    per_site = [r for r in grid.replies if r.metadata.message_type == f"query.{OP}"]
    assert len(per_site) == len(nodes)
    from fedxrisk.flower.app import from_records

    own = {n: simulate([(y.astype(bool), [_scores(cfg, states[0], x)])], logit_edges(DP_BINS, DP_LIMIT))[0][0]
           for n, (x, y) in zip(nodes, data)}  # fmt: skip
    for reply in per_site:
        counts = from_records(reply.content).arrays[OP]["counts"].numpy()[0][:, :-1]
        residual = counts - own[reply.metadata.src_node_id][:, :-1]
        assert residual.std() == pytest.approx(noise_sigma(*DEFAULT_DP), rel=0.2)
        assert np.isclose(counts, np.rint(counts), atol=1e-3).mean() < 0.02

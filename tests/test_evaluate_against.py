"""``fedxrisk evaluate RUN_A --against RUN_B``, operating points and calibration (issue 32)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fedxrisk
from fedxrisk.cli import main
from fedxrisk.evaluation.clinic import (
    calibration_report,
    fit_temperature,
    operating_points,
    sensitivity_at,
    specificity_at,
)
from fedxrisk.experiment import RunConfig, build_data, load_model, run_experiment
from fedxrisk.stats import delong_paired
from test_evaluate_federated import runs  # noqa: F401  (the module fixture: two runs on four sites)


def _scores(run) -> tuple[np.ndarray, np.ndarray]:
    import json

    cfg = RunConfig(**json.loads((run / "summary.json").read_text())["config"])
    fed, _ = build_data(cfg)
    with torch.no_grad():
        s = load_model(run)(fed.data.x_test).reshape(-1).numpy().astype(np.float64)
    return fed.data.y_test.numpy().reshape(-1).astype(bool), s


def test_against_is_the_paired_delong_test_of_both_models_scores(runs, tmp_path):  # noqa: F811
    result = fedxrisk.evaluate(runs / "codasca", against=runs / "localsgdm", bootstrap=200, out=tmp_path)
    y, sa = _scores(runs / "codasca")
    _, sb = _scores(runs / "localsgdm")
    expected = delong_paired(y, sa, sb)
    got = result["against"]["labels"]["score"]["auroc"]
    assert got["difference"] == pytest.approx(expected.difference, abs=1e-12)
    assert got["p_value"] == pytest.approx(expected.p_value, abs=1e-12)
    ap = result["against"]["labels"]["score"]["ap"]
    assert ap["low"] <= ap["difference"] <= ap["high"] and 0 < ap["p_value"] <= 1
    fed = result["federated"]["labels"]["score"]["paired"]
    assert fed["exact"]["p_value"] == pytest.approx(expected.p_value, abs=1e-12)
    assert fed["federated"]["p_low"] <= expected.p_value <= fed["federated"]["p_high"]
    assert "## Against" in (tmp_path / "evaluation.md").read_text()


def test_against_a_run_tested_on_other_patients_is_refused_in_one_line(runs, tmp_path):  # noqa: F811
    other = tmp_path / "other"  # the same training, tested on a thinned test set (other patients)
    config = json.loads((runs / "localsgdm" / "summary.json").read_text())["config"]
    run_experiment(RunConfig(**{**config, "test_imratio": 0.2}), other)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["evaluate", str(runs / "codasca"), "--against", str(other), "--out", str(out)]
    )
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "same patients" in lines[0], res.output
    assert not out.exists()


def _brute(y, s, kind, target):
    best = 0.0
    for c in np.unique(s):
        sens, spec = np.mean(s[y] >= c), np.mean(s[~y] < c)
        if kind == "sensitivity" and spec >= target:
            best = max(best, sens)
        if kind == "specificity" and sens >= target:
            best = max(best, spec)
    return best


@pytest.mark.parametrize("target", [0.5, 0.8, 0.9, 0.95])
def test_operating_points_equal_brute_force(target):
    rng = np.random.default_rng(1)
    y = rng.random(150) < 0.3
    s = np.round(rng.normal(size=150) + y, 1)  # ties
    one = np.ones((1, 150))
    assert sensitivity_at(y, s, one, target)[0] == pytest.approx(
        _brute(y, s, "sensitivity", target), abs=1e-12
    )
    assert specificity_at(y, s, one, target)[0] == pytest.approx(
        _brute(y, s, "specificity", target), abs=1e-12
    )
    out = operating_points(y, s, target, target, 200, 0)
    sens = out["sensitivity_at"]
    assert sens["ci"][0] <= sens["value"] <= sens["ci"][1] and sens["ci"][1] > sens["ci"][0]
    c = sens["threshold"]
    assert np.mean(s[~y] < c) >= target and np.mean(s[y] >= c) == pytest.approx(sens["value"])


def test_calibration_numbers_and_which_outputs_are_probabilities():
    rng = np.random.default_rng(2)
    z = rng.normal(size=400) * 2
    y = (rng.random(400) < 1 / (1 + np.exp(-z / 3))).astype(float)  # true temperature 3
    cal = calibration_report(y, z, (y, z), "localsgdm")
    p = 1 / (1 + np.exp(-z))
    assert cal["brier"] == pytest.approx(np.mean((p - y) ** 2), abs=1e-12)
    bins = np.minimum((p * 10).astype(int), 9)
    ece = sum(np.mean(bins == b) * abs(y[bins == b].mean() - p[bins == b].mean()) for b in np.unique(bins))
    assert cal["ece"] == pytest.approx(ece, abs=1e-12)
    assert (
        cal["probabilities"] is True and calibration_report(y, z, None, "codasca")["probabilities"] is False
    )
    t = cal["temperature"]

    def nll(t_):
        q = 1 / (1 + np.exp(-z / t_))
        return -np.mean(y * np.log(q) + (1 - y) * np.log(1 - q))

    assert nll(t) <= min(nll(t * 0.98), nll(t * 1.02)) and 2 < t < 4.5
    assert cal["ece_scaled"] < cal["ece"] and cal["brier_scaled"] < cal["brier"]
    assert fit_temperature(y, 5 * z) == pytest.approx(5 * t, rel=1e-5)


def test_cli_at_specificity_and_calibration(runs, tmp_path):  # noqa: F811
    out = tmp_path / "ev"
    res = CliRunner().invoke(
        main,
        ["evaluate", str(runs / "localsgdm"), "--at-specificity", "0.9", "--calibration", "--bootstrap", "50",
         "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "at specificity ≥ 0.9" in res.output and "σ(logit) estimates the risk" in res.output
    assert (out / "reliability.png").stat().st_size > 1000
    text = (out / "evaluation.md").read_text()
    assert "temperature scaling on the validation data" in text
    bad = CliRunner().invoke(
        main, ["evaluate", str(runs / "localsgdm"), "--at-specificity", "1.5", "--out", str(tmp_path / "x")]
    )
    assert bad.exit_code == 2 and "--at-specificity must lie strictly between 0 and 1" in bad.output


def test_against_on_a_dataset_scores_both_models_on_its_rows(runs, tmp_path):  # noqa: F811
    data_dir = str(runs / "data")
    result = fedxrisk.evaluate(runs / "codasca", against=runs / "localsgdm", dataset="tabular", data_dir=data_dir,
                               bootstrap=50, out=tmp_path)  # fmt: skip
    y, sa = _scores(runs / "codasca")  # the same file and split: the same rows
    _, sb = _scores(runs / "localsgdm")
    got = result["against"]["labels"]["score"]["auroc"]
    assert got["p_value"] == pytest.approx(delong_paired(y, sa, sb).p_value, abs=1e-12)
    bad = CliRunner().invoke(main, ["evaluate", str(runs / "codasca"), "--against", str(runs / "localsgdm"),
                                    "--manifest", str(tmp_path / "m.csv"), "--out", str(tmp_path / "x")])  # fmt: skip
    assert bad.exit_code == 2 and "not a --manifest" in bad.output


def test_a_threshold_chosen_on_validation_is_applied_to_the_test_patients():
    rng = np.random.default_rng(5)
    vy, ty = rng.random(300) < 0.3, rng.random(400) < 0.3
    vs, ts = rng.normal(size=300) + 1.2 * vy, rng.normal(size=400) + 1.2 * ty
    out = operating_points(ty, ts, 0.9, None, 200, 0, validation=(vy, vs))["sensitivity_at"]
    c = out["threshold"]
    feasible = [t for t in np.unique(vs) if np.mean(vs[~vy] < t) >= 0.9]  # brute force over thresholds
    assert np.mean(vs[~vy] < c) >= 0.9 and np.mean(vs[vy] >= c) == max(np.mean(vs[vy] >= t) for t in feasible)
    assert out["chosen_on"] == "validation"
    assert out["value"] == pytest.approx(np.mean(ts[ty] >= c), abs=1e-12)  # the test's, at c
    assert out["achieved"]["specificity"] == pytest.approx(np.mean(ts[~ty] < c), abs=1e-12)
    assert out["validation_value"] == pytest.approx(np.mean(vs[vy] >= c), abs=1e-12)
    lo, hi = out["achieved"]["specificity_ci"]
    assert lo <= out["achieved"]["specificity"] <= hi and hi > lo
    in_sample = operating_points(ty, ts, 0.9, None, 200, 0)["sensitivity_at"]
    assert in_sample["chosen_on"] == "test (in-sample)" and in_sample["threshold"] != c


def test_cli_threshold_from_validation(runs, tmp_path):  # noqa: F811
    out = tmp_path / "ev"
    args = ["evaluate", str(runs / "localsgdm"), "--at-specificity", "0.8", "--threshold-from", "validation",
            "--bootstrap", "50", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "threshold chosen on the validation data" in res.output
    op = json.loads((out / "evaluation.json").read_text())["operating_points"]["score"]["sensitivity_at"]
    cfg = RunConfig(**json.loads((runs / "localsgdm" / "summary.json").read_text())["config"])
    fed, _ = build_data(cfg)
    with torch.no_grad():
        vs = load_model(runs / "localsgdm")(fed.data.x_val).reshape(-1).numpy().astype(np.float64)
    vy = fed.data.y_val.numpy().reshape(-1).astype(bool)
    from fedxrisk.evaluation.clinic import _threshold

    assert op["threshold"] == pytest.approx(_threshold(vy, vs, "sensitivity", 0.8), rel=1e-6)
    y, s = _scores(runs / "localsgdm")
    assert op["value"] == pytest.approx(np.mean(s[y] >= op["threshold"]), abs=1e-9)


def test_threshold_from_validation_without_validation_data_is_one_line(tmp_path):
    run = tmp_path / "run"
    run_experiment(RunConfig(algorithm="localsgdm", rounds=1, stages=1, clients=2, tensorboard=False), run)
    res = CliRunner().invoke(
        main,
        [
            "evaluate",
            str(run),
            "--at-specificity",
            "0.9",
            "--threshold-from",
            "validation",
            "--out",
            str(tmp_path / "e"),
        ],
    )
    assert res.exit_code == 2 and "has no validation data (train with data.validation)" in res.output, (
        res.output
    )
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "e").exists()

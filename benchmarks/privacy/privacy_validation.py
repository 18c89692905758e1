"""Validation under DP: what the released histograms cost in ε and what their noise does to the AUROC.

Three measurements behind the defaults of ``privacy.validation_noise_multiplier`` (z) and
``privacy.validation_bins`` (docs/privacy.md, "Validation under DP"):

1. **ε share**: ε of a run's training alone and with one Gaussian(z) release per evaluation, for the
   plans of benchmarks/privacy/privacy_utility.py (heart disease: K = 4, q = 1, 50 rounds; campaign: K = 32,
   q = 0.25, 40 rounds; evaluations every 5 rounds) at ε = 1, 3, 8 and an instance-level plan.
2. **bins**: the released AUROC's mean |error| against the exact one (binormal logits, AUROC 0.76,
   20 % positives) over 40 noise draws, instance level at the default z, for 8 … 128 bins and
   validation sets of 250 … 20,000 records; ρ is the expected share of the distance from ½ kept.
3. **heart disease's sites**: a CE FedAvg model (20 rounds, no DP) scored on 20 % of each hospital's
   training shard held out as validation; the released AUROC at instance level (every site's records
   summed) and at client level (each site's histogram scaled to the fixed mass), 40 noise draws each.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/privacy/privacy_validation.py ../shared/data   # ≈ 1 min

Writes benchmarks/results/privacy_validation.json and privacy_validation.md.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "results"
NAME = "privacy_validation"
ZS = (5.0, 10.0, 20.0)
BINS = (8, 16, 32, 64, 128)
SIZES = (250, 1000, 5000, 20000)
DRAWS = 40
DELTA = 1e-5


def epsilon_share() -> list[dict[str, Any]]:
    from fedxrisk.engines.privacy.accountant import Segment, ledger_epsilon, noise_for_epsilon

    plans = [
        ("heart disease, client, K = 4, q = 1, 50 rounds", 1.0, 50, 1, None),
        ("campaign, client, K = 32, q = 0.25, 40 rounds", 0.25, 40, 1, None),
        ("instance, q = 0.1, 50 rounds × 8 steps", 0.1, 50, 8, 1.0),
    ]
    rows = []
    for name, q, rounds, steps, sigma_fixed in plans:
        for eps in (1.0, 3.0, 8.0) if sigma_fixed is None else (None,):
            sigma = sigma_fixed or noise_for_epsilon(eps, rounds * steps, DELTA, q)
            train = Segment(0, rounds, q, sigma, rounds * steps)
            base = ledger_epsilon([train], DELTA)
            row = {"plan": name, "sigma": sigma, "epsilon_train": base}
            for z in ZS:
                val = Segment(0, rounds, 1.0, z, rounds // 5, release="validation")
                row[f"z={z:g}"] = ledger_epsilon([train, val], DELTA)
            rows.append(row)
    return rows


def _release_error(
    y: np.ndarray, s: np.ndarray, bins: int, z: float, level: str = "instance", sites=None
) -> dict:
    from fedxrisk.engines.privacy.noise import NoiseSource
    from fedxrisk.engines.privacy.validation import ValidationDP, ValidationRelease, site_mass
    from fedxrisk.engines.validation import released_validation, score_histograms
    from fedxrisk.metrics import auroc

    dp = ValidationDP(z, level, bins)
    if sites is None:
        counts = score_histograms(y, s, 1)
    else:
        counts = np.sum([site_mass(score_histograms(y[k], s[k], 1)) for k in sites], axis=0)
        y, s = np.concatenate([y[k] for k in sites]), np.concatenate([s[k] for k in sites])
    exact = auroc(y, s)
    values = [
        released_validation(counts, ValidationRelease(dp, NoiseSource.reproducible(seed)), 1)["val_auroc"]
        for seed in range(DRAWS)
    ]
    masses = (float((counts[0, 0, :-1]).sum()), float(counts[0, 1, :-1].sum()))
    return {
        "exact": exact, "noise_free": released_validation(counts, None, 1)["val_auroc"], "released_mean": float(np.mean(values)), "released_sd": float(np.std(values)),
        "mean_abs_error": float(np.mean(np.abs(np.array(values) - exact))), "rho": dp.signal(masses),
    }  # fmt: skip


def bins_study() -> list[dict[str, Any]]:
    from fedxrisk.engines.privacy.validation import DEFAULT_NOISE

    rng = np.random.default_rng(0)
    rows = []
    for n in SIZES:
        y = rng.random(n) < 0.2
        s = rng.normal(size=n) * 1.5 + 1.5 * y
        for bins in BINS:
            rows.append({"records": n, "bins": bins, **_release_error(y, s, bins, DEFAULT_NOISE)})
    return rows


def heart(data_root: Path) -> list[dict[str, Any]]:
    import torch

    from fedxrisk.engines import Simulation
    from fedxrisk.engines.privacy.validation import DEFAULT_BINS, DEFAULT_NOISE
    from fedxrisk.engines.validation import validation_scores
    from fedxrisk.run.build import build
    from fedxrisk.run.checks import checked
    from fedxrisk.run.spec import RunConfig

    torch.manual_seed(0)
    cfg = RunConfig(
        algorithm="localsgdm", dataset="heart_disease", data_dir=str(data_root / "heart-disease"), clients=4,
        partition="source", imratio=None, model="linear", rounds=20, local_steps=8, batch_size=16, lr=0.03,
        stages=1, engine="loop", checkpoint_every=0, tensorboard=False, validation=0.2, allow_missing_class=True,
    )  # fmt: skip
    setup = build(checked(cfg))
    sim: Simulation = setup.simulation
    while not sim.done:
        sim.run_round()
    params, buffers = sim.global_model()
    ys, ss = {}, {}
    for k in range(4):
        y, s = validation_scores(setup.problem, params, buffers, setup.data, [k])
        ys[k], ss[k] = y[:, 0], s[:, 0]
    sizes = {k: (int((ys[k] == 0).sum()), int((ys[k] == 1).sum())) for k in range(4)}
    y, s = np.concatenate(list(ys.values())), np.concatenate(list(ss.values()))
    rows = []
    for z in (1.0, DEFAULT_NOISE):
        for bins in (8, 32) if DEFAULT_BINS in (8, 32) else (8, DEFAULT_BINS, 32):
            rows.append({"level": "instance", "z": z, "bins": bins, **_release_error(y, s, bins, z)})
    for z in (0.01, 0.05, DEFAULT_NOISE):
        rows.append(
            {"level": "client", "z": z, "bins": DEFAULT_BINS,
             **_release_error(ys, ss, DEFAULT_BINS, z, "client", list(range(4)))}
        )  # fmt: skip
    return [{"site_validation_counts (negatives, positives)": sizes}, *rows]


def render(result: dict[str, Any]) -> str:
    out = ["**ε with the validation releases** (δ = 1e-5; one release every 5 rounds)", ""]
    out += ["| plan | σ | ε training | " + " | ".join(f"ε with z = {z:g}" for z in ZS) + " |"]
    out += ["|---|---:|---:|" + "---:|" * len(ZS)]
    for r in result["epsilon_share"]:
        cells = [f"{r[f'z={z:g}']:.3g} (+{100 * (r[f'z={z:g}'] / r['epsilon_train'] - 1):.0f} %)" for z in ZS]
        out.append(
            f"| {r['plan']} | {r['sigma']:.3g} | {r['epsilon_train']:.3g} | " + " | ".join(cells) + " |"
        )
    out += ["", "**Released AUROC against bins** (instance level, z = 10; binormal, exact AUROC ≈ 0.76; "
            f"mean |error| over {DRAWS} draws, ρ in brackets)", ""]  # fmt: skip
    out += ["| records | " + " | ".join(f"{b} bins" for b in BINS) + " |", "|---:|" + "---:|" * len(BINS)]
    for n in SIZES:
        cells = [f"{r['mean_abs_error']:.3f} ({r['rho']:.2f})" for r in result["bins"] if r["records"] == n]
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    if result.get("heart"):
        sizes, *rows = result["heart"]
        counts = ", ".join(
            f"{n}/{p}" for n, p in sizes["site_validation_counts (negatives, positives)"].values()
        )
        out += [
            "",
            f"**Heart disease** (validation negatives/positives per hospital: {counts}; CE FedAvg, 20 rounds)",
            "",
        ]
        out += [
            "| level | z | bins | exact AUROC | summed histogram, no noise | released mean ± sd | mean abs error | ρ |"
        ]
        out += ["|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            out.append(
                f"| {r['level']} | {r['z']:g} | {r['bins']} | {r['exact']:.3f} | {r['noise_free']:.3f} | {r['released_mean']:.3f} ± "
                f"{r['released_sd']:.3f} | {r['mean_abs_error']:.3f} | {r['rho']:.2f} |"
            )
    out += ["", f"{result['cpu_seconds']:.0f} CPU seconds."]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "data_root", nargs="?", default="../shared/data", help="folder holding heart-disease/"
    )
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    path = RESULTS / f"{NAME}.json"
    if not args.render_only:
        start = time.process_time()
        result = {"epsilon_share": epsilon_share(), "bins": bins_study()}
        root = Path(args.data_root)
        result["heart"] = heart(root) if (root / "heart-disease").exists() else None
        result["cpu_seconds"] = time.process_time() - start
        path.write_text(json.dumps(result, indent=1, default=lambda x: None if math.isnan(x) else x) + "\n")
    result = json.loads(path.read_text())
    (RESULTS / f"{NAME}.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()

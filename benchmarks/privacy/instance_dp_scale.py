"""Why CODASCA under instance-level DP can end near or below AUROC 0.5 (issue 34): the noise in w
per local step is η·σC/B, and the CODA family's default η (3, chosen for the AUC square loss's
small noise-free gradients) is 10 × CE FedAvg's. Test AUROC of CODASCA on digits (K = 4 iid,
imratio 0.1, MLP, 30 rounds of 8 local steps, B = 32, public p = 0.1) for (C, σ, η) with secret
noise, one run per seed; prints a line per setting (nothing is written).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/privacy/instance_dp_scale.py
"""

from __future__ import annotations

import argparse

SETTINGS = ((1.0, 1.0, 3.0), (1.0, 1.0, 0.3), (0.2, 1.0, 3.0), (1.0, 0.0, 0.3))  # (C, σ, η)


def test_auroc(clip: float, sigma: float, lr: float, seed: int) -> float:
    from sklearn.metrics import roc_auc_score

    from fedxrisk.metrics import predict
    from fedxrisk.run.build import build
    from fedxrisk.run.configfile import load_config

    sets = [
        "algorithm.algorithm=codasca", "data.clients=4", "data.partition='iid'", "experiment.rounds=30",
        "algorithm.stages=1", f"algorithm.lr={lr}", f"experiment.seed={seed}", "experiment.tensorboard=false",
        "privacy.level='instance'", f"privacy.clip={clip}", f"privacy.noise_multiplier={sigma}",
    ]  # fmt: skip
    setup = build(load_config(None, sets))
    sim = setup.simulation
    while not sim.done:
        sim.run_round()
    params, buffers = sim.global_model()
    data = setup.data.data
    return float(roc_auc_score(data.y_test.numpy(), predict(setup.problem, params, buffers, data.x_test)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    for clip, sigma, lr in SETTINGS:
        aurocs = [f"{test_auroc(clip, sigma, lr, s):.3f}" for s in args.seeds]
        print(f"CODASCA C = {clip:g}, σ = {sigma:g}, η = {lr:g}: test AUROC {', '.join(aurocs)}", flush=True)


if __name__ == "__main__":
    main()

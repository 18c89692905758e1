"""Issue 34's trial of further bad inputs (benchmarks/reliability/reliability_trial.py): tune, privacy, secure
aggregation, Flower apps, [server], personalization, evaluate/cross-site/check, survival tables,
positives_per_batch. Each case stops with the message spelled out here (exit 2, nothing written or
changed, a link's target included), or is accepted and passes its check; the committed table
(docs/reliability.md) shows the same messages.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("optuna")
pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: `benchmarks.*`
_spec = importlib.util.spec_from_file_location(
    "reliability_trial", ROOT / "benchmarks" / "reliability" / "reliability_trial.py"
)
table = importlib.util.module_from_spec(_spec)
sys.modules["reliability_trial"] = table
_spec.loader.exec_module(table)
COMMITTED = {r["id"]: r for r in json.loads((ROOT / "benchmarks/results/reliability_trial.json").read_text())}
RUNS = [
    "i-tune-selection-best",
    "i-run-dash-a",
    "tune-space-fixed",
    "eval-against-ok",
    "eval-calibration-no-val",
    "cross-ok",
]  # accepted; the output is checked by the case
EXPECTED = {
    'i-tune-journal-link': 'TMP/tuned/study.journal is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'i-tune-history-link': 'TMP/tuned/history.png is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'i-tune-importances-link': 'TMP/tuned/importances.png is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'i-tune-dangling-link': 'TMP/tuned/history.png is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'i-tune-trials-link': 'TMP/tuned/trials is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'i-newapp-pyproject': 'TMP/mine/pyproject.toml already exists; pass --overwrite to replace it, or choose another folder',
    'i-tune-storage-word': "--storage 'foo': expected a database URL (sqlite:///FILE, postgresql://…, mysql://…), or no --storage for TUNE/study.journal",
    'i-tune-storage-redis': "--storage 'redis://localhost/0': expected a database URL (sqlite:///FILE, postgresql://…, mysql://…), or no --storage for TUNE/study.journal",
    'i-tune-storage-sqlite-memory': "--storage 'sqlite://': expected a database URL (sqlite:///FILE, postgresql://…, mysql://…), or no --storage for TUNE/study.journal",
    'i-tune-storage-no-folder': 'cannot open the study storage sqlite:////no/such/folder/x.db: OperationalError: (sqlite3.OperationalError) unable to open database file',
    'i-tune-storage-postgres': 'cannot open the study storage postgresql://u@127.0.0.1:1/db: …',
    'i-tune-storage-mysql': 'cannot open the study storage mysql://u@127.0.0.1:1/db: …',
    'i-tune-grid-zero': '--grid-points must be ≥ 1, got 0',
    'i-tune-grid-negative': '--grid-points must be ≥ 1, got -3',
    'i-tune-broken-marker': 'TMP/tuned/tune.json is unreadable (JSONDecodeError); it marks a tune folder: restore it or choose another --out',
    'i-tune-broken-journal': 'cannot open the study storage TMP/tuned/study.journal: JSONDecodeError: Expecting property name enclosed in double quotes: line 2 column 1 (char 16)',
    'i-tune-space-lr-zero': '--space lr=0:0: lr = 0 is refused: algorithm.lr must be > 0, got 0.0',
    'i-tune-space-steps-zero': '--space local_steps=0:0: local_steps = 0 is refused: algorithm.local_steps must be ≥ 1, got 0',
    'i-tune-timeout-nan': '--timeout must be a number of seconds > 0, got nan',
    'i-tune-confirm-twice': '--confirm-seeds repeats seed 1; each seed must appear once',
    'i-tune-momentum': '--space momentum=0.5:1.5: momentum must lie in [0, 1)',
    'i-secagg-maybe': "run-config 'secure-aggregation': expected true/false, got 'maybe' (str)",
    'i-secagg-fedxl2': "secure-aggregation: fedxl2 calls collective(s) ['pool'] (per-sample score pools the server merges), which a secure sum cannot carry; only algorithms whose every message is a mean can use SecAgg+",
    'i-secagg-range-nan': 'secure-aggregation-range must be a finite number > 0, got nan',
    'i-evaluate-out-proc': '--out /proc/fedxrisk-out/x cannot be created (No such file or directory); nothing was written',
    'i-predict-out-proc': '--out /proc/fedxrisk-out cannot be created (No such file or directory); nothing was written',
    'i-plot-out-proc': '--out /proc/fedxrisk-out/x cannot be created (No such file or directory); nothing was written',
    'i-evaluate-tpu': "device 'tpu' is not a torch device; use cpu, cuda, cuda:N or mps",
    'i-predict-tpu': "device 'tpu' is not a torch device; use cpu, cuda, cuda:N or mps",
    'i-evaluate-edited-config': "TMP/a/config.toml was edited after the run (dataset: 'npz' vs 'digits', run vs file); restore it from TMP/a/summary.json's config",
    'tune-trials-zero': '--trials must be ≥ 1, got 0',
    'tune-timeout-negative': '--timeout must be a number of seconds > 0, got -5.0',
    'tune-space-text': "--space lr=abc:1: LOW 'abc' is not a number",
    'tune-space-reversed': '--space lr=1:0.1: LOW 1 is above HIGH 0.1',
    'tune-space-scale': '--space lr=0.01:1:cubic: expected KEY=LOW:HIGH[:log]',
    'tune-space-unknown': "--space nosuch=0:1: 'nosuch' is neither a run setting nor a hyperparameter of codasca (lr, lr_decay, window_growth, dirichlet_alpha, local_steps, batch_size, rounds, stages, positives_per_batch, form, prox, margin, loss, restart, dual_step, clip_grad, weight_decay, clip_scope, dual_order, prox_reference, stabilize, eta_g, control_variate, alpha_variate, reset_variates); any other setting as SECTION.KEY, e.g. server.lr",
    'tune-space-log-negative': '--space lr=-1:1:log: a log range needs LOW > 0, got -1',
    'tune-space-nan': "--space lr=nan:1: LOW must be finite, got 'nan'",
    'tune-space-int-float': '--space local_steps=1.5:3: local_steps takes whole numbers',
    'tune-space-twice': '--space lr=0.2:2: lr is searched twice; give one range per key',
    'tune-monitor-unknown': "unknown monitor 'no_such_column' (experiment.monitor); choose one of ['val_ap', 'val_auroc', 'val_cindex', 'val_pauc30_norm', 'val_pauc50_norm']",
    'tune-confirm-negative': '--confirm-seeds: seeds must be ≥ 0, got -1',
    'tune-confirm-text': "--confirm-seeds: expected a comma-separated list, got 'a,b' (invalid literal for int() with base 10: 'a')",
    'tune-grid-huge': '--grid-points 100000 over 3 key(s) makes a grid of 1e+15 points; at most 100,000 (fewer --grid-points, or --space fewer keys)',
    'tune-out-foreign': '--out TMP/mine is not empty and holds no fedxrisk tune (notes.txt); choose a new or empty folder',
    'tune-out-under-file': '--out TMP/file/t cannot be created (Not a directory); nothing was written',
    'tune-out-proc': '--out /proc/fedxrisk-tune cannot be created (No such file or directory); nothing was written',
    'tune-out-is-run': '--out TMP/a is not empty and holds no fedxrisk tune (config.toml, final_state.pt, history.csv, model.pt, summary.json); choose a new or empty folder',
    'tune-storage-user-file': 'cannot open the study storage sqlite:///TMP/a/config.toml: DatabaseError: (sqlite3.DatabaseError) file is not a database',
    'tune-study-name-empty': '--study-name is empty; name the study, or drop --study-name for the default',
    'tune-rounds-zero': 'experiment.rounds must be ≥ 1, got 0',
    'tune-algorithm-unknown': "--algorithm: unknown algorithm 'nosuch'; choose one of ['acc_fcsg_m', 'coda', 'codaplus', 'codasca', 'ditto', 'fcsg', 'fcsg_m', 'fedavg_cox', 'fedprox', 'fedxl1', 'fedxl1_cindex', 'fedxl2', 'fedxl2_cox', 'local_scgd', 'local_scgdm', 'localpair', 'localscgdam', 'localsgdam', 'localsgdm', 'localsgdm_rl', 'npa', 'scaffold']",
    'tune-resume-other-space': 'TMP/tuned holds a tune over another search space (lr 0.3..30 log, margin 0.5..1.5, eta_g 0.5..1.5; now lr 0.5..2, margin 0.5..1.5, eta_g 0.5..1.5); rerun with its --space, or choose another --out',
    'tune-best-config-link': 'TMP/tuned/best_config.toml is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'tune-trials-csv-link': 'TMP/tuned/trials.csv is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'tune-best-json-link': 'TMP/tuned/best.json is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'tune-confirm-json-link': 'TMP/tuned/confirm.json is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'tune-option-text': "algorithm.momentum: expected a number, got 'fast' (str)",
    'dp-delta-zero': 'privacy.delta must lie in (0, 1), got 0.0',
    'dp-delta-one': 'privacy.delta must lie in (0, 1), got 1.0',
    'dp-delta-nan': 'privacy.delta must lie in (0, 1), got nan',
    'dp-clip-zero': "privacy clip (the L2 norm C of a client's update) must be > 0, got 0.0",
    'dp-clip-inf': "privacy clip (the L2 norm C of a client's update) must be > 0, got inf",
    'dp-clip-missing': 'privacy.clip is missing: the L2 clipping norm C (e.g. clip = 1.0)',
    'dp-sigma-negative': 'privacy.noise_multiplier must be a finite number > 0 (σ = 0 adds no noise: ε would be infinite), got -1; drop [privacy] for a run without DP',
    'dp-sigma-inf': 'privacy.noise_multiplier must be a finite number > 0 (σ = 0 adds no noise: ε would be infinite), got inf; drop [privacy] for a run without DP',
    'dp-epsilon-zero': 'privacy.target_epsilon must be a finite number > 0, got 0.0',
    'dp-epsilon-nan': 'privacy.target_epsilon must be a finite number > 0, got nan',
    'dp-sigma-and-epsilon': 'privacy: set exactly one of privacy.noise_multiplier and privacy.target_epsilon',
    'dp-rate-zero': 'client sampling rate must lie in (0, 1], got 0.0',
    'dp-rate-above-one': 'client sampling rate must lie in (0, 1], got 1.5',
    'dp-sampling-unknown': "client sampling must be one of ('poisson', 'fixed'), got 'bernoulli'",
    'dp-level-unknown': "privacy.level must be one of ('client', 'instance'), got 'sample'",
    'dp-noise-seed-negative': 'privacy.reproducible_noise must be ≥ 0, got -1',
    'dp-noise-seed-text': 'privacy.reproducible_noise: expected an integer or "none", got \'yes\' (str)',
    'dp-noise-seed-float': 'privacy.reproducible_noise: expected an integer or "none", got 1.5 (float)',
    'dp-key-unknown': 'unknown key privacy.sigma; [privacy] allows: level, clip, noise_multiplier, target_epsilon, delta, sampling_rate, sampling, reproducible_noise, pos_ratio, validation_noise_multiplier, validation_bins',
    'dp-pos-ratio-zero': 'privacy.pos_ratio must lie in (0, 1), got 0.0',
    'dp-pos-ratio-one': 'privacy.pos_ratio must lie in (0, 1), got 1.0',
    'dp-client-public-p': "privacy.level = 'client': codasca's AUC loss needs a public class prior p, not one counted from every site's records; set privacy.pos_ratio (e.g. 0.1) or data.imratio",
    'dp-instance-rate': "privacy.sampling_rate < 1 is client sampling: it applies to level = 'client' only",
    'app-secagg-number': "run-config 'secure-aggregation': expected true/false, got 2 (int)",
    'app-secagg-range-zero': 'secure-aggregation-range must be a finite number > 0, got 0.0',
    'app-secagg-range-negative': 'secure-aggregation-range must be a finite number > 0, got -5.0',
    'app-secagg-range-inf': 'secure-aggregation-range must be a finite number > 0, got inf',
    'app-key-unknown': "unknown run-config key 'no-such-key'; allowed: algorithm, allow-missing-class, augment, batch-size, buffer-policy, cache, checkpoint-every, clients, clients-per-rank, clients-per-round, data-dir, dataset, device, dirichlet-alpha, dist-timeout, early-stopping, engine, eval-batch-size, eval-every, feature-shift, finetune-steps, image-size, imratio, init-from, local-steps, lr, lr-decay, memory-budget, min-nodes, model, monitor, node-wait-timeout, normalize, num-samples, on-bad-file, on-missing, options, out-dir, participation, participation-seed, partition, personal, personal-monitor, pos-ratio-mode, positive-classes, positives-per-batch, pretrain, privacy, reset-head, round-timeout, rounds, secure-aggregation, secure-aggregation-range, seed, selection, server, sources, stages, stream, tensorboard, test-data, test-imratio, validation, window-growth, workers",
    'app-no-equals': "Invalid value for --set: expected KEY=VALUE, got 'rounds'",
    'app-rounds-negative': 'rounds must be ≥ 1, got -1',
    'app-min-nodes-zero': 'min-nodes must be ≥ 1, got 0',
    'app-round-timeout-nan': 'round-timeout must be a finite number of seconds > 0, got nan',
    'app-folder-is-file': "Invalid value for 'FOLDER': Directory 'TMP/file' is a file.",
    'app-folder-proc': 'cannot create the folder /proc/fedxrisk-app: No such file or directory; nothing was written',
    'app-privacy-sigma-zero': 'privacy.noise_multiplier must be a finite number > 0 (σ = 0 adds no noise: ε would be infinite), got 0; drop [privacy] for a run without DP',
    'fleval-existing-app': 'TMP/mine/pyproject.toml already exists; pass --overwrite to replace it, or choose another folder',
    'fleval-dp-epsilon-negative': '--dp-epsilon must be a finite number > 0 and --dp-delta in (0, 1), got -1.0, 1e-05',
    'fleval-dp-epsilon-nan': '--dp-epsilon must be a finite number > 0 and --dp-delta in (0, 1), got nan, 1e-05',
    'fleval-dp-delta-one': '--dp-epsilon must be a finite number > 0 and --dp-delta in (0, 1), got 1.0, 1.0',
    'fleval-dp-with-against': "the private evaluation (the default) releases one model's noised pooled histogram: --against and --site-auroc need --exact, which discloses the exact pooled histograms",
    'export-sites-zero': 'the number of clients must be ≥ 1, got 0',
    'export-dataset-unknown': "unknown dataset 'nosuch'; choose one of ['breast_cancer', 'chestxray_ih', 'chexpert', 'cifar10', 'cifar100', 'digits', 'fashionmnist', 'folder', 'heart_disease', 'manifest', 'medmnist', 'mnist', 'mnist1d', 'npz', 'sites', 'stl10', 'survival', 'synthetic', 'tabular', 'tcga_brca']",
    'export-out-foreign': '--out TMP/mine is not empty and holds no exported trial (notes.txt); choose a new or empty folder',
    'server-optimizer-unknown': "server.optimizer must be one of sgd, adam, yogi, adagrad, got 'rmsprop'",
    'server-lr-inf': 'server.lr must be a finite number > 0, got inf',
    'server-lr-nan': 'server.lr must be a finite number > 0, got nan',
    'server-beta1-one': 'server.beta1 must lie in [0, 1), got 1.0',
    'server-tau-inf': 'server.tau must be a finite number > 0, got inf',
    'server-key-unknown': "unknown key 'server.momentum'; [server] allows: beta1, beta2, bias_correction, lr, optimizer, tau",
    'server-lr-text': "server.lr: expected a number, got 'fast' (str)",
    'personal-unknown': "unknown personal 'tail' (model.personal); choose one of ['bn', 'head', 'none']",
    'personal-bn-no-bn': "model.personal = 'bn': the model 'linear' has no BatchNorm layer; use personal = 'none', or a model with BatchNorm (cnn, densenet121, densenet121_imagenet, densenet161, resnet20)",
    'finetune-negative': 'algorithm.finetune_steps must be ≥ 0 (0: no fine-tuning), got -1',
    'finetune-float': 'algorithm.finetune_steps: expected an integer, got 1.5 (float)',
    'ditto-lam-negative': 'lam must be a finite number ≥ 0, got -1.0',
    'ditto-lam-nan': 'lam must be a finite number ≥ 0, got nan',
    'eval-spec-above-one': '--at-specificity must lie strictly between 0 and 1, got 1.5',
    'eval-spec-nan': '--at-specificity must lie strictly between 0 and 1, got nan',
    'eval-sens-zero': '--at-sensitivity must lie strictly between 0 and 1, got 0.0',
    'eval-against-not-run': 'TMP/mine: no config.toml; not a finished fedxrisk run (evaluate a run that completed)',
    'eval-against-other-data': "--against TMP/c: its model takes inputs [5] with 1 label(s), TMP/a's [4] with 1; they cannot be compared",
    'eval-against-broken': 'TMP/b/summary.json: not a readable summary (Unterminated string starting at: line 1 column 12 (char 11))',
    'eval-against-self': '--against TMP/a is the evaluated run itself; name another run to compare with',
    'eval-dp-epsilon-negative': '--dp-epsilon must be a finite number > 0 and --dp-delta in (0, 1), got -1.0, 1e-05',
    'eval-dp-delta-one': '--dp-epsilon must be a finite number > 0 and --dp-delta in (0, 1), got 1.0, 1.0',
    'cross-not-run': 'TMP/mine: no config.toml; not a finished fedxrisk run (evaluate a run that completed)',
    'cross-other-data': 'TMP/c: inputs [5], 1 label(s); the first run takes [4] (cross-site compares single-label models on one input)',
    'cross-out-foreign': '--out TMP/mine is not empty and holds no fedxrisk run or cross-site output (notes.txt); choose a new or empty folder',
    'cross-no-sites': "TMP/a: the evaluation data has no sites (a 'source' column); nothing to cross",
    'cross-out-link': 'TMP/x/cross_site.json is a symbolic link; fedxrisk never writes through one: remove it or choose another output',
    'cross-broken-summary': 'TMP/b/summary.json: not a readable summary (Unterminated string starting at: line 1 column 12 (char 11))',
    'cross-device-tpu': "device 'tpu' is not a torch device; use cpu, cuda, cuda:N or mps",
    'check-missing-file': "config file 'TMP/nope.toml' does not exist",
    'check-binary': 'TMP/a/model.pt: not UTF-8 text (byte 0x80 at offset 64)',
    'check-bad-toml': "TMP/cfg.toml: not valid TOML (Expected ']' at the end of a table declaration (at line 1, column 6))",
    'check-unknown-section': "unknown key 'dta' (did you mean 'data'?); a config file allows: algorithm, data, engine, experiment, model",
    'check-broken-summary': 'TMP/a/summary.json: not valid JSON (Unterminated string starting at: line 1 column 12 (char 11))',
    'check-set-no-equals': "--set expects SECTION.KEY=VALUE, got 'data.clients'",
    'surv-nan-feature': 'TMP/s.csv: 1 row(s) with NaN/inf features (data rows 3, 0-based); fix or drop them',
    'surv-inf-feature': 'TMP/s.csv: 1 row(s) with NaN/inf features (data rows 3, 0-based); fix or drop them',
    'surv-negative-time': 'TMP/s.csv: 1 negative survival time(s)',
    'surv-event-two': 'TMP/s.csv: events must be 0 (censored) or 1 (event), found [2.0]',
    'surv-no-event-column': "TMP/s.csv: no 'event' column (the survival event column)",
    'surv-npz-empty': 'TMP/s.npz: not a readable .npz archive of numbers (EOFError: No data left in file)',
    'surv-npz-objects': 'TMP/s.npz: not a readable .npz archive of numbers (ValueError: Object arrays cannot be loaded when allow_pickle=False)',
    'surv-npz-text': "TMP/s.npz: array 'ward' holds <U1 values, not numbers",
    'surv-npz-lengths': "TMP/s.npz: arrays of different lengths ({'time': 40, 'event': 40, 'x': 30}); one row per patient in each",
    'surv-npz-no-feature': "TMP/s.npz: no feature column besides 'time' and 'event'",
    'surv-latin1': "TMP/s.csv: cannot read ('utf-8' codec can't decode byte 0xe2 in position 11: invalid continuation byte)",
    'ppb-negative': 'data.positives_per_batch must lie in [1, batch_size − 1] = [1, 7], got -1',
    'ppb-float': 'data.positives_per_batch: expected an integer, got 2.5 (float)',
    'ppb-batch': 'data.positives_per_batch must lie in [1, batch_size − 1] = [1, 7], got 8',
    'ppb-above-batch': 'data.positives_per_batch must lie in [1, batch_size − 1] = [1, 7], got 50',
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return table.make_runs(tmp_path_factory.mktemp("trial_runs"))


def test_every_case_has_an_outcome_and_the_trial_is_large_enough():
    assert sorted([*EXPECTED, *RUNS]) == sorted(c.id for c in table.CASES)
    assert sum(c.new for c in table.CASES) >= 50


def test_docs_table_is_the_rendering_of_the_committed_results():
    rows = json.loads((ROOT / "benchmarks/results/reliability_trial.json").read_text())
    rendered = (ROOT / "benchmarks/results/reliability_trial.md").read_text()
    assert table.render(rows) == rendered
    assert {r["class"] for r in rows} <= {"clear", "runs"}
    doc = (ROOT / "docs/reliability.md").read_text()
    assert (
        f"<!-- BEGIN GENERATED benchmarks/results/reliability_trial.md -->\n{rendered}<!-- END GENERATED -->"
        in doc
    )


@pytest.mark.parametrize("case", table.CASES, ids=lambda c: c.id)
def test_case(case, runs, tmp_path):
    row = table.run_case(case, tmp_path, runs)
    if case.id in RUNS:
        assert (row["exit"], row["class"]) == (0, "runs"), row["message"]
    else:  # "…": the rest depends on the database drivers installed
        expected = f"Error: {EXPECTED[case.id]}"
        assert (
            row["message"].startswith(expected[:-1]) if expected.endswith("…") else row["message"] == expected
        )
        assert (row["exit"], row["class"]) == (2, "clear")
        if not expected.endswith("…"):
            assert COMMITTED[case.id]["message"] == row["message"]  # docs/reliability.md shows this very line

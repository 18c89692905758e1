"""``fedxrisk evaluate --personal``: each site's own model (``site_<k>.pt``) on that site's test rows.

A personalized run (``model.personal``, Ditto, fine-tuning) deploys one model per site; the
run's ``model.pt`` is the global model, which no site deploys. Each ``site_<k>.pt`` is read as
``model.pt`` is (checked entry by entry, and against the sha256 the run recorded for it in
summary.json's ``personal.site_models``), scored on site k's own test rows where the data name
them (``partition = 'source'``: the site's test split), else on the whole test set, and reported
beside the global model on the same rows: AUROC [DeLong CI], AP and pAUC [bootstrap CIs].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedxrisk.data.types import site_name
from fedxrisk.evaluation.data import _columns, client_test_portions
from fedxrisk.inference import InputError, TrainedModel


def site_files(trained: TrainedModel) -> dict[str, str]:
    """{file: sha256} of the run's site models, or one line saying the run wrote none."""
    import json

    try:
        summary = json.loads((trained.run_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{trained.run_dir / 'summary.json'}: unreadable ({e})") from None
    block = summary.get("personal") or {}
    files = block.get("site_models") or {}
    if not files:
        raise InputError(
            f"{trained.run_dir}: --personal scores each site's own model (site_<k>.pt), and this run wrote "
            "none (train with model.personal, Ditto or finetune_steps)"
        )
    return files


def site_model(trained: TrainedModel, name: str, sha256: str) -> TrainedModel:
    """``name`` (a ``site_<k>.pt`` of the run) as a scoring model, refused unless it is the file the
    run wrote."""
    from dataclasses import replace

    from fedxrisk.inference import read_model_file
    from fedxrisk.run.assemble import scoring_problem
    from fedxrisk.run.identity import file_sha256

    path = trained.run_dir / name
    if not path.is_file() or file_sha256(path) != sha256:
        raise InputError(
            f"{path}: {'missing' if not path.is_file() else 'not the model this run wrote (sha256 differs)'}; "
            "put the run's own site models back"
        )
    model, blob, _ = read_model_file(path)
    device = str(next(iter(trained.params.values())).device)
    problem = scoring_problem(model, int(blob["num_labels"]), device, trained.problem.eval_batch_size)
    params, buffers = problem.init_model()
    return replace(trained, problem=problem, params=params, buffers=buffers)


def personal_report(
    trained: TrainedModel, label_metrics: Callable[..., dict[str, Any]], resamples: int, seed: int
) -> dict[str, Any]:
    """Per site: its own model and the global model on the site's test rows (module doc), each
    measured by ``label_metrics`` (:func:`fedxrisk.evaluation.label_metrics`)."""
    from fedxrisk.run.build import build_data

    files = site_files(trained)
    fed, _ = build_data(trained.config)
    if fed.data.y_test.dim() == 2:
        raise InputError("--personal scores binary-label runs only")
    x, y = fed.data.x_test, _columns(fed.data.y_test.numpy())[:, 0]
    portions = client_test_portions(trained.config.partition, fed.data, fed.shards)
    everyone = [(k, np.ones(len(y), dtype=bool)) for k in range(fed.num_clients)]
    rows = portions if portions is not None else everyone
    global_scores = _columns(trained.model_logits(x))[:, 0]
    sites: dict[str, Any] = {}
    for k, (site, mask) in enumerate(rows):
        name = f"site_{k}.pt"
        if name not in files:
            raise InputError(f"{trained.run_dir}: summary.json records no {name} for client {k}")
        own = _columns(site_model(trained, name, files[name]).model_logits(x[torch.from_numpy(mask)]))[:, 0]
        label = site_name(fed.data.source_names, site) if portions is not None else f"client {k}"
        sites[label] = {
            "file": name,
            "own": label_metrics(y[mask], own, resamples, [seed, 11, k]),
            "global": label_metrics(y[mask], global_scores[mask], resamples, [seed, 12, k]),
        }
    return {"site_rows": "own" if portions is not None else "all", "sites": sites}


def markdown_lines(result: dict[str, Any]) -> list[str]:
    """evaluation.md's section: each site's own model against the global model on its rows."""
    block = result.get("personal")
    if not block:
        return []
    rows = "the site's own test rows" if block["site_rows"] == "own" else "the whole test set"
    lines = [
        "## Each site's own model",
        "",
        f"Each site's deployed model (site_<k>.pt) and the global model (model.pt) on {rows}; "
        "AUROC [DeLong 95% CI].",
        "",
        "| site | n+/n− | own model | global model |",
        "|---|---:|---|---|",
    ]
    for name, s in block["sites"].items():
        own, shared = s["own"], s["global"]
        lines.append(f"| {name} | {own['positives']}/{own['negatives']} | {_ci(own)} | {_ci(shared)} |")
    return [*lines, ""]


def _ci(m: dict[str, Any]) -> str:
    a, (lo, hi) = m["auroc"], m["auroc_ci"]
    return "–" if a is None or np.isnan(a) else f"{a:.4f} [{lo:.4f}, {hi:.4f}]"

"""The ServerApp of a federated evaluation (needs ``flwr``); the protocol is :mod:`fedxrisk.flower.evaluate`.

``python -m fedxrisk.flower evaluate APP --model RUN [--against RUN_B]`` writes an app folder whose
ServerApp is :func:`evaluation_server_app` with the models' paths on the server; the sites run
the usual fedxrisk ClientApp (:mod:`fedxrisk.flower.app`), which answers evaluation requests.
``flwr run APP`` then writes ``federated_evaluation.json`` into the run config's ``out-dir``.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from fedxrisk.errors import ConfigError
from fedxrisk.flower.app import _flower_error, from_records, to_records
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.evaluate import DEFAULT_DP, OP, Send, federated_evaluation, private_evaluation
from fedxrisk.flower.secagg import secure_exchange
from fedxrisk.flower.wire import Packet
from fedxrisk.outfiles import make_folder, replace_atomic
from fedxrisk.run.folder import json_safe
from fedxrisk.run.identity import MODEL, check_model_identity
from fedxrisk.run.weights import read_state

RESULT = "federated_evaluation.json"


def grid_send(grid: Grid) -> Send:
    """Deliver one exchange on ``grid``: through SecAgg+ when the config says so, else as plain
    ``query.evaluate`` messages."""
    exchanges = itertools.count(1)

    def send(requests: dict[int, Packet], cfg: FlowerConfig) -> dict[int, Packet]:
        if cfg.deploy.secure_aggregation:
            return secure_exchange(grid, requests, cfg, next(exchanges), _flower_error)[0]
        messages = [
            Message(to_records(p), dst_node_id=n, message_type=f"query.{OP}") for n, p in requests.items()
        ]
        out = {}
        for reply in grid.send_and_receive(messages, timeout=cfg.deploy.round_timeout):
            node = reply.metadata.src_node_id
            out[node] = (
                Packet(config={"error": _flower_error(reply)})
                if reply.has_error()
                else from_records(reply.content)
            )
        for node in set(requests) - set(out):
            out[node] = Packet(config={"error": "did not answer in time"})
        return out

    return send


def wait_for_nodes(grid: Grid, cfg: FlowerConfig) -> list[int]:
    end = time.monotonic() + cfg.deploy.node_wait_timeout
    while len(nodes := sorted(grid.get_node_ids())) < cfg.deploy.min_nodes:
        if time.monotonic() > end:
            raise RuntimeError(
                f"{len(nodes)} of min-nodes = {cfg.deploy.min_nodes} sites connected in {cfg.deploy.node_wait_timeout:g} s"
            )
        time.sleep(0.2)
    return nodes


def load_models(paths: Sequence[str]) -> list[dict[str, torch.Tensor]]:
    return [read_state(p)[0] for p in paths]


def check_evaluation(
    models: Sequence[str], cfg: FlowerConfig, site_auroc: bool = False, dp: tuple[float, float] | None = DEFAULT_DP
) -> None:  # fmt: skip
    """What the evaluation refuses, one line each: checked by the app writer (``python -m fedxrisk.flower
    evaluate``, before any file) and by the ServerApp. ``models``: ``--model`` then ``--against``;
    ``dp``: (ε, δ) of the default private release, None for the exact mode."""
    if dp is not None:
        epsilon, delta = dp
        if not (0 < epsilon < math.inf and 0 < delta < 1):
            raise ConfigError(
                f"--dp-epsilon must be a finite number > 0 and --dp-delta in (0, 1), got {epsilon}, {delta}"
            )
        if len(models) != 1 or site_auroc:
            raise ConfigError(
                "the private evaluation (the default) releases one model's noised pooled histogram: "
                "--against and --site-auroc need --exact, which discloses the exact pooled histograms"
            )
        from fedxrisk.stats.dp_eval import noise_sigma

        try:  # the accountant is there (the privacy extra) and takes (ε, δ)
            noise_sigma(epsilon, delta)
        except ConfigError as e:
            raise ConfigError(f"{e}; or pass --exact (which discloses the exact pooled histograms)") from None
    shapes = []
    for option, path in zip(("--model", "--against"), models):
        shapes.append(_checked_model(option, Path(path)))
    if len(shapes) == 2 and None not in shapes and shapes[0] != shapes[1]:
        raise ConfigError(
            f"--against {models[1]} takes inputs {shapes[1]} but --model {models[0]} takes {shapes[0]}: "
            "the paired test compares two models on the same inputs"
        )


def _checked_model(option: str, path: Path) -> list[int] | None:
    """``path`` is a readable model (a run's own model.pt: its sha256 as summary.json recorded);
    the input shape it records, or None."""
    if not path.exists():
        raise ConfigError(f"{option} {path} does not exist")
    folder = path if path.is_dir() else path.parent if path.name == MODEL else None
    try:
        if folder is not None:
            check_model_identity(folder)
        read_state(path)
    except ConfigError as e:
        raise ConfigError(str(e).replace("model.init_from", option, 1)) from None
    file = path / MODEL if path.is_dir() else path
    blob = torch.load(file, map_location="cpu", weights_only=True)
    shape = blob.get("input_shape") if isinstance(blob, dict) else None
    return list(shape) if isinstance(shape, (list, tuple)) else None


def run_on_grid(
    grid: Grid, cfg: FlowerConfig, models: Sequence[str], site_auroc: bool = False,
    dp: tuple[float, float] | None = DEFAULT_DP,
) -> dict[str, Any]:  # fmt: skip
    """The evaluation over the connected sites; writes ``out-dir/federated_evaluation.json``.
    ``dp`` = (ε, δ) (default :data:`~fedxrisk.flower.evaluate.DEFAULT_DP`): one model, one DP release
    (:func:`~fedxrisk.flower.evaluate.private_evaluation`); None: the exact mode, its disclosure
    stated in the result."""
    check_evaluation(models, cfg, site_auroc, dp)
    nodes = wait_for_nodes(grid, cfg)
    if dp is not None:
        result = private_evaluation(grid_send(grid), nodes, cfg, load_models(models)[0], *dp)
    else:
        result = federated_evaluation(grid_send(grid), nodes, cfg, load_models(models), site_auroc)
    result |= {"model_files": list(models)}
    out = Path(cfg.deploy.out_dir)
    make_folder(out)
    public = {
        k: v for k, v in result.items() if k not in ("totals", "moments")
    }  # the pooled sums stay in memory
    text = json.dumps(json_safe(_plain(public)), indent=2) + "\n"
    replace_atomic(out / RESULT, lambda f: f.write(text))  # never half-written, never through a link
    return result


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.tolist() if isinstance(value, np.ndarray) else value


def evaluation_server_app(
    models: Sequence[str], site_auroc: bool = False, dp: tuple[float, float] | None = DEFAULT_DP
) -> ServerApp:
    """A ServerApp that evaluates the model files ``models`` (paths on the server) at every site."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_on_grid(grid, FlowerConfig.from_run_config(context.run_config), models, site_auroc, dp)

    return app

"""The ServerApp of a federated evaluation (needs ``flwr``); the protocol is :mod:`fedxrisk.flower.evaluate`.

``python -m fedxrisk.flower evaluate APP --model RUN [--against RUN_B]`` writes an app folder whose
ServerApp is :func:`evaluation_server_app` with the models' paths on the server; the sites run
the usual fedxrisk ClientApp (:mod:`fedxrisk.flower.app`), which answers evaluation requests.
``flwr run APP`` then writes ``federated_evaluation.json`` into the run config's ``out-dir``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from fedxrisk.flower.app import _flower_error, from_records, to_records
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.evaluate import OP, Send, federated_evaluation, private_evaluation
from fedxrisk.flower.secagg import secure_exchange
from fedxrisk.flower.wire import Packet
from fedxrisk.outfiles import make_folder, replace_atomic
from fedxrisk.run.folder import json_safe
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


def run_on_grid(
    grid: Grid, cfg: FlowerConfig, models: Sequence[str], site_auroc: bool = False,
    dp: tuple[float, float] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The evaluation over the connected sites; writes ``out-dir/federated_evaluation.json``.
    ``dp`` = (ε, δ): one model, one DP release (:func:`~fedxrisk.flower.evaluate.private_evaluation`)."""
    nodes = wait_for_nodes(grid, cfg)
    if dp is not None:
        if len(models) != 1 or site_auroc:
            raise ValueError(
                "a private evaluation releases one model's pooled histogram: no --against, no --site-auroc"
            )
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
    models: Sequence[str], site_auroc: bool = False, dp: tuple[float, float] | None = None
) -> ServerApp:
    """A ServerApp that evaluates the model files ``models`` (paths on the server) at every site."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_on_grid(grid, FlowerConfig.from_run_config(context.run_config), models, site_auroc, dp)

    return app

"""Flower pieces for one's own app: any ``nn.Module``, any site data, any ``ServerApp``.

``make_client_app(model_fn, data_fn, algorithm="codasca", rounds=20, ...)`` is a ClientApp,
``make_server_app(model_fn, ...)`` a ServerApp, and ``serve(grid, context, model_fn, ...)`` the
server's whole run for a ``@app.main()`` of one's own. They are thin: the settings are the
run-config keys of :class:`~fedxrisk.flower.config.FlowerConfig` (``local_steps`` for
``local-steps``; ``options`` a dict), the model is registered in :data:`fedxrisk.models.MODELS`
under ``custom.<model_fn's name>`` so every party builds it from the run's seed, and
``data_fn(context)`` replaces the node config's data folder. The protocol is the fedxrisk app's
(:mod:`fedxrisk.flower.app`): same messages, same model as the ``loop`` engine.

Keys of ``context.run_config`` that are fedxrisk settings (declared in the app's
``[tool.flwr.app.config]``, which ``flwr run --run-config`` may then override) override the ones
given here; other keys (the app's own) are left to the app.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from fedxrisk.flower import require_flwr

require_flwr()

from flwr.app import Context  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.logger import log as flwr_log  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from fedxrisk.algorithms import ALGORITHMS  # noqa: E402
from fedxrisk.errors import ConfigError  # noqa: E402
from fedxrisk.flower.app import GridTransport, build_client_app  # noqa: E402
from fedxrisk.flower.config import FlowerConfig, default_run_config  # noqa: E402
from fedxrisk.flower.coordinator import Coordinator  # noqa: E402
from fedxrisk.flower.sitedata import SiteData, SiteDataError  # noqa: E402
from fedxrisk.models import MODELS  # noqa: E402

__all__ = ["make_client_app", "make_server_app", "register_model", "run_config", "serve", "site_data"]

KEYS = set(default_run_config())  # every fedxrisk run-config key
ModelFn = Callable[[], nn.Module]
DataFn = Callable[[Context], Any]  # (x, y), (x, y, x_val, y_val) or a SiteData


def register_model(model_fn: ModelFn) -> str:
    """Put ``model_fn`` in the model registry (``build_model`` seeds it); return its name."""
    name = f"custom.{getattr(model_fn, '__qualname__', type(model_fn).__name__)}"
    MODELS[name] = lambda input_shape, num_outputs=1: model_fn()
    return name


def run_config(model_fn: ModelFn, settings: Mapping[str, Any], context: Context | None = None) -> dict:
    """The run config every party uses: ``settings`` (Python names), then the fedxrisk keys of
    ``context.run_config``; checked now, so a bad setting fails at start-up in one line."""
    if "model" in settings:
        raise ConfigError("give the network as model_fn, not model=")
    out = {"model": register_model(model_fn)}
    for name, value in settings.items():
        key = name.replace("_", "-")
        out[key] = json.dumps(value) if key == "options" and not isinstance(value, str) else value
    if context is not None:
        out.update({k: v for k, v in context.run_config.items() if k in KEYS})
    FlowerConfig.from_run_config(out)  # ConfigError naming the key
    return out


def site_data(value: Any, cfg: FlowerConfig, node_config: Mapping[str, Any]) -> SiteData:
    """``data_fn``'s answer as a checked :class:`SiteData`; ``partition-id`` orders the sites."""
    if isinstance(value, SiteData):
        site = value
    else:
        if not isinstance(value, (tuple, list)) or len(value) not in (2, 4):
            raise SiteDataError("data_fn must return (x, y), (x, y, x_val, y_val) or a SiteData")
        x, y, *val = (torch.as_tensor(np.asarray(v), dtype=torch.float32) for v in value)
        y = y.reshape(-1)
        x_val, y_val = (val[0], val[1].reshape(-1)) if val else (None, None)
        for xs, ys, what in ((x, y, "training"), (x_val, y_val, "validation")):
            if ys is not None and (len(xs) != len(ys) or not set(ys.unique().tolist()) <= {0.0, 1.0}):
                raise SiteDataError(f"data_fn: {what} data needs one binary 0/1 label per input")
        order = node_config.get("partition-id")
        site = SiteData(x, y, torch.arange(len(y)), x_val, y_val, order, source="data_fn")
    run = getattr(cfg, "run", cfg)  # the run's settings (a RunConfig once Flower's config is a view of it)
    site.check_classes(run.allow_missing_class or not ALGORITHMS[run.algorithm].needs_both_classes)
    return site


def make_client_app(
    model_fn: ModelFn, data_fn: DataFn, algorithm: str = "codasca", **settings: Any
) -> ClientApp:
    """A ClientApp training ``model_fn()`` on ``data_fn(context)`` with ``algorithm``. Like a data
    folder, ``data_fn`` is read at every message (a site keeps no tensors between messages): keep it
    cheap or cache it, and return the same data every time."""
    settings = {"algorithm": algorithm, **settings}
    run_config(model_fn, settings)  # fail now on a bad setting

    def view(context: Context) -> Context:
        return replace(context, run_config=run_config(model_fn, settings, context))

    def load(context: Context, cfg: FlowerConfig) -> SiteData:
        return site_data(data_fn(context), cfg, context.node_config)

    return build_client_app(load, view)


def serve(
    grid: Grid, context: Context, model_fn: ModelFn, algorithm: str = "codasca", **settings: Any
) -> dict[str, Any]:
    """Run the federated training over ``grid`` (a ServerApp's ``main``); return the run summary.
    Outputs (``history.csv``, ``model.pt``, ``summary.json``) go to ``out_dir``."""
    cfg = FlowerConfig.from_run_config(run_config(model_fn, {"algorithm": algorithm, **settings}, context))

    def log(text: str) -> None:  # Flower's logger, as the fedxrisk ServerApp: `flwr log` shows it
        flwr_log(logging.INFO, "[fedxrisk] %s", text)

    return Coordinator(cfg, GridTransport(grid, cfg), log=log).run()


def make_server_app(model_fn: ModelFn, algorithm: str = "codasca", **settings: Any) -> ServerApp:
    """A ServerApp whose ``main`` is :func:`serve` with these settings."""
    run_config(model_fn, {"algorithm": algorithm, **settings})  # fail now on a bad setting
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        serve(grid, context, model_fn, algorithm, **settings)

    return app

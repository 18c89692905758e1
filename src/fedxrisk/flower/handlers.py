"""The two handlers a site runs, one per message (Flower's ClientApp calls them; tests call them directly).

:func:`site_setup` loads and checks the site's data and reports its counts; :func:`site_step`
restores the site's :class:`~fedxrisk.flower.site.SiteRunner` from its saved packet, runs one
step message and returns the reply with the new saved packet. A site's failure becomes a reply
naming it, which the server reports. ``model_fn`` (any ``nn.Module``) and ``data_fn`` (the site's
data from its node config) replace the run config's ``model`` and :func:`load_site`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from fedxrisk.flower.config import FlowerConfig, ModelFn
from fedxrisk.flower.replay import SiteError
from fedxrisk.flower.site import SiteRunner, init_args
from fedxrisk.flower.site_personal import site_model_path
from fedxrisk.flower.sitedata import SiteData, load_site
from fedxrisk.flower.wire import Packet


def _guard(fn: Callable[[], Packet]) -> Packet:
    """Turn a site's failure into a reply the server reports, instead of a silent crash."""
    try:
        return fn()
    except (ValueError, RuntimeError, KeyError, OSError) as e:
        return Packet(config={"error": f"{type(e).__name__}: {e}"})


DataFn = Callable[[Mapping[str, Any]], SiteData]  # node config → the site's data (instead of load_site)
SiteLoader = Callable[[Mapping[str, Any], FlowerConfig], SiteData]  # (node config, run config) → data


def _config(run_config: Mapping[str, Any], model_fn: ModelFn | None) -> FlowerConfig:
    cfg = FlowerConfig.from_run_config(run_config)
    return cfg if model_fn is None else dataclasses.replace(cfg, model_fn=model_fn)


def _site(
    node_config: Mapping[str, Any], cfg: FlowerConfig, data_fn: DataFn | None, load: SiteLoader | None = None
) -> SiteData:
    if load is not None:  # fedxrisk.flower.api's apps: the user's data function, checked there
        site = load(node_config, cfg)
    elif data_fn is None:
        site = load_site(node_config, cfg)
    else:
        site = data_fn(node_config)
        site.check_classes(cfg.run.allow_missing_class or not cfg.algorithm_class.needs_both_classes)
    site.model_out = site_model_path(node_config)
    return site


def site_setup(
    node_config: Mapping[str, Any],
    run_config: Mapping[str, Any],
    model_fn: ModelFn | None = None,
    data_fn: DataFn | None = None,
    load: SiteLoader | None = None,
) -> Packet:
    """Load and check the site's data; report its size and class counts (nothing else).
    ``model_fn``: any ``nn.Module`` from the input shape, instead of the run config's ``model``;
    ``data_fn``: the site's data from its node config, instead of :func:`load_site`."""

    def go() -> Packet:
        cfg = _config(run_config, model_fn)
        site = _site(node_config, cfg, data_fn, load)
        runner = SiteRunner(cfg, site)
        config = {"input-shape": json.dumps(list(site.input_shape))}
        if site.order is not None:
            config["order"] = site.order
        return Packet(config=config, metrics=runner.setup_metrics())

    return _guard(go)


def site_step(
    node_config: Mapping[str, Any],
    run_config: Mapping[str, Any],
    saved: Packet | None,
    request: Packet,
    model_fn: ModelFn | None = None,
    data_fn: DataFn | None = None,
    load: SiteLoader | None = None,
) -> tuple[Packet, Packet | None]:
    """One step message: restore the site from ``saved``, run, return (reply, new saved state)."""
    out: list[Packet] = []

    def go() -> Packet:
        cfg = _config(run_config, model_fn)
        runner = SiteRunner(cfg, _site(node_config, cfg, data_fn, load))
        c = request.config
        if saved is not None:
            runner.restore(saved)
        elif "client" in c:
            runner.initialize(*init_args(c))
        else:
            raise SiteError("no client state on this node and no initialization in the message")
        reply = runner.step(request)
        out.append(runner.save())
        return reply

    reply = _guard(go)
    return reply, (out[0] if out else saved)

"""The Flower server: :func:`fedxrisk.run.loop.train` driving a :class:`~fedxrisk.flower.federation.Federation`.

The :class:`Coordinator` knows sites only through a
:class:`~fedxrisk.flower.transport.Transport`; it connects the
:class:`~fedxrisk.flower.federation.Federation`, builds the run's
:class:`~fedxrisk.run.build.Setup` around it and hands it to ``train``, which writes
``history.csv``, ``model.pt`` (``last.pt`` with ``selection = "best"``) and ``summary.json``
through a :class:`~fedxrisk.run.folder.RunFolder` in ``out-dir``, as for ``fedxrisk run``.

Node loss policy (``fail``): every exchange waits at most ``round-timeout``
seconds, and checks once a second that the nodes it waits for are still
connected. A site that errs, leaves, or does not answer in time stops the
run with a :class:`FederationError` naming the site, its node and the round;
``summary.json`` records it, ``history.csv`` and ``model.pt`` keep the last
evaluated round. The run is not continued without the site, because the
algorithms' per-client state (control variates, score pools) and their
collective shapes (a gather is ``[K, ...]``) assume a fixed set of clients.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedxrisk.data.types import BinaryData
from fedxrisk.errors import RunFailure
from fedxrisk.flower.config import FlowerConfig
from fedxrisk.flower.federation import Federation
from fedxrisk.flower.secure import check_secure_algorithm
from fedxrisk.flower.transport import FederationError, LocalTransport, Site, Transport
from fedxrisk.outfiles import make_folder
from fedxrisk.run.build import Setup
from fedxrisk.run.callbacks import Callback, LoopState
from fedxrisk.run.folder import RunFolder, json_safe, write_config
from fedxrisk.run.loop import train

__all__ = ["Coordinator", "FederationError", "LocalTransport", "Site", "Transport"]


class Coordinator:
    """Runs one fedxrisk algorithm over the sites a transport reaches."""

    def __init__(
        self,
        cfg: FlowerConfig,
        transport: Transport,
        log: Callable[[str], None] | None = None,
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.cfg, self.log = cfg, log or (lambda msg: None)
        self.federation = Federation(cfg, transport, self.log, poll_interval, clock, sleep)

    def run(self) -> dict[str, Any]:
        """Train; write ``history.csv``, ``model.pt`` and ``summary.json`` to ``out-dir``."""
        check_secure_algorithm(self.cfg)  # before any message or file: SecAgg+ carries means only
        out = Path(self.cfg.deploy.out_dir)
        make_folder(out)
        folder = RunFolder(out)
        try:
            self.federation.connect()
        except Exception as e:  # recorded in summary.json (no round ran), then re-raised
            self.log(f"run failed: {e}")
            folder.write_summary(json_safe(failure_summary(self.federation, e)))
            raise
        setup = server_setup(self.federation)
        write_config(out, setup.config)  # the resolved run: `fedxrisk run --config` reruns it in simulation
        try:
            result = train(setup, folder, [RoundLog(self.log)])
        except Exception as e:
            self.log(f"run failed: {e}")
            if not isinstance(e, RunFailure):  # train() records its own; any other error is recorded here
                folder.write_summary(json_safe(failure_summary(self.federation, e)))
            raise
        self.log(f"run completed: {json.dumps(json_safe(result.summary['final']))}")
        return result.summary


def server_setup(federation: Federation) -> Setup:
    """The run as ``train`` sees it: the run config with the step size and the number of sites it
    trains with (no server checkpoint: each site's state lives on its node), the server's problem
    and algorithm (for its hyperparameters), the server's held-out set as the data, the server's DP."""
    cfg = federation.cfg
    resolved = cfg.resolved(federation.pos_ratio)
    config = dataclasses.replace(resolved, clients=len(federation.sites), checkpoint_every=0)
    return Setup(
        config, server_data(federation), federation.problem, federation.algorithm, federation,  # type: ignore[arg-type]
        privacy=federation.dp,  # type: ignore[arg-type]
    )  # fmt: skip


@dataclasses.dataclass
class ServerData:
    """What the server holds of the data: the held-out set (``data.x_test``; no training input) and
    the sites' class counts. Labels on Flower are the sites' binary 0/1: label 1 is positive."""

    data: BinaryData
    counts: list[tuple[int, int]]
    val_shards: None = None  # validation lives on the sites (Federation.validation_counts)

    @property
    def num_clients(self) -> int:
        return len(self.counts)

    def client_counts(self) -> list[tuple[int, int]]:
        return self.counts

    def client_sites(self) -> None:
        """The server does not know which site a node is (summary.json lists the nodes)."""
        return None


def server_data(federation: Federation) -> ServerData:
    shape = federation.sites[0].input_shape
    x, y = federation.holdout if federation.holdout is not None else (torch.zeros(0, *shape), torch.zeros(0))
    empty = torch.zeros(0, *shape)
    binary = BinaryData("sites", empty, torch.zeros(0), x, y, np.zeros(0, dtype=np.int64), (1,))
    return ServerData(binary, [(s.positives, s.samples - s.positives) for s in federation.sites])


def failure_summary(federation: Federation, error: Exception) -> dict[str, Any]:
    """summary.json of a run stopped by an error ``train`` does not record itself (a failed set-up,
    a refusal met mid-run): the rounds the sites finished; history.csv keeps the evaluated rows."""
    cfg = federation.cfg
    return {
        "status": "failed",
        "error": str(error),
        "algorithm": cfg.run.algorithm,
        "rounds": federation.round,
        **federation.summary_extra(),
        "config": cfg.run.to_dict(),
        "torch_version": torch.__version__,
    }


class RoundLog(Callback):
    """One line per evaluation in the server's log (``flwr log``)."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log

    def on_evaluation(self, row: dict[str, Any], state: LoopState) -> None:
        val = row.get("val_auroc", math.nan)
        shown = "" if math.isnan(val) else f", val AUROC {val:.4f} ± {row['val_auroc_bound']:.1e}"
        self.log(
            f"round {row['round']}/{state.total}: train loss {row['train_loss']:.4f}, test AUROC "
            f"{row['test_auroc']:.4f}, site AUROC {row['client_auroc_mean']:.4f}{shown}"
        )

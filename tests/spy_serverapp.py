"""A spying ServerApp, shipped inside a Flower app (FAB) by ``flower_spy.install_spy`` (test-only code).

Flower hands this ServerApp the Grid of the real ``flwr-serverapp`` process; it passes that same
Grid to the ServerApp under test (``fedxrisk_app:server_app``) after replacing the Grid object's
``push_messages`` and ``pull_messages`` with recording wrappers. Every reply the server process
pulls from the SuperLink — whatever code asked for it (SecAgg+'s workflow, fedxrisk's transport,
``send_and_receive``) — is appended to ``<out-dir>.spy`` (pickles of plain dicts: arrays as numpy,
config and metric records as Python values) before the app under test sees it; the app under
test does not report anything. ``<out-dir>.spy-done`` is written when the app returns or raises
(the traceback), so a test stops waiting for a result that will never come.

Self-contained on purpose (flwr, numpy and the standard library): the FAB holds this file only.
"""

from __future__ import annotations

import importlib
import pickle
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

UNDER_TEST = "fedxrisk_app:server_app"


def spy_paths(out_dir: str | Path) -> tuple[Path, Path]:
    """(record file, done marker) beside the run's ``out-dir``."""
    out = Path(out_dir)
    return out.with_name(out.name + ".spy"), out.with_name(out.name + ".spy-done")


def record(msg: Message) -> dict[str, Any]:
    """One received message as plain data: its metadata and every record of its content."""
    meta = msg.metadata
    out: dict[str, Any] = {
        "src": meta.src_node_id,
        "type": meta.message_type,
        "reply_to": meta.reply_to_message_id,
        "error": msg.error.reason if msg.has_error() else None,
        "arrays": {},
        "configs": {},
        "metrics": {},
    }
    if msg.has_error():
        return out
    content = msg.content
    out["arrays"] = {k: {n: a.numpy() for n, a in r.items()} for k, r in content.array_records.items()}
    out["configs"] = {k: dict(r) for k, r in content.config_records.items()}
    out["metrics"] = {k: dict(r) for k, r in content.metric_records.items()}
    return out


def spy_on(grid: Grid, write: Callable[[dict], None]) -> Grid:
    """``grid`` itself, its push and pull recorded (instance attributes shadow the class's methods,
    so the Grid's own ``send_and_receive`` goes through them too)."""
    push, pull = grid.push_messages, grid.pull_messages

    def push_messages(messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(push(messages))
        for msg, mid in zip(messages, ids):
            write({"push": {"id": mid, "dst": msg.metadata.dst_node_id, "type": msg.metadata.message_type}})
        return ids

    def pull_messages(message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(pull(message_ids))
        for msg in replies:
            write({"reply": record(msg)})
        return replies

    grid.push_messages, grid.pull_messages = push_messages, pull_messages
    return grid


def run_spied(app: Any, grid: Grid, context: Context, out_dir: str | Path) -> None:
    """Run ``app(grid, context)`` with ``grid`` spied on; records to :func:`spy_paths`."""
    path, done = spy_paths(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    failure = ""
    with open(path, "ab") as f:

        def write(item: dict) -> None:
            pickle.dump(item, f)
            f.flush()

        try:
            app(spy_on(grid, write), context)
        except BaseException:
            failure = traceback.format_exc()
            raise
        finally:
            done.write_text(failure or "ok")


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    module, attr = UNDER_TEST.split(":")
    out_dir = str(context.run_config["out-dir"])
    try:
        app = getattr(importlib.import_module(module), attr)
    except BaseException:
        spy_paths(out_dir)[1].write_text(traceback.format_exc())
        raise
    run_spied(app, grid, context, out_dir)

"""An in-process Flower Grid: each pushed Message is handed to the real fedxrisk ClientApp (mods
included) with that node's own Context, so Flower's SecAgg+ workflow and mod run unchanged in
one process. ``replies`` keeps every reply the server pulled (what the server side received)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class InProcessGrid(Grid):
    def __init__(self, client_app: Any, run_config: dict, node_configs: dict[int, dict]):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0  # the ServerApp's
        self.app, self.node_configs = client_app, node_configs
        self.contexts = {
            n: Context(1, n, dict(c), RecordDict(), dict(run_config)) for n, c in node_configs.items()
        }
        self.outbox: dict[str, Message] = {}
        self.replies: list[Message] = []  # every reply the server pulled
        self.requests: list[Message] = []  # every message the server pushed

    def set_run(self, run: Any) -> None:
        pass

    @property
    def run(self) -> Any:
        return type("Run", (), {"run_id": 1})()

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None) -> Message:  # fmt: skip
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def get_nodes(self) -> Iterable[Any]:
        return []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self.requests.append(msg)
            node = msg.metadata.dst_node_id
            delivered = Message(content=copy.deepcopy(msg.content), metadata=copy.deepcopy(msg.metadata))
            try:  # a copy, as a real transport delivers (the workflow shares one record between nodes)
                reply = self.app(delivered, self.contexts[node])
            except Exception as e:  # as a SuperNode reports a ClientApp exception
                reply = Message(Error(code=0, reason=f"{type(e).__name__}: {e}"), reply_to=msg)
            self.outbox[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = [copy.deepcopy(self.outbox.pop(i)) for i in list(message_ids) if i in self.outbox]
        self.replies += out
        return out

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

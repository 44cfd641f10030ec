"""A ServerApp's Grid that notes when each train reply arrives: the per-node times of a Flower round.

Flower's Grid.send_and_receive pushes a round's messages and pulls replies until all are in or the
timeout passes, and hands them over together; when each one came is lost. TimedGrid does the same
loop over the grid's own push_messages and pull_messages and notes, per node, the monotonic time its
reply was pulled. It pulls every PULL_INTERVAL_S: Flower's in-memory grid (Simulation Engine) pulls
every 0.1 s, its HTTP grid (Deployment Engine) every 3 s, which would round every node's time to 3 s.
Every other call goes to the wrapped grid unchanged. Needs the [flower] extra (flwr 1.42).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from flwr.app import Message, MessageType, RecordDict
from flwr.proto.node_pb2 import NodeInfo
from flwr.serverapp import Grid
from flwr.supercore.run import Run

PULL_INTERVAL_S = 0.1  # a reply's time is known to within this (and one pull's own time)


@dataclass
class TrainExchange:
    """One round's train messages as TimedGrid saw them (time.monotonic() seconds)."""

    pushed_at: float  # the messages had been handed to the grid (pushed)
    replied_at: dict[int, float] = field(default_factory=dict)  # node id -> its reply was pulled


class TimedGrid(Grid):
    """`grid`, with each train round's exchange kept in `last` (the evaluate rounds' are not timed)."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.last: TrainExchange | None = None

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Flower's send_and_receive (push, then pull until every reply is in or `timeout` passed), timed."""
        messages = list(messages)
        if not messages or any(m.metadata.message_type != MessageType.TRAIN for m in messages):
            return self.grid.send_and_receive(messages, timeout=timeout)
        msg_ids = set(self.grid.push_messages(messages))
        exchange = self.last = TrainExchange(pushed_at=time.monotonic())
        end = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        while timeout is None or time.time() < end:
            pulled = list(self.grid.pull_messages(msg_ids))
            now = time.monotonic()
            for reply in pulled:
                exchange.replied_at.setdefault(reply.metadata.src_node_id, now)
            replies.extend(pulled)
            msg_ids.difference_update({m.metadata.reply_to_message_id for m in pulled})
            if not msg_ids:
                break
            time.sleep(PULL_INTERVAL_S)
        return replies

    # ---- the rest is the wrapped grid's ----------------------------------------------------------

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[NodeInfo]:
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

"""The agent's log, kept for the coordinator: records since the last SendLog, sent after each round and at the end.

A device's log then lands in the run's folder (coordinator/agent_logs.py) instead of staying in
a Pi's journal: the experimenter of a campaign over a fleet reads every device's log beside
the coordinator's. The buffer is bounded (the oldest records go first, and are counted), so a
device cut off from its coordinator for hours keeps its memory; a batch that could not be sent
stays for the next try. Shipping never stops training: a failed send is retried after the next
round, and a coordinator without SendLog (UNIMPLEMENTED) is not asked again.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from flexfl.exchange import LogKept, LogLine

MAX_BUFFERED = 5000  # records; at ~190 bytes each about 1 MiB: an agent at INFO logs about one a round
BATCH_LINES = 200  # per SendLog call: inside fleet.proto's 256
# The call that delivers a batch (edge_agent.transport.Transport.send_log): its LogKept, None when it was not sent.
SendLog = Callable[[list[LogLine], int], LogKept | None]


class LogBuffer(logging.Handler):
    """A logging handler that keeps records as LogLines until they are sent (take / sent)."""

    def __init__(self, *, level: int = logging.INFO, max_records: int = MAX_BUFFERED) -> None:
        super().__init__(level)
        self._records: deque[LogLine] = deque()
        self._max = max_records
        self._held = threading.Lock()
        self.dropped = 0  # records pushed out before they were sent

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
            line = LogLine(time_s=record.created, level=record.levelname, logger=record.name, message=message)
        except Exception:
            self.handleError(record)
            return
        with self._held:
            if len(self._records) >= self._max:
                self._records.popleft()
                self.dropped += 1
            self._records.append(line)

    def take(self, limit: int = BATCH_LINES) -> tuple[list[LogLine], int]:
        """The oldest `limit` records not yet sent and the count dropped so far (they stay until sent())."""
        with self._held:
            return [self._records[i] for i in range(min(limit, len(self._records)))], self.dropped

    def sent(self, lines: int, dropped: int) -> None:
        """The first `lines` records and `dropped` of the dropped count reached the coordinator."""
        with self._held:
            for _ in range(min(lines, len(self._records))):
                self._records.popleft()
            self.dropped -= min(dropped, self.dropped)

    def __len__(self) -> int:
        return len(self._records)


def ship(buffer: LogBuffer, send: SendLog) -> bool:
    """Send what `buffer` holds now in batches; False when a batch could not be sent (it stays for the next try).

    Records logged while sending wait for the next call, so that a send that logs cannot keep it going."""
    batches = len(buffer) // BATCH_LINES + 1
    for _ in range(batches):
        lines, dropped = buffer.take()
        if not lines and not dropped:
            break
        if send(lines, dropped) is None:
            return False
        buffer.sent(len(lines), dropped)
    return True

"""The devices' own logs in the coordinator's output folder: agent_logs/<device id>.log, one line per record.

Agents send their log records (SendLog, proto/fleet.proto) after each round and when they stop or
fail, so a run's folder holds every device's log, also for a fleet of Pis whose agents are
services the experimenter never logs in to (campaigns with --fleet). Each device's file is
capped (server.max_agent_log_mib): past it, lines are dropped and counted, and the file says so
once. A device id that cannot name a file in the folder is refused, not cleaned into another
device's name. Appends are flushed, not fsynced: a log is worth less than a round's metrics row,
and the agents send a batch every round.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flexfl.errors import LogRejected
from flexfl.exchange import LogKept, LogLine

if TYPE_CHECKING:
    from coordinator.config import CoordinatorConfig

log = logging.getLogger(__name__)

AGENT_LOGS_DIR = "agent_logs"
MAX_BATCH_LINES = 256  # fleet.proto's LogBatch: 256 x 8 KiB stays inside one 4 MiB message
MAX_MESSAGE_CHARS = 8192
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# A file name on every file system a results folder is copied to: no separators, no leading dot.
_FILE_SAFE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


def log_file_name(device_id: str) -> str:
    """agent_logs/'s file for `device_id`; LogRejected when the id cannot name a file there as it is."""
    if not _FILE_SAFE.fullmatch(device_id):
        raise LogRejected(f"device id {device_id!r} cannot name a log file (letters, digits, '.', '_' and '-', "
                          "at most 128, not starting with '.'): its log lines are not kept")
    return f"{device_id}.log"


def format_line(line: LogLine) -> str:
    """One record as its file shows it: UTC time, level, logger, message (continuation lines indented)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(line.time_s))
    millis = int((line.time_s % 1) * 1000)
    message = line.message.replace("\r\n", "\n").replace("\n", "\n    ")
    return f"{stamp}.{millis:03d}Z {line.level} {line.logger}: {message}\n"


def checked_lines(lines: list[LogLine], *, device_id: str) -> list[LogLine]:
    """The batch's lines as they will be kept, messages cut to MAX_MESSAGE_CHARS; LogRejected names the first
    line that is not a log record (a time that is no Unix time, an unknown level, too many lines)."""
    if len(lines) > MAX_BATCH_LINES:
        raise LogRejected(f"{device_id}: a log batch holds at most {MAX_BATCH_LINES} lines, got {len(lines)}")
    out = []
    for i, line in enumerate(lines):
        if not (math.isfinite(line.time_s) and 0 <= line.time_s < 2**33):
            raise LogRejected(f"{device_id}: log line {i}: time_s {line.time_s!r} is not a Unix time")
        if line.level not in LEVELS:
            raise LogRejected(f"{device_id}: log line {i}: level {line.level[:40]!r} is not one of {', '.join(LEVELS)}")
        message = line.message
        if len(message) > MAX_MESSAGE_CHARS:
            message = f"{message[:MAX_MESSAGE_CHARS]} ... [cut: {len(line.message)} characters]"
        out.append(LogLine(time_s=line.time_s, level=line.level, logger=line.logger[:200], message=message))
    return out


@dataclass
class _DeviceLog:
    bytes_written: int
    full: bool = False


class AgentLogs:
    """Appends devices' log lines to `folder`/<device id>.log, at most `max_bytes` per device (thread-safe)."""

    def __init__(self, folder: Path, *, max_bytes: int) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._devices: dict[str, _DeviceLog] = {}
        self._last_batch: dict[str, float] = {}  # device -> time.monotonic() of its last batch

    @classmethod
    def of(cls, cfg: CoordinatorConfig) -> AgentLogs:
        """The coordinator's: output.dir/agent_logs/, server.max_agent_log_mib per device."""
        return cls(Path(cfg.output.dir) / AGENT_LOGS_DIR, max_bytes=int(cfg.server.max_agent_log_mib * (1 << 20)))

    def sent_since(self, since: float) -> frozenset[str]:
        """The devices that sent a batch after time.monotonic() `since`."""
        with self._lock:
            return frozenset(d for d, at in self._last_batch.items() if at > since)

    def append(self, device_id: str, lines: list[LogLine], *, dropped_by_device: int = 0) -> LogKept:
        """Keep what fits of `lines` in the device's file; what became of them."""
        path = self.folder / log_file_name(device_id)
        lines = checked_lines(lines, device_id=device_id)
        with self._lock:
            self._last_batch[device_id] = time.monotonic()
        if self.max_bytes == 0:  # server.max_agent_log_mib = 0: no device logs kept
            return LogKept(kept=0, dropped=len(lines) + dropped_by_device)
        text = [format_line(line) for line in lines]
        if dropped_by_device:
            text.append(format_line(LogLine(time_s=time.time(), level="WARNING", logger="coordinator.agent_logs",
                                            message=f"the device dropped {dropped_by_device} log records before "
                                                    "sending them (its buffer was full)")))
        with self._lock:
            state = self._devices.get(device_id)
            if state is None:
                size = path.stat().st_size if path.exists() else 0  # a resumed run appends to its file
                state = self._devices[device_id] = _DeviceLog(bytes_written=size, full=size >= self.max_bytes)
            kept = []
            for piece in text:
                if state.full or state.bytes_written + len(piece.encode()) > self.max_bytes:
                    break
                kept.append(piece)
                state.bytes_written += len(piece.encode())
            refused = len(text) - len(kept)
            if refused and not state.full:
                state.full = True
                kept.append(f"[coordinator: this log reached server.max_agent_log_mib "
                            f"({self.max_bytes / 2**20:g} MiB); later lines are dropped]\n")
                log.warning("%s: its log reached %d bytes; dropping its later lines", device_id, self.max_bytes)
            if kept:
                self.folder.mkdir(parents=True, exist_ok=True)
                with open(path, "a", encoding="utf-8") as f:
                    f.write("".join(kept))
        n_kept = min(len(lines), len(text) - refused)
        return LogKept(kept=n_kept, dropped=len(lines) - n_kept + dropped_by_device)

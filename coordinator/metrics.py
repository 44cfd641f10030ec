"""Per-round metrics as JSON lines (one object per round), flushed as each round ends.

Each line is a coordinator.rules.round_record.RoundRecord, written by the live coordinator (which
adds transfer sizes and timings) and by the simulator alike, so that every run is read,
compared and reported the same way. `read_metrics` reads a finished file, `MetricsTail` one
that a running coordinator is still writing (`flexfl live` and the trace recorder follow it).
Both give RoundRecords; a line that is a row but not a valid record raises RoundRecordError
naming the file and line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from coordinator.rules.round_record import RoundRecord, clean_json
from flexfl.files import atomic_file


def write_run_info(run_dir: Path, *, kind: str, config: dict[str, Any], devices: dict[str, dict[str, Any]],
                   deadline_s: float | None, required_updates: int) -> Path:
    """RUN_DIR/run.json: what a run was (live or sim), its config and its devices' traces and shards."""
    path = Path(run_dir) / "run.json"
    with atomic_file(path) as f:
        json.dump(clean_json({"kind": kind, "config": config, "devices": devices, "deadline_s": deadline_s,
                              "required_updates": required_updates}), f, indent=1)
    return path


class MetricsWriter:
    def __init__(self, path: Path, *, append: bool) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a" if append else "w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Append one row and fsync it: once this returns, the row survives a crash."""
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        """Append rows in order with one fsync: once this returns, they all survive a crash."""
        self._file.write("".join(json.dumps(clean_json(r), sort_keys=False) + "\n" for r in records))
        self._file.flush()
        os.fsync(self._file.fileno())

    @staticmethod
    def rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
        """Replace the file's rows atomically (a resumed run dropping rows it will write again)."""
        with atomic_file(path) as f:
            for row in rows:
                f.write(json.dumps(clean_json(row)) + "\n")

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def read_metrics(path: Path) -> list[RoundRecord]:
    """All complete rows of a metrics file (a torn last line from a crash is skipped)."""
    return read_metrics_and_torn(path)[0]


def read_metrics_and_torn(path: Path) -> tuple[list[RoundRecord], list[str]]:
    """The rows of a metrics file, and the lines that are not rows (torn by a crash mid-write,
    or not newline-terminated: a row appended after such a fragment would be glued to it)."""
    rows, torn = [], []
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    for i, line in enumerate(lines):
        unterminated = i == len(lines) - 1 and not text.endswith("\n")
        row = None if unterminated else _row(line, where=f"{path}:{i + 1}")
        if row is not None:
            rows.append(row)
        elif line.strip():
            torn.append(line)
    return rows, torn


class MetricsTail:
    """A metrics file that is still being written, read as it grows: each call reads only what is new.

    The rules are read_metrics's: a line without its newline yet waits for the next call, a
    torn line is skipped. When the file was replaced or shrank (a resumed coordinator rewrites
    it without the rows of rounds it will run again: MetricsWriter.rewrite), the tail starts
    over, so it never holds a row the file no longer has, nor misses one written since.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._rows: list[RoundRecord] = []
        self._offset = 0
        self._lines = 0  # complete lines read, for the line numbers of errors
        self._file_id: tuple[int, int] | None = None

    @property
    def offset(self) -> int:
        """Bytes of the file read so far (the next call reads from here)."""
        return self._offset

    def rows(self) -> list[RoundRecord]:
        """The file's rows so far, in file order (an empty list while there is no file)."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            self._rows, self._offset, self._lines, self._file_id = [], 0, 0, None
            return []
        with f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != self._file_id or st.st_size < self._offset:
                self._rows, self._offset, self._lines, self._file_id = [], 0, 0, (st.st_dev, st.st_ino)
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            self._lines += 1
            row = _row(line, where=f"{self.path}:{self._lines}")
            if row is not None:
                self._rows.append(row)
        return list(self._rows)


def _row(line: str, *, where: str) -> RoundRecord | None:
    """A metrics row, or None for a line that is not one (torn by a crash); RoundRecordError for a
    JSON object that has a round but is not a valid record."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return RoundRecord.from_json(row, where=where) if isinstance(row, dict) and "round" in row else None

"""The trace-set format: a folder with `manifest.json` and one `<name>.csv` per trace.

A trace is, per round, the fraction of the required local updates a device submitted
before the deadline (0 = nothing arrived: inactive). The README in `traces/` is the
user-facing description of the format; this module is its only reader and writer.

Reading validates everything and every error is a `TraceFormatError` whose message reads
`<file>:<line>: field '<field>': <problem>`, so a corrupt file is fixed, never guessed at.
Writing is atomic per file, and the manifest goes last: a folder without a manifest is
never a valid set, so an interrupted write cannot pass for a complete one.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flexfl.errors import ConfigError, TraceFormatError
from flexfl.files import atomic_file
from trace_recorder.manifest import (
    KINDS,
    MANIFEST_NAME,
    NAME_RE,
    NAME_RULE,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    TraceManifest,
    format_error,
    parse_manifest,
    shorten,
    utc_now_iso,
)

__all__ = [
    "KINDS", "MANIFEST_NAME", "REQUIRED_COLUMNS", "SCHEMA_VERSION", "SUPPORTED_SCHEMA_VERSIONS",
    "Trace", "TraceManifest", "TraceSet", "read_trace_csv", "read_trace_set", "utc_now_iso",
    "write_trace_set",
]

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("round", "fraction")
_INT_RE = re.compile(r"^[+-]?[0-9]+\Z")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # integer columns are read into int64 arrays


@dataclass(frozen=True, eq=False)  # eq=False: comparing numpy arrays with == is not a bool
class Trace:
    """One trace: per round, the fraction of required updates submitted (0 = inactive).

    Arrays are copied and made read-only on construction, so a Trace is really frozen.
    `extra` holds any further numeric columns (e.g. train_s, upload_s, upload_bytes), in
    column order; integer columns stay int64, the rest are float64.
    """

    name: str
    round: np.ndarray  # int64, strictly increasing, >= 0
    fraction: np.ndarray  # float64 in [0, 1]
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def fail(column: str, problem: str) -> TraceFormatError:
            return TraceFormatError(f"trace '{self.name}': field '{column}': {problem}")

        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise TraceFormatError(
                f"trace {shorten(repr(self.name))}: field 'name': not a plain name ({NAME_RULE})"
            )
        rounds = _column(self.round, "round", fail, integer=True)
        fractions = _column(self.fraction, "fraction", fail, integer=False)
        n = len(rounds)
        if n == 0:
            raise fail("round", "no rounds (a trace needs at least one)")
        if len(fractions) != n:
            raise fail("fraction", f"{len(fractions)} values for {n} rounds")
        bad = np.flatnonzero(rounds < 0)
        if bad.size:
            raise fail("round", f"value {rounds[bad[0]]} at row {bad[0] + 1} is negative")
        bad = np.flatnonzero(np.diff(rounds) <= 0)
        if bad.size:
            i = bad[0] + 1
            raise fail("round", f"value {rounds[i]} at row {i + 1} does not increase "
                                f"(previous {rounds[i - 1]})")
        bad = np.flatnonzero((fractions < 0) | (fractions > 1))
        if bad.size:
            raise fail("fraction", f"value {fractions[bad[0]]!r} at row {bad[0] + 1} outside 0..1")
        extra: dict[str, np.ndarray] = {}
        for col, values in self.extra.items():
            if not isinstance(col, str) or not NAME_RE.match(col) or col in REQUIRED_COLUMNS:
                raise fail(str(col), "not a usable extra column name")
            arr = _column(values, col, fail, integer=None)
            if len(arr) != n:
                raise fail(col, f"{len(arr)} values for {n} rounds")
            extra[col] = arr
        object.__setattr__(self, "round", rounds)
        object.__setattr__(self, "fraction", fractions)
        object.__setattr__(self, "extra", extra)

    def __len__(self) -> int:
        return len(self.round)

    @property
    def mean_pct(self) -> float:
        """Mean percentage of required updates submitted (100 * mean fraction)."""
        return float(100.0 * self.fraction.mean())

    @property
    def std_pct(self) -> float:
        """Population standard deviation (ddof=0) of 100 * fraction, in percentage points."""
        return float(100.0 * self.fraction.std(ddof=0))

    @property
    def zero_share(self) -> float:
        """Share of rounds with nothing submitted (fraction == 0: inactive)."""
        return float(np.mean(self.fraction == 0.0))


def _column(values: Any, column: str, fail: Any, *, integer: bool | None) -> np.ndarray:
    """A read-only 1-D copy; integer=None keeps integer input as int64, else float64."""
    arr = np.array(values, copy=True)
    if arr.size == 0:  # np.array([]) is float64 whatever the column; emptiness is judged later
        arr = arr.astype(np.int64 if integer else np.float64)
    if arr.ndim != 1:
        raise fail(column, f"expected a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind in "biu" and integer is not False:
        arr = arr.astype(np.int64)
    elif integer:
        raise fail(column, f"expected integers, got dtype {arr.dtype}")
    elif arr.dtype.kind in "biuf":
        arr = arr.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise fail(column, f"value {arr[bad[0]]} at row {bad[0] + 1} is not finite")
    else:
        raise fail(column, f"expected numbers, got dtype {arr.dtype}")
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True)
class TraceSet:
    """A trace set as read from disk; traces are in manifest order."""

    path: Path
    manifest: TraceManifest
    traces: tuple[Trace, ...]

    def first(self, j: int) -> tuple[Trace, ...]:
        """The first j traces: the paper's |T| = j."""
        if isinstance(j, bool) or not isinstance(j, int) or not 1 <= j <= len(self.traces):
            raise ConfigError(
                f"|T| = {j!r} is out of range 1..{len(self.traces)} for trace set {self.path}"
            )
        return self.traces[:j]

    def get(self, name: str) -> Trace:
        """The trace called `name`."""
        for trace in self.traces:
            if trace.name == name:
                return trace
        raise ConfigError(
            f"trace set {self.path} has no trace '{name}' (has: {', '.join(self.manifest.traces)})"
        )


def read_trace_csv(path: Path, *, name: str) -> Trace:
    """Read and validate one trace CSV (header with `round`, `fraction`, optional extras)."""
    path = Path(path)
    try:
        data = path.read_bytes()  # a trace is small; whole, the line of a bad byte is known
    except FileNotFoundError:
        raise format_error(path, 1, "header", "file missing") from None
    except OSError as exc:
        raise format_error(path, 1, "header", f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise format_error(path, line, "header" if line == 1 else "row",
                           f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return _parse_csv(reader, path=path, name=name)
    except csv.Error as exc:
        line = max(reader.line_num, 1)
        raise format_error(path, line, "header" if line == 1 else "row", f"not readable as CSV ({exc})") from None


def _parse_csv(reader: Any, *, path: Path, name: str) -> Trace:
    header: list[str] | None = None
    columns: list[list[Any]] = []
    blank_line = 0  # first blank line seen since the last data row; fine if nothing follows
    data_rows = 0
    for row in reader:
        line = reader.line_num
        if header is None:
            header = [cell.strip() for cell in row]
            _check_header(header, path=path)
            columns = [[] for _ in header]
            continue
        if not any(cell.strip() for cell in row):
            blank_line = blank_line or line
            continue
        if blank_line:
            raise format_error(path, blank_line, header[0],
                               "blank line inside the data (only trailing blank lines are allowed)")
        if len(row) < len(header):
            raise format_error(path, line, header[len(row)],
                               f"missing (line has {len(row)} fields, header has {len(header)})")
        if len(row) > len(header):
            raise format_error(path, line, f"column {len(header) + 1}",
                               f"unexpected value {shorten(repr(row[len(header)].strip()))} "
                               f"(header has {len(header)} fields)")
        for col, (key, text) in enumerate(zip(header, row)):
            prev = columns[col][-1] if columns[col] else None
            columns[col].append(_parse_value(text.strip(), key=key, path=path, line=line, prev=prev))
        data_rows += 1
    if header is None:
        raise format_error(path, 1, "header", "file is empty (expected a header with 'round' and 'fraction')")
    if data_rows == 0:
        raise format_error(path, 2, "round", "no data rows (a trace needs at least one round)")
    values = dict(zip(header, columns))
    extra = {key: _as_array(values[key]) for key in header if key not in REQUIRED_COLUMNS}
    return Trace(
        name=name,
        round=np.array(values["round"], dtype=np.int64),
        fraction=np.array(values["fraction"], dtype=np.float64),
        extra=extra,
    )


def _check_header(header: list[str], *, path: Path) -> None:
    if not any(header):
        raise format_error(path, 1, "header", "empty first line (expected a header with 'round' and 'fraction')")
    for key in REQUIRED_COLUMNS:
        if key not in header:
            # repr: a quoted column name may hold a newline or a NUL, and the message stays one line
            raise format_error(path, 1, key, f"header has no '{key}' column (columns: "
                                             f"{shorten(', '.join(map(repr, header)), 80)})")
    seen: set[str] = set()
    for i, key in enumerate(header):
        if not key:
            raise format_error(path, 1, f"column {i + 1}", "empty column name")
        if not NAME_RE.match(key):
            raise format_error(path, 1, key, f"not a plain column name ({NAME_RULE})")
        if key in seen:
            raise format_error(path, 1, key, "duplicate column")
        seen.add(key)


def _parse_value(text: str, *, key: str, path: Path, line: int, prev: Any) -> int | float:
    shown = shorten(text.encode("unicode_escape").decode("ascii").replace("'", "\\'"), 40)  # one line
    if key == "round":
        try:
            value: int | float = int(text)
        except ValueError:
            raise format_error(path, line, key, f"value '{shown}' is not an integer") from None
        if value < 0:
            raise format_error(path, line, key, f"value '{shown}' is negative")
        if value > _INT64_MAX:
            raise format_error(path, line, key, f"value '{shown}' is above {_INT64_MAX} (a 64-bit integer)")
        if prev is not None and value <= prev:
            raise format_error(path, line, key, f"value '{shown}' does not increase (previous round {prev})")
        return value
    try:
        # Extra columns keep integers as integers (bytes, flags); fractions are floats.
        value = float(text) if key == "fraction" or not _INT_RE.match(text) else int(text)
    except ValueError:
        raise format_error(path, line, key, f"value '{shown}' is not a number") from None
    if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
        raise format_error(path, line, key, f"value '{shown}' is outside the 64-bit integer range")
    if not np.isfinite(value):
        raise format_error(path, line, key, f"value '{shown}' is not finite")
    if key == "fraction" and not 0.0 <= value <= 1.0:
        raise format_error(path, line, key, f"value '{shown}' outside 0..1")
    return value


def _as_array(values: list[int | float]) -> np.ndarray:
    # A column written entirely as integers (e.g. upload_bytes, arrived) reads back as int64.
    if all(isinstance(v, int) for v in values):
        return np.array(values, dtype=np.int64)
    return np.array(values, dtype=np.float64)


def read_trace_set(path: Path) -> TraceSet:
    """Read and validate a trace-set folder (manifest plus every listed trace)."""
    path = Path(path)
    manifest_path = path / MANIFEST_NAME
    if path.is_file():
        # Not "<file>/manifest.json: ...": a path that cannot exist sends one looking for the wrong thing.
        hint = (f"validate the folder that holds it and its manifest.json: {path.parent}"
                if (path.parent / MANIFEST_NAME).is_file()
                else "a set is a folder with manifest.json and the trace CSVs")
        raise format_error(path, 1, "manifest", f"a trace file, not a trace-set folder; {hint}")
    if not path.is_dir():
        raise format_error(manifest_path, 1, "manifest", f"no trace-set folder at {path}")
    if not manifest_path.is_file():
        raise format_error(manifest_path, 1, "manifest",
                           "file missing (not a trace set, or its writing was interrupted)")
    try:
        data = manifest_path.read_bytes()
        text = data.decode("utf-8")
    except OSError as exc:
        raise format_error(manifest_path, 1, "manifest", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise format_error(manifest_path, data.count(b"\n", 0, exc.start) + 1, "manifest",
                           f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    manifest, lines = parse_manifest(text, path=manifest_path)

    traces_line = lines.get("traces", 1)
    listed = set(manifest.traces)
    unlisted = sorted(p.name for p in path.glob("*.csv") if p.stem not in listed)
    if unlisted:
        raise format_error(
            manifest_path, traces_line, "traces",
            f"manifest lists {len(listed)} traces but the folder holds {len(listed) + len(unlisted)} "
            f"trace files; not listed: {', '.join(unlisted)}",
        )
    traces = []
    for name in manifest.traces:
        csv_path = path / f"{name}.csv"
        if not csv_path.is_file():
            raise format_error(manifest_path, traces_line, "traces",
                               f"listed trace '{name}' has no file {csv_path}")
        traces.append(read_trace_csv(csv_path, name=name))
    log.debug("read trace set %s: %d traces", path, len(traces))
    return TraceSet(path=path, manifest=manifest, traces=tuple(traces))


def write_trace_set(path: Path, manifest: TraceManifest, traces: Sequence[Trace]) -> None:
    """Write a trace set atomically: each file via a temp name + os.replace, manifest last.

    Creates the folder. Refuses a folder that holds a different set; rewriting a set with
    the same trace names (or finishing an interrupted write of them) is allowed.
    """
    path = Path(path)
    manifest_path = path / MANIFEST_NAME
    # Validate exactly what a reader will see, before touching the disk.
    parse_manifest(manifest.to_json(), path=manifest_path)
    names = tuple(t.name for t in traces)
    if names != manifest.traces:
        raise ConfigError(f"manifest lists traces {list(manifest.traces)} but {list(names)} were given")
    _check_target(path, set(names))

    path.mkdir(parents=True, exist_ok=True)
    if manifest_path.exists():
        # Drop the old manifest first: until the new one lands, the folder is not a valid
        # set, so a crash mid-rewrite can't leave old metadata over a mix of files.
        manifest_path.unlink()
        _fsync_dir(path)
    for trace in traces:
        _atomic_write(path / f"{trace.name}.csv", _trace_csv_text(trace))
    _atomic_write(manifest_path, manifest.to_json())
    _fsync_dir(path)
    log.info("wrote trace set %s (%d traces)", path, len(traces))


def _check_target(path: Path, names: set[str]) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path} exists and is not a folder")
    if not path.is_dir():
        return
    existing = {p.stem for p in path.glob("*.csv")}
    manifest_path = path / MANIFEST_NAME
    if manifest_path.exists():
        try:
            old = json.loads(manifest_path.read_text(encoding="utf-8"))
            old_names = set(old["traces"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{path} holds an unreadable manifest ({exc}); remove the folder or pick another"
            ) from None
        if old_names != names:
            raise ConfigError(
                f"{path} holds a different trace set (traces {sorted(old_names)}); "
                "write to a fresh folder or remove it first"
            )
    stray = sorted(existing - names)
    if stray:
        raise ConfigError(
            f"{path} holds other trace files ({', '.join(f'{n}.csv' for n in stray)}); "
            "write to a fresh folder or remove them"
        )


def _trace_csv_text(trace: Trace) -> str:
    header = ["round", "fraction", *trace.extra]
    # repr(float) is the shortest text that parses back to the identical double.
    cols = [[str(int(r)) for r in trace.round], [repr(float(x)) for x in trace.fraction]]
    for values in trace.extra.values():
        if values.dtype.kind == "i":
            cols.append([str(int(v)) for v in values])
        else:
            cols.append([repr(float(v)) for v in values])
    rows = (",".join(cells) for cells in zip(*cols))
    return ",".join(header) + "\n" + "\n".join(rows) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    # Temp names start with "." and end in ".tmp": never mistaken for a trace or manifest.
    with atomic_file(path) as f:
        f.write(text)


def _fsync_dir(path: Path) -> None:
    # Makes the renames themselves durable; not possible on every platform.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

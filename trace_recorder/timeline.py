"""Device timelines: each device's CPU share, bandwidth and online state over time, as a CSV file.

A trace says how much work a device got done per round; a timeline says under which
conditions, so that the simulator (through trace_recorder.deadline) and, later, the emulated
fleet can both run from one description. traces/README.md ("Device timelines") is the
user-facing description of the format; this module is its only reader and writer.

    # comment lines (provenance) may come before the header
    device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online
    dev-0,0,30,1.0,8000,8000,1
    dev-0,30,45,0.25,800,8000,1

The time columns name their unit: `start_s,end_s` (seconds from the run's start) or
`start_round,end_round` (round ids, integers). A row covers start <= t < end; a device's rows
come in time order and never overlap; a time no row of a device covers is offline.
Reading validates everything; every error is a TraceFormatError of the trace files' one
shape, `<file>:<line>: field '<field>': <problem>`.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from flexfl.errors import ConfigError, TraceFormatError
from flexfl.files import atomic_file
from trace_recorder.manifest import NAME_RE, NAME_RULE, format_error, shorten

log = logging.getLogger(__name__)


class TimeUnit(StrEnum):
    SECOND = "s"
    ROUND = "round"


CONDITION_COLUMNS = ("cpu_share", "up_kbit_s", "down_kbit_s", "online")


def header_for(unit: TimeUnit) -> tuple[str, ...]:
    """The header line's columns for a timeline in `unit`."""
    return ("device", f"start_{unit.value}", f"end_{unit.value}", *CONDITION_COLUMNS)


@dataclass(frozen=True)
class Conditions:
    """A device's conditions during one interval.

    cpu_share: the part of the device's full compute it gets, 0..1 (an update takes
    update_s / cpu_share); up_kbit_s, down_kbit_s: link rates, kbit/s (1000 bit/s), >= 0;
    online: whether the device can take part at all.
    """

    cpu_share: float
    up_kbit_s: float
    down_kbit_s: float
    online: bool

    def __post_init__(self) -> None:
        for name in CONDITION_COLUMNS:
            value = getattr(self, name)
            problem = condition_problem(name, value)
            if problem:
                raise TraceFormatError(f"conditions: field '{name}': value {value!r} {problem}")


def condition_problem(name: str, value: object) -> str | None:
    """Why `value` is not valid for condition column `name` ("is negative"), or None.

    The one rule the reader and the constructors share.
    """
    if name == "online":
        return None if isinstance(value, bool) else "is not 0 or 1"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "is not a number"
    if not math.isfinite(value):
        return "is not finite"
    if value < 0:
        return "is negative"
    if name == "cpu_share" and value > 1:
        return "is above 1 (a share of the device's full compute)"
    return None


# What a device is at a time its timeline does not cover.
OFFLINE = Conditions(cpu_share=0.0, up_kbit_s=0.0, down_kbit_s=0.0, online=False)


@dataclass(frozen=True)
class Interval:
    """Conditions that hold for start <= t < end (seconds or round ids, per the timeline's unit)."""

    start: float
    end: float
    conditions: Conditions


@dataclass(frozen=True, eq=False)
class Timeline:
    """Per device (in file order), its intervals in time order; uncovered times are offline."""

    unit: TimeUnit
    devices: Mapping[str, Sequence[Interval]]  # stored as tuples
    _starts: dict[str, list[float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "unit", TimeUnit(self.unit))
        devices = {name: tuple(rows) for name, rows in self.devices.items()}
        if not devices:
            raise TraceFormatError("timeline: no devices")
        for name, rows in devices.items():
            where = f"timeline: device {shorten(repr(name))}"
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise TraceFormatError(f"{where}: field 'device': not a plain name ({NAME_RULE})")
            if not rows:
                raise TraceFormatError(f"{where}: no intervals")
            previous: Interval | None = None
            for i, row in enumerate(rows):
                for column, value in (("start", row.start), ("end", row.end)):
                    problem = time_problem(value, self.unit)
                    if problem:
                        raise TraceFormatError(f"{where}: interval {i + 1}: field '{column}': value {value!r} "
                                               f"{problem}")
                problem = order_problem(row.start, row.end, previous)
                if problem:
                    raise TraceFormatError(f"{where}: interval {i + 1}: field 'start': {problem}")
                previous = row
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "_starts", {name: [r.start for r in rows] for name, rows in devices.items()})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timeline) and (self.unit, dict(self.devices)) == (other.unit, dict(other.devices))

    @property
    def end(self) -> float:
        """The latest end of any interval: beyond it every device is offline."""
        return max(rows[-1].end for rows in self.devices.values())

    def conditions_at(self, device: str, t: float) -> Conditions:
        """`device`'s conditions at time `t` (seconds or round id); OFFLINE where no interval covers t."""
        rows = self.devices.get(device)
        if rows is None:
            raise ConfigError(f"the timeline has no device {device!r} ({describe_names(list(self.devices))})")
        i = bisect.bisect_right(self._starts[device], t) - 1
        return rows[i].conditions if i >= 0 and t < rows[i].end else OFFLINE


def describe_names(names: Sequence[str]) -> str:
    """'3 devices: dev-0, dev-1, dev-2' (the first few when there are many)."""
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return f"{len(names)} device{'s' if len(names) != 1 else ''}: {shown}"


def time_problem(value: object, unit: TimeUnit) -> str | None:
    """Why `value` is not a valid start or end time in `unit` ("is negative"), or None."""
    if unit is TimeUnit.ROUND:
        if isinstance(value, bool) or not isinstance(value, int):
            return "is not an integer (round ids)"
    elif isinstance(value, bool) or not isinstance(value, int | float):
        return "is not a number"
    elif not math.isfinite(value):
        return "is not finite"
    if value < 0:
        return "is negative"
    return None


def order_problem(start: float, end: float, previous: Interval | None, previous_line: int | None = None) -> str | None:
    """Why an interval [start, end) cannot follow `previous` of the same device, or None."""
    if end <= start:
        return f"interval [{start}, {end}) is empty (end must be after start)"
    if previous is None:
        return None
    where = f" on line {previous_line}" if previous_line else ""
    if start < previous.start:
        return (f"interval [{start}, {end}) comes before [{previous.start}, {previous.end}){where} "
                "(rows of a device go in time order)")
    if start < previous.end:
        return f"interval [{start}, {end}) overlaps [{previous.start}, {previous.end}){where}"
    return None


def read_timeline(path: Path) -> Timeline:
    """Read and validate a timeline CSV; a TraceFormatError names file, line and field."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise format_error(path, 1, "header", f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise format_error(path, data.count(b"\n", 0, exc.start) + 1, "header",
                           f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()  # trailing blank lines are fine
    n = 0
    while n < len(lines) and lines[n].startswith("#"):
        n += 1
    if n == len(lines):
        raise format_error(path, n + 1, "header", "no header (expected " + ",".join(header_for(TimeUnit.SECOND)) + ")")
    unit = _read_header(lines[n], path=path, line=n + 1)
    header = header_for(unit)
    devices: dict[str, list[Interval]] = {}
    last_line: dict[str, int] = {}
    for number, line in enumerate(lines[n + 1:], start=n + 2):
        cells = [cell.strip() for cell in line.split(",")]
        if not any(cells):
            raise format_error(path, number, "device",
                               "blank line inside the data (only trailing blank lines are allowed)")
        if len(cells) != len(header):
            column = header[len(cells)] if len(cells) < len(header) else f"column {len(header) + 1}"
            raise format_error(path, number, column, f"line has {len(cells)} fields, the header {len(header)}")
        name = cells[0]
        if not NAME_RE.match(name):
            raise format_error(path, number, "device", f"value {shorten(repr(name))} is not a plain name ({NAME_RULE})")
        start, end = (_parse_time(cells[i], unit, path=path, line=number, column=header[i]) for i in (1, 2))
        share, up, down = (float(_parse_condition(cells[i], header[i], path=path, line=number)) for i in (3, 4, 5))
        online = bool(_parse_condition(cells[6], header[6], path=path, line=number))
        rows = devices.setdefault(name, [])
        problem = order_problem(start, end, rows[-1] if rows else None, last_line.get(name))
        if problem:
            raise format_error(path, number, header[1], f"device '{name}': {problem}")
        rows.append(Interval(start=start, end=end, conditions=Conditions(share, up, down, online)))
        last_line[name] = number
    if not devices:
        raise format_error(path, n + 2, "device", "no data rows (a timeline needs at least one interval)")
    timeline = Timeline(unit=unit, devices=devices)
    log.debug("read timeline %s: %s", path, describe_names(list(devices)))
    return timeline


def _read_header(text: str, *, path: Path, line: int) -> TimeUnit:
    columns = [cell.strip() for cell in text.split(",")]
    expected = header_for(TimeUnit.SECOND)
    if len(columns) != len(expected):
        raise format_error(path, line, "header", f"{len(columns)} columns, expected {len(expected)}: "
                           f"{','.join(expected)} (or start_round,end_round)")
    units = []
    for column, kind in zip(columns[1:3], ("start", "end")):
        prefix = f"{kind}_"
        if not column.startswith(prefix):
            raise format_error(path, line, column, f"expected {kind}_s or {kind}_round here")
        unit = column.removeprefix(prefix)
        if unit not in {u.value for u in TimeUnit}:
            raise format_error(path, line, column, f"unknown time unit {shorten(repr(unit))} "
                               f"(use {kind}_s for seconds or {kind}_round for round ids)")
        units.append(TimeUnit(unit))
    if units[0] is not units[1]:
        raise format_error(path, line, columns[2], f"unit differs from {columns[1]} (start and end share one unit)")
    for got, want in zip(columns, header_for(units[0])):
        if got != want:
            raise format_error(path, line, got, f"expected column '{want}' here "
                               f"(header: {','.join(header_for(units[0]))})")
    return units[0]


def _shown(text: str) -> str:
    """A value from the file as an error shows it: control characters escaped (one line), cut short."""
    return shorten(text if text.isprintable() else text.encode("unicode_escape").decode("ascii"), 40)


def _parse_time(text: str, unit: TimeUnit, *, path: Path, line: int, column: str) -> float:
    shown = _shown(text)
    try:
        value: float = int(text) if unit is TimeUnit.ROUND else float(text)
    except ValueError:
        kind = "an integer (round ids)" if unit is TimeUnit.ROUND else "a number"
        raise format_error(path, line, column, f"value '{shown}' is not {kind}") from None
    problem = time_problem(value, unit)
    if problem:
        raise format_error(path, line, column, f"value '{shown}' {problem}")
    return value


def _parse_condition(text: str, column: str, *, path: Path, line: int) -> float | bool:
    shown = _shown(text)
    if column == "online":
        if text not in ("0", "1"):
            raise format_error(path, line, column, f"value '{shown}' is not 0 or 1")
        return text == "1"
    try:
        value = float(text)
    except ValueError:
        raise format_error(path, line, column, f"value '{shown}' is not a number") from None
    problem = condition_problem(column, value)
    if problem:
        raise format_error(path, line, column, f"value '{shown}' {problem}")
    return value


def write_timeline(path: Path, timeline: Timeline, *, comments: Sequence[str] = ()) -> None:
    """Write `timeline` atomically (flexfl.files.atomic_file), `comments` as '# ' lines before the header."""
    for comment in comments:
        if "\n" in comment or "\r" in comment:
            raise ConfigError(f"a timeline comment is one line, got {shorten(repr(comment))}")
    with atomic_file(Path(path)) as f:
        for comment in comments:
            f.write(f"# {comment}\n")
        f.write(",".join(header_for(timeline.unit)) + "\n")
        for name, rows in timeline.devices.items():
            for row in rows:
                c = row.conditions
                # repr(float): the shortest text that reads back as the same double.
                f.write(f"{name},{_time_text(row.start)},{_time_text(row.end)},{float(c.cpu_share)!r},"
                        f"{float(c.up_kbit_s)!r},{float(c.down_kbit_s)!r},{int(c.online)}\n")
    log.info("wrote timeline %s: %s", path, describe_names(list(timeline.devices)))


def _time_text(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))

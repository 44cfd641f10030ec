"""The trace-set manifest: schema, validation, and JSON parsing with line numbers.

`trace_recorder.format` re-exports everything public here; import from there.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flexfl.errors import TraceFormatError

SCHEMA_VERSION = 1
SUPPORTED_SCHEMA_VERSIONS = (1,)
MANIFEST_NAME = "manifest.json"
KINDS = ("calibrated", "recorded")

# Trace and column names end up in file names and CSV headers: keep them plain. No leading
# "." either, so a name can never collide with the writer's hidden temp files. At most 200
# characters: `<name>.csv` and the writer's temp names must fit a file name (255 bytes).
# \Z, not $: "$" also matches before a trailing newline.
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}\Z")
NAME_RULE = "letters, digits, _ . -; at most 200 characters"
_PLAIN_FIELD = re.compile(r"[\w .\-\[\]#]*")
_JSON_WS = re.compile(r"[ \t\n\r]*")


def format_error(file: Path | str, line: int, field_name: str, problem: str) -> TraceFormatError:
    """The one shape of every reading error: `<file>:<line>: field '<field>': <problem>`.

    A field name from the file itself (an unknown key) may hold quotes or newlines; it is
    shown escaped and cut short, so the message stays one line of this shape.
    """
    if not _PLAIN_FIELD.fullmatch(field_name):
        field_name = field_name.encode("unicode_escape").decode("ascii").replace("'", "\\'")
    return TraceFormatError(f"{file}:{line}: field '{shorten(field_name)}': {problem}")


def shorten(text: str, limit: int = 60) -> str:
    """`text`, or its start and end around "..." when longer than `limit` characters."""
    return text if len(text) <= limit else f"{text[:limit // 2 - 2]}...{text[-(limit // 2 - 2):]}"


def utc_now_iso() -> str:
    """The current time as an ISO 8601 UTC timestamp, e.g. `2024-05-01T12:00:00Z`."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class TraceManifest:
    """What a trace set is, where it came from, and which traces it holds (in order)."""

    schema_version: int
    name: str
    kind: str  # "calibrated" (generated to match published statistics) or "recorded"
    description: str
    source: dict  # how/where it was made: command line, seed, tool versions, date
    required_updates: int  # E while recording, or the grid resolution of generated fractions
    deadline_s: float | None
    traces: tuple[str, ...]  # ordered; trace `n` lives in `n.csv`
    conditions: dict  # trace name -> load condition, e.g. {"cpu_load_pct": 30}
    hosts: tuple[dict, ...]  # host facts of a recording; empty for calibrated sets
    created: str  # ISO 8601 UTC

    def to_json(self) -> str:
        """The manifest as indented JSON text (what `manifest.json` holds)."""
        d = asdict(self)
        d["traces"] = list(self.traces)
        d["hosts"] = list(self.hosts)
        try:
            # allow_nan=False: JSON has no NaN, and a reader elsewhere would choke on it.
            return json.dumps(d, indent=2, allow_nan=False) + "\n"
        except (TypeError, ValueError) as exc:
            raise TraceFormatError(
                f"manifest of set '{self.name}' cannot be written as JSON: {exc}"
            ) from exc

    @classmethod
    def from_dict(
        cls, d: Any, *, path: Path | str, lines: Mapping[str, int] | None = None
    ) -> TraceManifest:
        """Validate a parsed manifest; `lines` maps keys to their line in `path` for errors."""
        fields = _Fields(d, path=path, lines=lines)
        # The version first: a newer writer may have changed every other field.
        version = _take_version(fields, known=[f.name for f in cls.__dataclass_fields__.values()])
        name = fields.take("name", (str,), "a string")
        if not name.strip():
            raise fields.fail("name", "empty")
        kind = fields.take("kind", (str,), "a string")
        if kind not in KINDS:
            raise fields.fail("kind", f"value {shorten(repr(kind))} is not one of {', '.join(KINDS)}")
        description = fields.take("description", (str,), "a string")
        source = fields.take("source", (dict,), "an object")
        required_updates = fields.take("required_updates", (int,), "an integer")
        if required_updates < 1:
            raise fields.fail("required_updates", f"value {shorten(str(required_updates))} is not >= 1")
        deadline_s = _take_deadline(fields)
        traces = _take_traces(fields)
        conditions = _take_conditions(fields, traces=traces)
        hosts = _take_hosts(fields)
        created = _take_created(fields)
        return cls(
            schema_version=version,
            name=name,
            kind=kind,
            description=description,
            source=source,
            required_updates=required_updates,
            deadline_s=deadline_s,
            traces=traces,
            conditions=conditions,
            hosts=hosts,
            created=created,
        )


class _Fields:
    """A parsed manifest being validated: typed reads of its keys, errors at their line."""

    def __init__(self, d: Any, *, path: Path | str, lines: Mapping[str, int] | None) -> None:
        self.path = path
        self.key_lines = dict(lines or {})
        if not isinstance(d, dict):
            raise self.fail("manifest", f"expected a JSON object, got {_json_type(d)}")
        self.d: dict = d

    def fail(self, key: str, problem: str) -> TraceFormatError:
        return format_error(self.path, self.key_lines.get(key, 1), key, problem)

    def take(self, key: str, types: tuple[type, ...], what: str) -> Any:
        if key not in self.d:
            raise self.fail(key, "missing")
        value = self.d[key]
        # bool is an int in Python but never a valid count or version here.
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise self.fail(key, f"expected {what}, got {_json_type(value)}")
        return value


def _take_version(fields: _Fields, *, known: list[str]) -> int:
    """The schema version, checked before anything else; then no key outside `known`."""
    version: int = fields.take("schema_version", (int,), "an integer")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        supported = ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)
        raise fields.fail("schema_version",
                          f"unsupported version {shorten(str(version))}; this reader supports {supported}")
    for key in fields.d:
        if key not in known:
            raise fields.fail(key, f"unknown field (schema {version} has: {', '.join(known)})")
    return version


def _take_deadline(fields: _Fields) -> float | None:
    """`deadline_s`: null, or a positive finite number of seconds (as a float)."""
    deadline_s = fields.take("deadline_s", (int, float, type(None)), "a number or null")
    if deadline_s is None:
        return None
    if not (isinstance(deadline_s, float) or -(2**1023) < deadline_s < 2**1023):
        raise fields.fail("deadline_s", f"value {shorten(str(deadline_s))} is too large for a number of seconds")
    deadline_s = float(deadline_s)
    if not math.isfinite(deadline_s) or deadline_s <= 0:
        raise fields.fail("deadline_s", f"value {deadline_s} is not a positive number")
    return deadline_s


def _take_traces(fields: _Fields) -> tuple[str, ...]:
    """`traces`: a non-empty list of distinct plain names, in order."""
    traces = fields.take("traces", (list,), "an array of trace names")
    if not traces:
        raise fields.fail("traces", "no traces listed")
    seen: set[str] = set()
    for t in traces:
        if not isinstance(t, str) or not NAME_RE.match(t):
            raise fields.fail("traces", f"value {shorten(repr(t))} is not a plain name ({NAME_RULE})")
        if t in seen:
            raise fields.fail("traces", f"duplicate trace name '{t}'")
        seen.add(t)
    return tuple(traces)


def _take_conditions(fields: _Fields, *, traces: tuple[str, ...]) -> dict:
    """`conditions`: an object per listed trace (not every trace needs one)."""
    conditions: dict = fields.take("conditions", (dict,), "an object")
    listed = set(traces)
    for t, cond in conditions.items():
        if t not in listed:
            raise fields.fail("conditions", f"condition given for unlisted trace {shorten(repr(t))}")
        if not isinstance(cond, dict):
            raise fields.fail("conditions", f"condition of '{t}' is {_json_type(cond)}, not an object")
    return conditions


def _take_hosts(fields: _Fields) -> tuple[dict, ...]:
    """`hosts`: a list of objects (empty for calibrated sets)."""
    hosts = fields.take("hosts", (list,), "an array of objects")
    for i, host in enumerate(hosts):
        if not isinstance(host, dict):
            raise fields.fail("hosts", f"entry {i} is {_json_type(host)}, not an object")
    return tuple(hosts)


def _take_created(fields: _Fields) -> str:
    """`created`: an ISO 8601 time with a zone, kept as written."""
    created: str = fields.take("created", (str,), "a string")
    try:
        stamp = datetime.fromisoformat(created)
    except ValueError:
        stamp = None
    if stamp is None or stamp.tzinfo is None:
        raise fields.fail("created", f"value {shorten(repr(created))} is not an ISO 8601 time with zone, "
                                     "e.g. 2024-05-01T12:00:00Z")
    return created


def parse_manifest(text: str, *, path: Path | str) -> tuple[TraceManifest, dict[str, int]]:
    """Parse and validate manifest text; also returns the line of each top-level key."""
    try:
        raw = json.loads(text)
        lines = _top_level_key_lines(text, path=path) if isinstance(raw, dict) else {}
    except json.JSONDecodeError as exc:
        raise format_error(path, exc.lineno, "manifest",
                           f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # json.loads: an integer literal of more than 4300 digits
        raise format_error(path, 1, "manifest", f"not readable as JSON: {exc}") from None
    except RecursionError:
        raise format_error(path, 1, "manifest", "not readable as JSON: arrays or objects nested too deeply") from None
    return TraceManifest.from_dict(raw, path=path, lines=lines), lines


def _top_level_key_lines(text: str, *, path: Path | str) -> dict[str, int]:
    """Line of each top-level key of a JSON object already known to parse; rejects duplicates."""
    decoder = json.JSONDecoder()
    idx = _skip_ws(text, 0) + 1  # past "{"
    idx = _skip_ws(text, idx)
    lines: dict[str, int] = {}
    while text.startswith('"', idx):
        line = text.count("\n", 0, idx) + 1
        key, idx = decoder.raw_decode(text, idx)  # a JSON string: the key
        if key in lines:
            # json.loads silently keeps the last one; a hand-edited duplicate is a mistake.
            raise format_error(path, line, key, f"duplicate key (first on line {lines[key]})")
        lines[key] = line
        idx = _skip_ws(text, idx) + 1  # past ":"
        _, idx = decoder.raw_decode(text, _skip_ws(text, idx))
        idx = _skip_ws(text, idx)
        if text.startswith(",", idx):
            idx = _skip_ws(text, idx + 1)
    return lines


def _skip_ws(text: str, idx: int) -> int:
    """The index of the first non-whitespace character at or after `idx` (_JSON_WS matches the empty string too)."""
    match = _JSON_WS.match(text, idx)
    return match.end() if match else idx


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "an integer", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)

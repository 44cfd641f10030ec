"""The daemon's wire format: one JSON object per request and per reply (schema in README.md).

`parse_request` turns raw bytes into a typed command or raises ProtocolError with a
message naming the command and field, which the daemon sends back as the error reply.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.bandwidth import MAX_RATE_KBIT, MIN_BURST_BYTES
from loadgen.errors import ProtocolError
from loadgen.netns import is_valid_ifname

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Status:
    pass


@dataclass(frozen=True)
class Clear:
    pass


@dataclass(frozen=True)
class SetCpu:
    percent: float


@dataclass(frozen=True)
class SetBandwidth:
    rate_kbit: int
    burst_bytes: int | None = None
    latency_ms: float = 50.0
    iface: str | None = None  # None: the daemon's default interface


Command = Ping | Status | Clear | SetCpu | SetBandwidth


# -- field checks: each returns the value or a description of what was expected --------
class _Bad(Exception):
    def __init__(self, expected: str) -> None:
        self.expected = expected


def _number(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[Any], float]:
    bracket = "(" if lo_open else "["
    expected = f"a number in {bracket}{lo:g}, {hi:g}]"

    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _Bad(expected)
        if v < lo or v > hi or (lo_open and v == lo):
            raise _Bad(expected)
        return float(v)

    check.expected = expected  # type: ignore[attr-defined]
    return check


def _integer(lo: int, hi: int, *, nullable: bool = False) -> Callable[[Any], int | None]:
    expected = f"an integer in [{lo}, {hi}]" + (" or null" if nullable else "")

    def check(v: Any) -> int | None:
        if v is None and nullable:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _Bad(expected)
        return v

    check.expected = expected  # type: ignore[attr-defined]
    return check


def _iface(v: Any) -> str | None:
    if v is None:
        return None
    if not is_valid_ifname(v):
        raise _Bad(_iface.expected)  # type: ignore[attr-defined]
    return v


_iface.expected = "an interface name (1-15 characters, no '/', ':' or spaces) or null"  # type: ignore[attr-defined]

# cmd -> (command class, {field: (required, check)})
_SCHEMA: dict[str, tuple[type, dict[str, tuple[bool, Callable[[Any], Any]]]]] = {
    "ping": (Ping, {}),
    "status": (Status, {}),
    "clear": (Clear, {}),
    "set_cpu": (SetCpu, {"percent": (True, _number(0, 100))}),
    "set_bandwidth": (SetBandwidth, {
        "rate_kbit": (True, _integer(1, MAX_RATE_KBIT)),
        "burst_bytes": (False, _integer(MIN_BURST_BYTES, 1 << 30, nullable=True)),
        "latency_ms": (False, _number(0, 60_000, lo_open=True)),
        "iface": (False, _iface),
    }),
}
COMMANDS = tuple(_SCHEMA)


def parse_request(raw: bytes) -> Command:
    """Decode and validate one request; raise ProtocolError naming what is wrong."""
    if len(raw) > MAX_REQUEST_BYTES:
        raise ProtocolError(f"request is {len(raw)} bytes; the limit is {MAX_REQUEST_BYTES}")
    try:
        msg = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"request is not UTF-8 text: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"request is not valid JSON: {exc}") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"request must be a JSON object, got {_json_type(msg)}")
    return parse_message(msg)


def parse_message(msg: dict[str, Any]) -> Command:
    """Validate an already-decoded request object."""
    if "cmd" not in msg:
        raise ProtocolError(f"missing field 'cmd' (one of {', '.join(COMMANDS)})")
    cmd = msg["cmd"]
    if not isinstance(cmd, str):
        raise ProtocolError(f"field 'cmd' must be a string, got {_show(cmd)}")
    if cmd not in _SCHEMA:
        raise ProtocolError(f"unknown cmd {cmd!r} (one of {', '.join(COMMANDS)})")
    cls, fields = _SCHEMA[cmd]
    unknown = sorted(set(msg) - set(fields) - {"cmd"})
    if unknown:
        allowed = ", ".join(fields) or "none"
        raise ProtocolError(f"{cmd}: unknown field(s) {', '.join(map(repr, unknown))} (allowed: {allowed})")
    values: dict[str, Any] = {}
    for name, (required, check) in fields.items():
        if name not in msg:
            if required:
                raise ProtocolError(f"{cmd}: missing field {name!r} ({check.expected})")  # type: ignore[attr-defined]
            continue
        try:
            values[name] = check(msg[name])
        except _Bad as bad:
            raise ProtocolError(f"{cmd}: field {name!r} must be {bad.expected}, got {_show(msg[name])}") from None
    return cls(**values)


def command_name(command: Command) -> str:
    """The wire name of a command ("set_cpu", ...)."""
    return next(k for k, (cls, _) in _SCHEMA.items() if type(command) is cls)


def to_message(command: Command) -> dict[str, Any]:
    """The JSON object for a command (the inverse of `parse_message`)."""
    return {"cmd": command_name(command), **vars(command)}


def ok_reply(**fields: Any) -> bytes:
    return _encode({"ok": True, **fields})


def error_reply(error: str) -> bytes:
    return _encode({"ok": False, "error": error})


def decode_reply(raw: bytes) -> dict[str, Any]:
    """Parse a reply; raise ProtocolError if it is not a JSON object with a boolean 'ok'."""
    try:
        reply = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"reply is not valid JSON: {exc}") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise ProtocolError(f"reply must be an object with a boolean 'ok', got {_show(reply)}")
    return reply


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, default=str, separators=(",", ":")).encode()


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "number", float: "number"}.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    text = json.dumps(v, default=str)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({_json_type(v)})"

"""Request validation: every malformed kind is rejected with a message naming the field."""

import json

import pytest

from loadgen.errors import ProtocolError
from loadgen.protocol import (
    MAX_REQUEST_BYTES,
    Clear,
    Ping,
    SetBandwidth,
    SetCpu,
    Status,
    command_name,
    decode_reply,
    parse_message,
    parse_request,
    to_message,
)


def _raw(obj) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize("raw, expected", [
    (b"\xff\xfe", "not UTF-8"),
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[1, 2]", "JSON object, got array"),
    (b'"ping"', "JSON object, got string"),
    (b"null", "JSON object, got null"),
    (_raw({}), "missing field 'cmd'"),
    (_raw({"cmd": 3}), "field 'cmd' must be a string"),
    (_raw({"cmd": "reboot"}), "unknown cmd 'reboot'"),
    (_raw({"cmd": "ping", "extra": 1}), "ping: unknown field(s) 'extra'"),
    (_raw({"cmd": "set_cpu"}), "set_cpu: missing field 'percent'"),
    (_raw({"cmd": "set_cpu", "percent": "30"}),
     "set_cpu: field 'percent' must be a number in [0, 100], got \"30\" (string)"),
    (_raw({"cmd": "set_cpu", "percent": True}), "field 'percent' must be a number"),
    (_raw({"cmd": "set_cpu", "percent": None}), "field 'percent' must be a number"),
    (_raw({"cmd": "set_cpu", "percent": 100.5}), "field 'percent' must be a number in [0, 100], got 100.5"),
    (_raw({"cmd": "set_cpu", "percent": -1}), "field 'percent'"),
    (b'{"cmd": "set_cpu", "percent": NaN}', "field 'percent'"),
    (_raw({"cmd": "set_cpu", "pct": 30}), "set_cpu: unknown field(s) 'pct' (allowed: percent)"),
    (_raw({"cmd": "set_bandwidth"}), "set_bandwidth: missing field 'rate_kbit'"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 4000.5}), "field 'rate_kbit' must be an integer"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 0}), "field 'rate_kbit' must be an integer in [1,"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 10**12}), "field 'rate_kbit'"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 4000, "burst_bytes": 10}),
     "field 'burst_bytes' must be an integer in [3028,"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 4000, "burst_bytes": "big"}), "field 'burst_bytes'"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 4000, "latency_ms": 0}),
     "field 'latency_ms' must be a number in (0, 60000]"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 4000, "latency_ms": "50ms"}), "field 'latency_ms'"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 4000, "iface": "eth0; rm -rf /"}),
     "field 'iface' must be an interface name"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 4000, "iface": "a" * 16}), "field 'iface'"),
    (_raw({"cmd": "set_bandwidth", "rate_kbit": 4000, "iface": 7}), "field 'iface'"),
    (_raw({"cmd": "clear", "iface": "eth0"}), "clear: unknown field(s) 'iface' (allowed: none)"),
    (b" " * (MAX_REQUEST_BYTES + 1), "the limit is"),
])
def test_malformed_requests_name_the_problem(raw, expected):
    with pytest.raises(ProtocolError) as err:
        parse_request(raw)
    assert expected in str(err.value)


def test_valid_requests_parse_to_commands_with_defaults():
    assert parse_request(b'{"cmd": "ping"}') == Ping()
    assert parse_request(b'{"cmd": "status"}') == Status()
    assert parse_request(b'{"cmd": "clear"}') == Clear()
    assert parse_request(b'{"cmd": "set_cpu", "percent": 30}') == SetCpu(30.0)
    assert parse_request(b'{"cmd": "set_cpu", "percent": 0}') == SetCpu(0.0)
    assert parse_request(_raw({"cmd": "set_bandwidth", "rate_kbit": 4000})) == SetBandwidth(4000, None, 50.0, None)
    full = {"cmd": "set_bandwidth", "rate_kbit": 4000, "burst_bytes": None, "latency_ms": 20, "iface": "veth0"}
    assert parse_request(_raw(full)) == SetBandwidth(4000, None, 20.0, "veth0")


@pytest.mark.parametrize("command", [Ping(), Status(), Clear(), SetCpu(70.0),
                                     SetBandwidth(1000, 6000, 25.0, "eth1")])
def test_to_message_round_trips(command):
    assert parse_message(to_message(command)) == command
    assert to_message(command)["cmd"] == command_name(command)


@pytest.mark.parametrize("raw", [b"nope", b"[]", b'{"error": "x"}', b'{"ok": "yes"}'])
def test_bad_replies_are_rejected(raw):
    with pytest.raises(ProtocolError):
        decode_reply(raw)


def test_good_reply_decodes():
    assert decode_reply(b'{"ok": false, "error": "x"}') == {"ok": False, "error": "x"}

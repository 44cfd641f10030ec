"""`flexfl loadgen serve|send|clean`, driven through argparse and the handlers directly."""

import argparse
import json
import threading

import pytest

from flexfl.errors import ConfigError
from loadgen import cli
from loadgen.daemon import DaemonConfig, LoadgenDaemon
from loadgen.errors import ShapingError


def _parse(argv):
    parser = argparse.ArgumentParser(prog="flexfl")
    sub = parser.add_subparsers(dest="command", required=True)
    cli.register(sub)
    return parser.parse_args(argv)


def test_parser_wires_handlers():
    assert _parse(["loadgen", "serve"]).func is cli.cmd_serve
    args = _parse(["loadgen", "serve", "--bind", "tcp://0.0.0.0:5601", "--iface", "eth0", "--nice", "-5"])
    assert (args.bind, args.iface, args.nice) == ("tcp://0.0.0.0:5601", "eth0", -5)
    assert _parse(["loadgen", "clean", "--iface", "a", "--iface", "b"]).iface == ["a", "b"]
    with pytest.raises(SystemExit):
        _parse(["loadgen", "send", "--endpoint", "tcp://x:1"])  # neither --cmd nor --json
    with pytest.raises(SystemExit):
        _parse(["loadgen", "send", "--endpoint", "tcp://x:1", "--cmd", "ping", "--json", "{}"])


def test_build_message_takes_only_given_flags():
    args = _parse(["loadgen", "send", "--endpoint", "e", "--cmd", "set_bandwidth",
                   "--rate-kbit", "4000", "--iface", "eth0"])
    assert cli.build_message(args) == {"cmd": "set_bandwidth", "rate_kbit": 4000, "iface": "eth0"}
    args = _parse(["loadgen", "send", "--endpoint", "e", "--cmd", "set_cpu", "--percent", "30"])
    assert cli.build_message(args) == {"cmd": "set_cpu", "percent": 30.0}


@pytest.fixture
def endpoint(fakes):
    FakeCpu, FakeShaper = fakes
    daemon = LoadgenDaemon(DaemonConfig(bind="tcp://127.0.0.1:*", poll_interval_s=0.05),
                           cpu=FakeCpu(), shaper=FakeShaper())
    ep = daemon.bind()
    thread = threading.Thread(target=daemon.serve, daemon=True)
    thread.start()
    try:
        yield ep
    finally:
        daemon.stop()
        thread.join(timeout=5)


def test_send_prints_one_json_line_per_endpoint(endpoint, capsys):
    args = _parse(["loadgen", "send", "--endpoint", endpoint, "--cmd", "set_cpu", "--percent", "30"])
    assert args.func(args) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["endpoint"] == endpoint and line["reply"]["cpu"]["target_percent"] == 30.0

    args = _parse(["loadgen", "send", "--endpoint", endpoint, "--endpoint", "tcp://127.0.0.1:9",
                   "--timeout-s", "0.5", "--json", '{"cmd": "ping"}'])
    assert args.func(args) == 1
    out, err = capsys.readouterr()
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["reply"]["ok"] for x in lines] == [True, False]
    assert "1 of 2 failed: tcp://127.0.0.1:9" in err


def test_send_json_with_field_flags_is_rejected():
    args = _parse(["loadgen", "send", "--endpoint", "e", "--json", "{}", "--percent", "3"])
    with pytest.raises(ConfigError, match="--percent cannot be combined with --json"):
        args.func(args)


def test_send_raw_json_is_validated_by_the_daemon(endpoint, capsys):
    args = _parse(["loadgen", "send", "--endpoint", endpoint, "--json", '{"cmd": "set_cpu"}'])
    assert args.func(args) == 1
    assert "missing field 'percent'" in json.loads(capsys.readouterr().out)["reply"]["error"]


def test_clean_clears_each_iface(monkeypatch, capsys):
    calls = []
    from loadgen import bandwidth

    def fake_clear(dev, *, netns=None):
        calls.append((dev, netns))
        return dev == "a"

    monkeypatch.setattr(bandwidth, "clear", fake_clear)
    args = _parse(["loadgen", "clean", "--iface", "a", "--iface", "b", "--netns", "ns1"])
    assert args.func(args) == 0
    assert calls == [("a", "ns1"), ("b", "ns1")]
    assert capsys.readouterr().out.splitlines() == ["a: removed root qdisc", "b: no qdisc to remove"]

    def failing_clear(dev, *, netns=None):
        raise ShapingError(f"no such interface {dev!r}")

    monkeypatch.setattr(bandwidth, "clear", failing_clear)
    with pytest.raises(ShapingError, match="no such interface 'zz'"):
        args.func(_parse(["loadgen", "clean", "--iface", "zz"]))

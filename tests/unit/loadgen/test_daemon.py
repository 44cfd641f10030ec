"""The daemon over real ZeroMQ on loopback, with fake CPU load and shaper (no root, no stress-ng)."""

import threading
import time

import pytest
import zmq

from flexfl.errors import ConfigError
from loadgen.client import FleetClient, LoadgenClient
from loadgen.cpu import CpuLoad
from loadgen.daemon import DaemonConfig, LoadgenDaemon
from loadgen.errors import DaemonError


def test_every_command_is_answered(served, wait_until):
    _daemon, client, cpu, shaper = served
    assert client.ping()["pong"] is True
    assert client.set_cpu(30)["cpu"]["target_percent"] == 30.0
    assert cpu.target_percent == 30.0
    reply = client.set_bandwidth(4000)  # the daemon's default iface
    assert reply["bandwidth"] == {"veth0": {"rate_kbit": 4000, "burst_bytes": 5000, "latency_ms": 50.0}}
    client.set_bandwidth(1000, burst_bytes=8000, latency_ms=20, iface="veth1")
    wait_until(lambda: client.status()["cpu"]["measured"] is not None, "a CPU measurement")
    status = client.status()
    assert status["cpu"]["target_percent"] == 30.0
    assert status["cpu"]["measured"]["achieved_percent"] == 30.0
    assert set(status["bandwidth"]) == {"veth0", "veth1"}
    assert status["default_iface"] == "veth0"
    assert status["uptime_s"] > 0 and status["version"] and status["host"]["cpu_count_logical"] >= 1
    cleared = client.clear()
    assert sorted(cleared["cleared_ifaces"]) == ["veth0", "veth1"]
    assert shaper.installed == {} and cpu.target_percent == 0
    assert client.status()["bandwidth"] == {}


@pytest.mark.parametrize("raw, expected", [
    (b"{garbage", "not valid JSON"),
    (b"[]", "must be a JSON object"),
    (b'{"cmd": "explode"}', "unknown cmd 'explode'"),
    (b'{"cmd": "set_cpu", "percent": 130}', "set_cpu: field 'percent'"),
    (b'{"cmd": "set_cpu", "percent": 66}', "set_cpu: stress-ng exited at once"),
    (b'{"cmd": "set_bandwidth", "rate_kbit": 10, "iface": "nosuch0"}', "set_bandwidth: no such interface 'nosuch0'"),
    (b'{"cmd": "set_bandwidth", "rate_kbit": 10, "iface": "boom0"}',
     "set_bandwidth: internal error: RuntimeError: a bug"),
])
def test_malformed_or_failing_request_gets_error_and_daemon_keeps_serving(served, raw, expected):
    _, client, _, _ = served
    reply = client.request_raw(raw)
    assert reply["ok"] is False
    assert expected in reply["error"]
    assert client.ping()["ok"] is True


def test_multipart_request_gets_error(served):
    daemon, client, _, _ = served
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(daemon.endpoint)
    try:
        sock.send_multipart([b'{"cmd": "ping"}', b"more"])
        assert sock.poll(5000)
        assert "one message frame" in sock.recv_json()["error"]
    finally:
        sock.close()
    assert client.ping()["ok"]


def test_error_reply_raises_daemon_error_naming_endpoint(served):
    daemon, client, _, _ = served
    with pytest.raises(DaemonError, match=f"{daemon.endpoint}.*set_cpu: field 'percent'"):
        client.set_cpu(101)


def test_set_bandwidth_without_iface_needs_default(fakes):
    FakeCpu, FakeShaper = fakes
    daemon = LoadgenDaemon(DaemonConfig(bind="tcp://127.0.0.1:*"), cpu=FakeCpu(), shaper=FakeShaper())
    reply = daemon.handle(b'{"cmd": "set_bandwidth", "rate_kbit": 100}')
    assert b"'iface' is required" in reply and b'"ok":false' in reply


def test_missing_stress_ng_is_reported(fakes):
    _, FakeShaper = fakes
    cpu = CpuLoad(cpus=1, stress_ng="no-such-stress-ng-binary")
    daemon = LoadgenDaemon(DaemonConfig(bind="tcp://127.0.0.1:*"), cpu=cpu, shaper=FakeShaper())
    reply = daemon.handle(b'{"cmd": "set_cpu", "percent": 30}')
    assert b"apt-get install stress-ng" in reply and b'"ok":false' in reply
    assert b'"ok":true' in daemon.handle(b'{"cmd": "set_cpu", "percent": 0}')  # 0 needs no stress-ng


def test_stop_cleans_up_cpu_and_qdiscs(served):
    daemon, client, cpu, shaper = served
    client.set_cpu(50)
    client.set_bandwidth(2000, iface="veth3")
    daemon.stop()
    deadline = time.monotonic() + 5
    while (shaper.installed or not cpu.stopped) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert shaper.installed == {} and cpu.stopped


def test_bind_conflict_is_a_clear_error(served, fakes):
    FakeCpu, FakeShaper = fakes
    daemon, _, _, _ = served
    other = LoadgenDaemon(DaemonConfig(bind=daemon.endpoint), cpu=FakeCpu(), shaper=FakeShaper())
    with pytest.raises(DaemonError, match="cannot bind"):
        other.bind()


def test_client_timeout_raises_and_recovers():
    """No reply in time -> DaemonError naming the endpoint; the next call uses a fresh socket."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    client = LoadgenClient(endpoint, timeout_s=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(DaemonError, match=f"no reply from loadgen daemon at {endpoint} within 0.3 s"):
            client.ping()
        assert time.monotonic() - t0 < 2
        assert router.poll(1000)
        router.recv_multipart()  # the unanswered request

        def answer_once():
            if router.poll(5000):
                ident, empty, _ = router.recv_multipart()
                router.send_multipart([ident, empty, b'{"ok": true, "pong": true}'])

        responder = threading.Thread(target=answer_once)
        responder.start()
        client.timeout_s = 5
        assert client.ping()["pong"] is True  # a stuck REQ socket could not even send this
        responder.join()
    finally:
        client.close()
        router.close()


def test_fleet_client_reports_each_daemon_and_waits_once(served):
    daemon, _, cpu, _ = served
    dead = [f"tcp://127.0.0.1:{port}" for port in (7, 9, 13, 19)]  # nothing answers ZeroMQ there
    with FleetClient([daemon.endpoint, *dead], timeout_s=0.5) as fleet:
        t0 = time.monotonic()
        replies = fleet.broadcast({"cmd": "ping"})
        # One shared deadline: waiting per daemon would take 4 x 0.5 s.
        assert time.monotonic() - t0 < 1.5
        assert replies[daemon.endpoint]["ok"] is True
        for endpoint in dead:
            assert replies[endpoint]["ok"] is False and endpoint in replies[endpoint]["error"]
        with pytest.raises(DaemonError, match="4 of 5 loadgen daemon"):
            fleet.set_cpu(40)
        assert cpu.target_percent == 40.0  # the live daemon still got it
    with FleetClient([daemon.endpoint], timeout_s=5) as fleet:
        assert fleet.status()[daemon.endpoint]["cpu"]["target_percent"] == 40.0
        replies = fleet.call_each({daemon.endpoint: {"cmd": "set_cpu", "percent": 10}})
        assert replies[daemon.endpoint]["cpu"]["target_percent"] == 10.0


@pytest.mark.parametrize("kwargs", [{"measure_interval_s": 0}, {"poll_interval_s": -1}, {"nice": 20},
                                    {"cpus": 0}, {"iface": "eth0 up"}])
def test_bad_daemon_config_is_rejected(kwargs):
    with pytest.raises(ConfigError):
        DaemonConfig(**kwargs)

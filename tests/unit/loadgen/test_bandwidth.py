"""tc command lines, output parsing and error classification, with a fake `subprocess.run`."""

import subprocess

import pytest

from loadgen import bandwidth
from loadgen.errors import ShapingError


class FakeTc:
    """Records argument lists; answers with the configured exit code, stdout and stderr."""

    def __init__(self, monkeypatch, *, returncode=0, stdout="", stderr="", missing=False):
        self.calls = []
        self.result = (returncode, stdout, stderr)
        self.missing = missing
        monkeypatch.setattr(subprocess, "run", self)

    def __call__(self, argv, **kwargs):
        assert isinstance(argv, list), "argument lists only, never shell strings"
        assert not kwargs.get("shell")
        self.calls.append(argv)
        if self.missing:
            raise FileNotFoundError(argv[0])
        code, out, err = self.result
        return subprocess.CompletedProcess(argv, code, out, err)


def test_set_rate_builds_the_tc_command(monkeypatch):
    tc = FakeTc(monkeypatch)
    s = bandwidth.set_rate("veth0", rate_kbit=4000)
    assert tc.calls == [["tc", "-j", "qdisc", "show", "dev", "veth0"],  # no tbf there: replaced at once
                        ["tc", "qdisc", "replace", "dev", "veth0", "root", "tbf",
                         "rate", "4000kbit", "burst", "5000", "latency", "50ms"]]
    assert (s.rate_kbit, s.burst_bytes, s.latency_ms) == (4000, 5000, 50.0)
    bandwidth.set_rate("veth0", rate_kbit=100, burst_bytes=4000, latency_ms=12.5, netns="dev1")
    assert tc.calls[-1][:4] == ["ip", "netns", "exec", "dev1"]
    assert tc.calls[-1][-6:] == ["rate", "100kbit", "burst", "4000", "latency", "12.5ms"]


@pytest.mark.parametrize("burst_now, flushed", [(125_000, True), (5000, False), (3028, False)])
def test_a_shrinking_bucket_is_flushed_before_the_change_and_a_growing_one_changed_in_place(
        monkeypatch, burst_now, flushed):
    tbf = f'[{{"kind":"tbf","handle":"8001:","root":true,"options":{{"rate":12500000,"burst":{burst_now}}}}}]'
    tc = FakeTc(monkeypatch, stdout=tbf)
    bandwidth.set_rate("veth0", rate_kbit=4000, netns="dev1")  # a 5000 B bucket
    kinds = [argv[5:7] for argv in tc.calls]  # after "ip netns exec dev1 tc"
    assert kinds == [["-j", "qdisc"], ["qdisc", "del"], ["qdisc", "replace"]] if flushed else \
        [["-j", "qdisc"], ["qdisc", "replace"]], tc.calls


def test_default_burst():
    assert bandwidth.default_burst_bytes(4000) == 5000  # 10 ms at 500 kB/s
    assert bandwidth.default_burst_bytes(100) == bandwidth.MIN_BURST_BYTES  # at least two frames
    assert bandwidth.default_burst_bytes(1_000_000) == 1_250_000


@pytest.mark.parametrize("stderr, expected", [
    ('Cannot find device "veth9"', "no such interface 'veth9'"),
    ("RTNETLINK answers: Operation not permitted", "needs root or CAP_NET_ADMIN"),
    ("Error: Specified qdisc kind is unknown.", "lacks the tbf qdisc (module sch_tbf"),
    ('Cannot open network namespace "ns9": No such file or directory', "no such network namespace 'ns9'"),
    ("something else", "tc failed on 'veth9'"),
])
def test_errors_say_what_to_fix(monkeypatch, stderr, expected):
    FakeTc(monkeypatch, returncode=2, stderr=stderr)
    with pytest.raises(ShapingError) as err:
        bandwidth.set_rate("veth9", rate_kbit=4000, netns="ns9")
    msg = str(err.value)
    assert expected in msg
    assert "tc qdisc replace dev veth9" in msg and stderr in msg  # the command and its stderr


def test_missing_tc_says_which_package(monkeypatch):
    FakeTc(monkeypatch, missing=True)
    with pytest.raises(ShapingError, match=r"apt-get install iproute2"):
        bandwidth.show("eth0")


@pytest.mark.parametrize("kwargs, field", [
    ({"rate_kbit": 0}, "rate_kbit"),
    ({"rate_kbit": 40.5}, "rate_kbit"),
    ({"rate_kbit": 4000, "burst_bytes": 100}, "burst_bytes"),
    ({"rate_kbit": 4000, "latency_ms": 0}, "latency_ms"),
    ({"rate_kbit": 4000, "latency_ms": float("nan")}, "latency_ms"),
])
def test_bad_values_rejected_before_tc(monkeypatch, kwargs, field):
    tc = FakeTc(monkeypatch)
    with pytest.raises(ShapingError, match=field):
        bandwidth.set_rate("eth0", **kwargs)
    with pytest.raises(ShapingError, match="bad interface name"):
        bandwidth.set_rate("eth0 up", rate_kbit=10)
    assert tc.calls == []


def test_clear_is_idempotent(monkeypatch):
    FakeTc(monkeypatch)
    assert bandwidth.clear("eth0") is True
    FakeTc(monkeypatch, returncode=2, stderr="Error: Cannot delete qdisc with handle of zero.")
    assert bandwidth.clear("eth0") is False
    FakeTc(monkeypatch, returncode=2, stderr="RTNETLINK answers: No such file or directory")
    assert bandwidth.clear("eth0") is False
    FakeTc(monkeypatch, returncode=1, stderr='Cannot find device "eth7"')
    with pytest.raises(ShapingError, match="no such interface 'eth7'"):
        bandwidth.clear("eth7")


def test_show_parses_tbf(monkeypatch):
    out = ('[{"kind":"tbf","handle":"8001:","root":true,"refcnt":3,'
           '"options":{"rate":500000,"burst":5000,"lat":50000}}]')
    FakeTc(monkeypatch, stdout=out)
    shown = bandwidth.show("veth0")
    assert shown["kind"] == "tbf"
    assert shown["tbf"] == {"rate_kbit": 4000, "burst_bytes": 5000, "latency_ms": 50.0}
    FakeTc(monkeypatch, stdout='[{"kind":"noqueue","handle":"0:","root":true,"options":{}}]')
    assert bandwidth.show("veth0")["kind"] == "noqueue" and bandwidth.show("veth0")["tbf"] is None
    FakeTc(monkeypatch, stdout="")
    assert bandwidth.show("veth0")["kind"] is None

"""Fakes and a threaded daemon for the loadgen unit tests (no root, no stress-ng, no tc)."""

import threading
import time

import pytest

from loadgen.bandwidth import TbfSettings
from loadgen.client import LoadgenClient
from loadgen.cpu import CpuLoadReading, CpuSnapshot
from loadgen.daemon import DaemonConfig, LoadgenDaemon
from loadgen.errors import CpuLoadError, ShapingError


@pytest.fixture
def wait_until():
    """wait_until(predicate, what): poll until it holds (fails after 10 s): a condition, never a duration."""
    def wait(predicate, what: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.02)
    return wait


class FakeCpu:
    cpus = 2.0

    def __init__(self):
        self.target_percent = 0.0
        self.workers = 0
        self.pid = None
        self.stopped = False

    def set(self, percent):
        if percent == 66:
            raise CpuLoadError("stress-ng exited at once (exit 1): simulated")
        self.target_percent, self.workers = float(percent), 2 if percent else 0

    def stop(self):
        self.stopped = True
        self.target_percent, self.workers = 0.0, 0

    def snapshot(self):
        return CpuSnapshot(time.monotonic(), 0.0, 0.0, 1.0)

    def reading_since(self, before):
        return CpuLoadReading(self.target_percent, self.target_percent, 50.0, 2.0, self.workers,
                              time.monotonic() - before.at_s)


class FakeShaper:
    def __init__(self):
        self.installed = {}

    def set_rate(self, dev, *, rate_kbit, burst_bytes=None, latency_ms=50, netns=None):
        if dev == "nosuch0":
            raise ShapingError("no such interface 'nosuch0'; `tc ...` failed (exit 1): Cannot find device")
        if dev == "boom0":
            raise RuntimeError("a bug")
        self.installed[dev] = rate_kbit
        return TbfSettings(dev, rate_kbit, burst_bytes or 5000, float(latency_ms), netns)

    def clear(self, dev, *, netns=None):
        return self.installed.pop(dev, None) is not None


@pytest.fixture
def fakes():
    """(FakeCpu class, FakeShaper class) for tests that build their own daemon."""
    return FakeCpu, FakeShaper


@pytest.fixture
def served():
    """A daemon serving on a free loopback port in a thread; yields (daemon, client, fakes)."""
    cpu, shaper = FakeCpu(), FakeShaper()
    daemon = LoadgenDaemon(DaemonConfig(bind="tcp://127.0.0.1:*", iface="veth0",
                                        measure_interval_s=0.3, poll_interval_s=0.05),
                           cpu=cpu, shaper=shaper)
    endpoint = daemon.bind()
    thread = threading.Thread(target=daemon.serve, daemon=True)
    thread.start()
    client = LoadgenClient(endpoint, timeout_s=5)
    try:
        yield daemon, client, cpu, shaper
    finally:
        client.close()
        daemon.stop()
        thread.join(timeout=5)
        assert not thread.is_alive()

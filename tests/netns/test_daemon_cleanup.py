"""A daemon inside a namespace leaves no qdisc and no stress-ng behind when it is stopped or killed."""

import os
import signal
import subprocess
import sys

import psutil
import pytest

from loadgen import bandwidth, netns
from loadgen.client import LoadgenClient


@pytest.fixture
def loaded_daemon(namespaces, processes, stress_ng, tmp_path):
    """A daemon in its own namespace with 30 % CPU and a 4 Mbit/s tbf set through it.

    Yields (daemon process, namespace, shaped device, stress-ng pid, stress-ng worker pids).
    The daemon listens on an ipc:// socket: a Unix socket path is reachable across
    network namespaces, so the test needs no address in the root namespace.
    """
    ns = namespaces.create("d")
    dev = namespaces.name("d")
    netns.add_veth(dev, f"{dev}p", netns=ns, peer_netns=ns)
    endpoint = f"ipc://{tmp_path}/loadgen.sock"
    daemon = processes.start(
        netns.exec_argv(ns, [sys.executable, "-m", "flexfl.app.cli", "loadgen", "serve", "--bind", endpoint,
                             "--iface", dev, "--cpus", "1"]),
        stdout=subprocess.PIPE, text=True)
    assert daemon.stdout.readline().split() == ["listening", endpoint]
    with LoadgenClient(endpoint, timeout_s=10) as client:
        client.set_cpu(30)
        client.set_bandwidth(4000)
        status = client.status()
    assert status["bandwidth"][dev]["rate_kbit"] == 4000
    assert bandwidth.show(dev, netns=ns)["kind"] == "tbf"
    stress_pid = status["cpu"]["stress_ng_pid"]
    assert stress_pid is not None and status["pid"] == daemon.pid
    workers = [c.pid for c in psutil.Process(stress_pid).children(recursive=True)]
    yield daemon, ns, dev, stress_pid, workers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_leaves_no_qdisc_and_no_stress_ng(loaded_daemon, gone, sig):
    daemon, ns, dev, stress_pid, workers = loaded_daemon
    os.kill(daemon.pid, sig)
    assert daemon.wait(timeout=10) == 0
    assert bandwidth.show(dev, netns=ns)["kind"] != "tbf"
    assert not gone([stress_pid, *workers], stress_pid, timeout_s=0)


def test_sigkill_leaves_no_stress_ng_and_clean_removes_qdisc(loaded_daemon, gone, processes):
    daemon, ns, dev, stress_pid, workers = loaded_daemon
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.wait(timeout=10)
    assert not gone([stress_pid, *workers], stress_pid, timeout_s=2.0)
    # A SIGKILLed process cannot remove its qdisc: that is what `loadgen clean` is for.
    assert bandwidth.show(dev, netns=ns)["kind"] == "tbf"
    clean = processes.start(netns.exec_argv(ns, [sys.executable, "-m", "flexfl.app.cli", "loadgen", "clean",
                                                 "--iface", dev]),
                            stdout=subprocess.PIPE, text=True)
    out, _ = clean.communicate(timeout=30)
    assert clean.returncode == 0 and "removed root qdisc" in out
    assert bandwidth.show(dev, netns=ns)["kind"] != "tbf"

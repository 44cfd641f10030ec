"""The emulated fleet (loadgen.fleet): devices work, and `down` leaves nothing behind, also after a crash.

Test fleets are named `f<test letter><creator pid, 6 hex>` with subnets in 10.78.0.0/16;
each test sweeps the fleets of test runs that died (their creator pid is gone).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from loadgen import bandwidth
from loadgen import fleet as fl
from loadgen.client import LoadgenClient
from loadgen.errors import DaemonError

REPO = Path(__file__).resolve().parents[2]


def fleet_prefix(letter: str) -> str:
    return f"f{letter}{os.getpid():06x}"


def fleet_subnet(k: int) -> str:
    """One of four /24s of this test run (k = 0..3)."""
    return f"10.78.{(os.getpid() % 60) * 4 + k}"


def leftovers(prefix: str) -> list[str]:
    """Everything of fleet `prefix` still on the machine: namespaces, links, qdiscs, cgroups, state."""
    found = fl.find_leftovers(prefix)
    out = [*found["netns"], *found["links"], *found["cgroups"]]
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    out += [line for line in qdiscs.splitlines() if f" dev {prefix}" in line]
    if fl.state_dir_of(prefix).exists():
        out.append(str(fl.state_dir_of(prefix)))
    return out


def test_up_then_down_leaves_nothing_and_down_twice_is_fine(fleet_host, stress_ng) -> None:
    prefix = fleet_prefix("a")
    spec = fl.FleetSpec(devices=(fl.DeviceSpec(cpu_quota=0.25, up_kbit=4000, down_kbit=8000),
                                 fl.DeviceSpec(cpu_quota=0.5)), prefix=prefix, subnet=fleet_subnet(0))
    fleet = fl.EmulatedFleet.up(spec)
    pids: list[int] = []
    try:
        d0, d1 = fleet.devices
        assert bandwidth.show(d0.iface, netns=d0.netns)["tbf"]["rate_kbit"] == 4000  # upload
        assert bandwidth.show(d0.host_iface)["tbf"]["rate_kbit"] == 8000  # download
        assert bandwidth.show(d1.iface, netns=d1.netns)["tbf"] is None

        # A loadgen daemon in device 0 runs stress-ng inside the device's cgroup.
        fleet.start_loadgen(0)
        # Its daemon authenticates with the keys the fleet made for this run (CURVE over ipc://).
        with LoadgenClient(d0.loadgen_endpoint, timeout_s=1) as stranger, pytest.raises(DaemonError) as refused:
            stranger.ping()
        assert "authentication failed" in str(refused.value) and "this client has none" in str(refused.value)
        with LoadgenClient(d0.loadgen_endpoint, timeout_s=10, auth=fleet.loadgen_auth()) as client:
            state = client.set_cpu(50)["cpu"]
            assert state["cpus"] == 0.25  # the daemon sees the device's quota as its CPUs
            stress = client.status()["cpu"]["stress_ng_pid"]
        assert str(stress) in Path(d0.cgroup, "cgroup.procs").read_text().split()

        # A process in device 1 reaches the coordinator's address over its veth, from its own
        # address, and sits in device 1's cgroup.
        with socket.socket() as server:
            server.bind((fleet.coordinator_host, 0))
            server.listen(1)
            server.settimeout(30)
            probe = ("import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10); "
                     "s.sendall(open('/proc/self/cgroup').read().encode()); s.close()")
            proc = fleet.spawn(1, [sys.executable, "-c", probe, fleet.coordinator_host, str(server.getsockname()[1])],
                               role="probe")
            conn, (peer, _) = server.accept()
            with conn:
                conn.settimeout(10)
                cgroup = conn.recv(4096).decode()
            assert proc.wait(timeout=30) == 0
        assert peer == d1.address
        assert f":cpu:/{prefix}/dev1" in cgroup

        rows = fleet.status()
        assert [(r["device"], r["up_kbit"], r["down_kbit"], r["cpu_quota"]) for r in rows] == \
            [(0, 4000, 8000, 0.25), (1, None, None, 0.5)]
        assert any(p["role"] == "loadgen" and p["alive"] for p in rows[0]["processes"])
        pids = fl.fleet_pids(prefix)
        assert stress in pids
    finally:
        fleet.down()
    assert leftovers(prefix) == []
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert fl.down(prefix) == []  # down twice is fine


def test_down_finds_a_crashed_runs_leftovers_by_name(fleet_host, stress_ng) -> None:
    prefix = fleet_prefix("b")
    script = f"""
import sys, time
from loadgen import fleet as fl
from loadgen.client import LoadgenClient
f = fl.EmulatedFleet.up(fl.FleetSpec(devices=(fl.DeviceSpec(cpu_quota=0.2, up_kbit=2000),) * 2,
                                     prefix={prefix!r}, subnet={fleet_subnet(1)!r}))
f.start_loadgen(0, detach=True)
with LoadgenClient(f.devices[0].loadgen_endpoint, timeout_s=10, auth=f.loadgen_auth()) as c:
    c.set_cpu(40)
print("ready", flush=True)
time.sleep(600)
"""
    controller = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert controller.stdout.readline().strip() == "ready"
        controller.send_signal(signal.SIGKILL)  # the controller dies without cleaning up
        controller.wait(timeout=10)
        pids = fl.fleet_pids(prefix)
        assert pids, "the detached daemon and its stress-ng should have outlived the controller"
        shutil.rmtree(fl.state_dir_of(prefix))  # lose the state file too: names must suffice
        assert leftovers(prefix)
    finally:
        if controller.poll() is None:
            controller.kill()
        controller.stdout.close()
        removed = fl.down(prefix)
    assert any(r.startswith("netns ") for r in removed)
    assert leftovers(prefix) == []
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_without_root_the_error_says_so(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(fl.FleetError, match=r"needs root.*sudo"):
        fl.EmulatedFleet.up(fl.FleetSpec(devices=(fl.DeviceSpec(),), prefix="fznoroot"))


def test_status_of_a_device_whose_cgroup_period_is_0_is_a_clear_error(fleet_host, tmp_path) -> None:
    """fleet.status reads quotas through loadgen.cgroup (its own copy divided by the period: ZeroDivisionError)."""
    import json
    from dataclasses import asdict

    from loadgen.errors import CgroupError

    prefix = fleet_prefix("p")
    cg = tmp_path / "cgroup-dev0"
    cg.mkdir()
    (cg / "cpu.cfs_quota_us").write_text("5000\n")
    (cg / "cpu.cfs_period_us").write_text("0\n")
    state_dir = fl.state_dir_of(prefix, tmp_path)
    device = fl._names(prefix, fleet_subnet(3), state_dir, 0, fl.DeviceSpec(cpu_quota=0.5))
    state_dir.mkdir()
    (state_dir / "state.json").write_text(json.dumps({
        "prefix": prefix, "subnet": fleet_subnet(3), "cfs_period_us": 10_000, "processes": [],
        "devices": [{**asdict(device), "cgroup": str(cg)}]}))
    with pytest.raises(CgroupError, match=r"cpu.cfs_period_us: the CPU period must be > 0 us, got 0"):
        fl.status(prefix, state_root=tmp_path)

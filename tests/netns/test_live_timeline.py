"""A device timeline on the emulated fleet: the kernel gets what it says, and a live run's s follows it.

First the fleet alone: a timeline's rows become a device's cgroup quota, its tbf rates (changed
in place) and its link state, and a device brought back online reaches the coordinator's side again.

Then `flexfl live --emulate --timeline` on three MNIST devices (round-clocked): dev-1 drops to a
tenth of a core from round 4, dev-2 is offline in rounds 3 and 4. The run must record the
conditions in force per round, dev-1's s must fall, dev-2 must contribute nothing while offline
and contribute again afterwards, and the fleet must be gone at the end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from coordinator.metrics import read_metrics
from flexfl.app.live import LiveRun, load_live_config
from flexfl.vocabulary import StopReason
from loadgen import fleet as fl
from loadgen.fleet_timeline import CONDITIONS_FILE, FleetTimeline, read_conditions
from trace_recorder.timeline import Conditions, Interval, Timeline, TimeUnit


def _subnet(k: int) -> str:
    return f"10.78.{(os.getpid() % 60) * 4 + k}"


def _link(device: fl.Device) -> tuple[str, bool]:
    """The device's link state inside its namespace, and whether it has its default route."""
    shown = json.loads(subprocess.run(["ip", "-n", device.netns, "-j", "link", "show", "dev", device.iface],
                                      capture_output=True, text=True, check=True).stdout)
    routes = subprocess.run(["ip", "-n", device.netns, "route", "show", "default"], capture_output=True, text=True,
                            check=True).stdout
    return shown[0]["operstate"], "default via" in routes


# Inside a device: connect, say so, and say how the connection ended (it never gets data).
_HOLD_A_CONNECTION = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
print("connected", flush=True)
try:
    print("closed" if s.recv(1) == b"" else "data", flush=True)
except OSError as exc:
    print(type(exc).__name__, flush=True)
"""


def test_the_fleet_sets_what_a_timeline_row_says_and_a_device_comes_back_online(fleet_host) -> None:
    prefix = f"ft{os.getpid():06x}"
    c = Conditions
    timeline = Timeline(unit=TimeUnit.ROUND, devices={
        "dev-0": [Interval(1, 2, c(1.0, 8000, 16000, True)), Interval(2, 3, c(0.5, 800, 16000, True)),
                  Interval(3, 4, c(0.5, 800, 16000, False)), Interval(4, 5, c(0.5, 2000, 4000, True))],
        "dev-1": [Interval(1, 5, c(0.2, 8000, 8000, True))]})
    fleet = fl.EmulatedFleet.up(fl.FleetSpec(devices=(fl.DeviceSpec(cpu_quota=0.5), fl.DeviceSpec(cpu_quota=None)),
                                             prefix=prefix, subnet=_subnet(1)))
    try:
        ft = FleetTimeline(timeline, full_cpus=[0.5, None], least_cpus=fleet.least_quota_cpus, where="test")
        d0, _ = fleet.devices

        def state() -> list[tuple]:
            return [(r["cpu_quota"], r["up_kbit"], r["down_kbit"]) for r in fleet.status()]

        ft.apply(fleet, 1)
        assert state() == [(0.5, 8000, 16000), (0.2, 8000, 8000)]  # dev-0: share 1 of 0.5 CPU; dev-1: of one core
        ft.apply(fleet, 2)
        assert state()[0] == (0.25, 800, 16000)
        # a connection from the device to the coordinator's side, open while it goes offline and comes back
        listener = socket.create_server((fleet.coordinator_host, 0))
        client = subprocess.Popen(["ip", "netns", "exec", d0.netns, "python3", "-c", _HOLD_A_CONNECTION,
                                   fleet.coordinator_host, str(listener.getsockname()[1])],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert client.stdout.readline().strip() == "connected"
            server_side, _ = listener.accept()
            ft.apply(fleet, 3)
            assert _link(d0) == ("DOWN", False) and state()[0] == (0.25, 800, 16000)  # offline: the rest stays
            ft.apply(fleet, 4)
            assert _link(d0) == ("UP", True) and state() == [(0.25, 2000, 4000), (0.2, 8000, 8000)]
            # back online, both ends find the old connection gone at once, not on TCP's backed-off timer
            assert client.stdout.readline().strip() == "ConnectionAbortedError"
            server_side.settimeout(10)  # a connection left alone would block here: fail, not hang
            with pytest.raises((ConnectionAbortedError, ConnectionResetError)):
                server_side.recv(1)
        finally:
            client.kill()
            client.wait()
            listener.close()
        # back online it reaches the coordinator's side: a TCP connect from inside its namespace is refused
        # (nobody listens on port 9 of the bridge), which takes a route; offline it would be unreachable
        probe = subprocess.run(["ip", "netns", "exec", d0.netns, "python3", "-c",
                                "import socket,sys\ns=socket.socket(); s.settimeout(3)\n"
                                f"try: s.connect(('{fleet.coordinator_host}', 9))\n"
                                "except ConnectionRefusedError: sys.exit(0)\nexcept OSError as e: sys.exit(str(e))"],
                               capture_output=True, text=True, timeout=30)
        assert probe.returncode == 0, probe.stderr
    finally:
        fleet.down()
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}


ROUND_TIMELINE = """# dev-1 drops to a tenth of a core from round 4; dev-2 is offline in rounds 3 and 4
device,start_round,end_round,cpu_share,up_kbit_s,down_kbit_s,online
dev-0,1,10,1,100000,100000,1
dev-1,1,4,1,100000,100000,1
dev-1,4,10,0.1,100000,100000,1
dev-2,1,3,1,100000,100000,1
dev-2,3,5,1,100000,100000,0
dev-2,5,10,1,100000,100000,1
"""


def test_a_live_run_follows_a_round_timeline_and_records_it(fleet_host, tmp_path: Path) -> None:
    """E = 2000 SGD steps of the MNIST MLP: ~0.7 s unthrottled on the 2-core EPYC this was written on (under a
    load of ~4), so every device finishes E in the 2 s deadline at share 1; at 0.1 CPU ~7 s, so dev-1 then gets
    ~550. On a machine 2x faster it would still get ~1100 < 0.75 E, on one 2x slower its rounds before the drop
    still reach ~1400 against ~275 after. dev-2 takes round 3's model before its link goes down (the driver
    sees the opening a poll late), so round 3 may be missed rather than offline; s = 0 either way. Back online,
    its agent's stalled connection recovers on TCP's retransmission timer (~2-3 s here): round 5 may still
    find it away."""
    prefix = f"fu{os.getpid():06x}"
    path = tmp_path / "timeline.csv"
    path.write_text(ROUND_TIMELINE)
    out = tmp_path / "run"
    cfg = load_live_config(None, overrides={
        "partition": {"dataset": "mnist", "n_devices": 3, "sizes": "equal"}, "run": {"rounds": 9, "deadline_s": 2.0},
        "arrive_round": 0, "depart_round": 0, "out": str(out),
        "rules": {"required_updates": 2000, "eta0": 0.01},
        "emulate": {"enabled": True, "cpu": 0.0, "timeline": str(path), "prefix": prefix, "subnet": _subnet(2)}})
    try:
        summary = LiveRun(cfg).run()
    finally:
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
    rows = read_metrics(out / "coordinator" / "metrics.jsonl")
    assert [r.round for r in rows] == list(range(1, 10))
    assert summary["timeline"]["at_share_1"]["device_rounds"] >= 20  # sim run's --update-s, measured
    # (a) the conditions in force at every round's opening are recorded
    applied = read_conditions(out / CONDITIONS_FILE)
    assert sorted(applied) == list(range(1, 10))
    assert [applied[r]["dev-1"]["cpu_quota"] for r in range(1, 10)] == [None] * 3 + [0.1] * 6  # share 1 of a core
    assert [applied[r]["dev-2"]["online"] for r in range(1, 10)] == [True, True, False, False] + [True] * 5
    assert all(applied[r][d]["up_kbit_s"] == 100000 for r in applied for d in applied[r])
    # (b) dev-1's s falls once its share does, for its CPU's sake
    s1 = [r.s["dev-1"] for r in rows]
    before, after = s1[1:3], s1[4:]  # round 1 starts from a cold agent; round 4's quota comes a poll late
    assert sum(after) / len(after) < 0.75 * sum(before) / len(before), s1
    assert all(r.stop_reason["dev-1"] == StopReason.COMPUTE for r in rows[4:]), [r.stop_reason for r in rows]
    # (c) dev-2 contributes nothing while offline, and again once back
    s2, why2 = [r.s["dev-2"] for r in rows], [r.stop_reason["dev-2"] for r in rows]
    assert s2[2:4] == [0, 0] and set(why2[2:4]) <= {StopReason.OFFLINE, StopReason.MISSED}, (s2, why2)
    assert why2[3] == StopReason.OFFLINE, why2  # a whole round with its link down: it never took the model
    assert sum(v > 0 for v in s2[4:]) >= 3 and s2[-1] > 0, (s2, why2)
    # (d) the report draws the recorded conditions under the stop reasons
    from flexfl.app.report import write_report

    html = write_report(out, tmp_path / "report.html").read_text()
    assert 'id="conditions"' in html and "Device conditions</b>:" not in html

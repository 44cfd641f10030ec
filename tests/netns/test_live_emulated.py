"""`flexfl live --emulate`: an agent whose upload cannot finish in time is inactive (s = 0).

Two MNIST agents, each in an emulated device; one device's upload goes through a
256 kbit/s tbf, so the MLP's 0.8 MB delta needs about 25 s against a 2 s deadline. The
coordinator must count that device as s = 0 every round while the unshaped one stays active,
and the fleet must be gone afterwards.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil
import pytest

from coordinator.metrics import read_metrics
from flexfl.live import EmulationConfig, LiveConfig, LiveRun
from loadgen import fleet as fl
from workloads.partition_spec import PartitionSpec


@pytest.fixture
def fleet_host(root_netns):
    try:
        fl.require_root()
    except fl.FleetError as exc:
        pytest.skip(str(exc))
    for prefix in fl.list_fleets():  # fleets of test runs that died
        m = re.fullmatch(r"f[a-z]([0-9a-f]{6})", prefix)
        if m and int(m.group(1), 16) != os.getpid() and not psutil.pid_exists(int(m.group(1), 16)):
            fl.down(prefix)


def test_bandwidth_limited_agent_is_inactive_while_the_unlimited_one_stays_active(fleet_host, tmp_path: Path) -> None:
    prefix = f"fl{os.getpid():06x}"
    cfg = LiveConfig(partition=PartitionSpec(dataset="mnist", n_devices=2, sizes="equal"), rounds=3, deadline_s=2.0,
                     arrive_round=0, depart_round=0, trace_set="", update_s=0.0, out=str(tmp_path),
                     emulate=EmulationConfig(enabled=True, cpu=0.0, up_kbit=(0, 256), prefix=prefix,
                                             subnet=f"10.78.{(os.getpid() % 60) * 4 + 2}"))
    try:
        LiveRun(cfg).run()
    finally:
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
    rows = read_metrics(tmp_path / "coordinator" / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert [r["s"]["dev-1"] for r in rows] == [0, 0, 0], rows
    assert all(r["s"]["dev-0"] > 0 for r in rows), [r["s"] for r in rows]
    assert all("dev-1" not in r["bytes_in"] or r["bytes_in"]["dev-1"] == 0 for r in rows)

"""loadgen.cgroup.CpuQuotaGroup (root, cgroup v1 cpu): a process that loadgen.device_exec puts in it gets no more CPU
than its quota, and remove() stops what is still in it and leaves no cgroup behind."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from loadgen.cgroup import CGROUP_V1_CPU_ROOT, CpuQuotaGroup

# Spins for SPIN_S of wall time, then prints the CPU seconds the spin got and sleeps until it is stopped.
SPIN_S = 1.5
SPINNER = (f"import time\nt, c = time.monotonic(), time.process_time()\nwhile time.monotonic() - t < {SPIN_S}: pass\n"
           "print(time.process_time() - c, flush=True)\ntime.sleep(600)\n")


@pytest.fixture
def quota_root():
    if os.geteuid() != 0 or not (CGROUP_V1_CPU_ROOT / "cpu.cfs_quota_us").exists():
        pytest.skip(f"needs root and the cgroup v1 cpu controller at {CGROUP_V1_CPU_ROOT}")
    return CGROUP_V1_CPU_ROOT


def test_a_process_in_the_group_gets_its_quota_and_remove_stops_it(quota_root) -> None:
    group = CpuQuotaGroup.create(f"lgtq{os.getpid():06x}", cpus=0.2)
    proc = None
    try:
        assert (group.path / "cpu.cfs_quota_us").read_text().strip() == "2000"  # 0.2 CPU of a 10 ms period
        proc = subprocess.Popen([sys.executable, "-m", "loadgen.device_exec", "--cgroup", str(group.path), "--",
                                 sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        cpu_s = float(proc.stdout.readline())  # after SPIN_S of wall time
        assert proc.pid in group.pids()
        assert 0.05 < cpu_s < 0.45, cpu_s  # 0.2 CPU over 1.5 s: 0.3 CPU seconds; unthrottled, 1.5
        assert proc.poll() is None  # asleep for 600 s
    finally:
        group.remove()
    assert not group.path.exists()
    assert not psutil.pid_exists(proc.pid)  # stopped (and reaped) by remove(), long before its sleep ended


# In a group without a cap: spins 0.5 s, then 1.5 s under cpu_quota_while(0.1), then 0.5 s again; prints each's CPU.
PHASES = """
import time
from loadgen.cgroup import cpu_quota_while

def spin(s):
    t, c = time.monotonic(), time.process_time()
    while time.monotonic() - t < s:
        pass
    return time.process_time() - c

free = spin(0.5)
with cpu_quota_while(0.1):
    capped = spin(1.5)
print(free, capped, spin(0.5), flush=True)
"""


def test_a_process_caps_its_own_group_while_a_block_runs_and_only_then(quota_root) -> None:
    group = CpuQuotaGroup.create(f"lgtw{os.getpid():06x}", cpus=None, period_us=100_000)
    try:
        assert (group.path / "cpu.cfs_quota_us").read_text().strip() == "-1"
        done = subprocess.run([sys.executable, "-m", "loadgen.device_exec", "--cgroup", str(group.path), "--",
                               sys.executable, "-c", PHASES], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        free, capped, after = map(float, done.stdout.split())
        print(f"CPU seconds: 0.5 s free {free:.3f}, 1.5 s at 0.1 CPU {capped:.3f}, 0.5 s free {after:.3f}")
        assert capped < 0.25, (free, capped, after)  # 0.1 CPU over 1.5 s: 0.15 CPU seconds
        assert (group.path / "cpu.cfs_quota_us").read_text().strip() == "-1"  # lifted after the block
    finally:
        group.remove()
    assert not group.path.exists()

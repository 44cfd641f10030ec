"""stress-ng holds the CPUs at the target, and never outlives its owner."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from loadgen.cpu import CpuLoad


@pytest.fixture(scope="session")
def nice():
    """-19 where allowed, else 0.

    A raised priority keeps other work on a shared CI box (a simulation, another test run)
    from starving stress-ng: the test judges stress-ng's duty cycle, not the box's load.
    """
    probe = subprocess.run([sys.executable, "-c", "import os; os.setpriority(os.PRIO_PROCESS, 0, -19)"],
                           capture_output=True)
    return -19 if probe.returncode == 0 else 0


@pytest.mark.parametrize("target", [30, 70])
def test_load_reaches_target_within_10_points(stress_ng, nice, target):
    with CpuLoad(nice=nice) as load:
        load.start(target)
        time.sleep(0.5)  # let the workers settle into their duty cycle
        reading = load.measure(3.0)
    print(f"target {target}%: achieved {reading.achieved_percent:.1f}% of {reading.cpus:g} CPUs "
          f"(machine {reading.system_percent:.1f}%, nice {nice})")
    assert reading.target_percent == target
    if abs(reading.achieved_percent - target) > 10 and nice == 0:
        # Without the privilege to raise stress-ng's priority, other busy processes take
        # CPU it asked for; then the reading says nothing about stress-ng itself.
        others = reading.system_percent - reading.achieved_percent * reading.cpus / psutil.cpu_count()
        if others > 20:
            pytest.skip(f"machine busy ({others:.0f}% CPU used by other processes) and stress-ng's "
                        f"priority cannot be raised here (needs root or CAP_SYS_NICE): {reading}")
    assert abs(reading.achieved_percent - target) <= 10, reading


def test_set_changes_level_and_stop_leaves_no_stress_ng(stress_ng, gone):
    load = CpuLoad(cpus=1)
    try:
        load.start(20)
        first = load.pid
        assert first is not None
        load.set(20)  # same level: no restart
        assert load.pid == first
        load.set(40)
        second = load.pid
        assert second not in (None, first)
        assert not gone([first], first, timeout_s=0)  # the old one is gone already
        workers = [c.pid for c in psutil.Process(second).children(recursive=True)]
        assert len(workers) == 1
    finally:
        load.stop()
    assert load.pid is None
    assert not gone([second, *workers], second, timeout_s=0)


_CHILD = """
import sys, time
from loadgen.cpu import CpuLoad
load = CpuLoad(cpus=1)
load.start(10)
print(load.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_stress_ng_dies_with_its_parent(stress_ng, processes, gone, sig):
    """SIGKILL (no cleanup code runs) and default-handled SIGTERM: PDEATHSIG reaps stress-ng."""
    child = processes.start([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    pid = int(child.stdout.readline())
    workers = [c.pid for c in psutil.Process(pid).children(recursive=True)]
    assert workers, "stress-ng started no worker"
    os.kill(child.pid, sig)
    child.wait(timeout=5)
    survivors = gone([pid, *workers], pid, timeout_s=2.0)
    assert not survivors, f"stress-ng outlived its parent: {survivors}"


def test_normal_exit_of_parent_stops_stress_ng(stress_ng, processes, gone):
    """The atexit hook stops stress-ng when the owner just returns."""
    code = _CHILD.replace("time.sleep(60)", "")
    child = processes.start([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(child.stdout.readline())
    assert child.wait(timeout=10) == 0
    assert not gone([pid], pid, timeout_s=0.5)


def test_stress_ng_killed_from_outside_is_restarted_and_counter_holds(stress_ng, gone):
    with CpuLoad(cpus=1) as load:
        load.start(50)
        pid = load.pid
        time.sleep(0.3)
        before = load.snapshot()
        os.killpg(pid, signal.SIGKILL)  # our own stress-ng's group, e.g. the OOM killer's doing
        assert not gone([pid], pid, timeout_s=2.0)
        assert load.pid is None and load.target_percent == 50
        assert load.snapshot().stress_cpu_s >= before.stress_cpu_s > 0
        load.set(50)  # same level, but nothing runs it: starts again
        assert load.pid not in (None, pid)

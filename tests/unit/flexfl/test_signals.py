"""flexfl.signals: SIGTERM as Ctrl-C, and a process that dies with its parent; each written once."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from flexfl.signals import sigterm_as_interrupt

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("coordinator", "edge_agent", "flexfl", "loadgen", "simulator", "trace_recorder", "workloads",
            "benchmarks", "tests")


def test_sigterm_inside_the_block_raises_keyboard_interrupt_and_the_old_handler_comes_back() -> None:
    def before(signum: int, _frame: object) -> None:
        raise AssertionError("the previous handler ran inside the block")

    previous = signal.signal(signal.SIGTERM, before)
    try:
        with pytest.raises(KeyboardInterrupt, match="received SIGTERM"), sigterm_as_interrupt():
            signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, previous)


# A parent that starts a child which arms die_with_parent, prints the child's pid, and exits.
_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(__import__("os").getpid())],
                         stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
"""
_CHILD = """
import os, signal, sys, time
from flexfl.signals import die_with_parent
armed = die_with_parent(signal.SIGTERM, parent_pid=int(sys.argv[1]))
print("armed" if armed else "parent-gone", flush=True)
time.sleep(60)
"""


def test_a_child_that_armed_die_with_parent_gets_the_signal_when_its_parent_exits() -> None:
    out = subprocess.run([sys.executable, "-c", _PARENT, _CHILD], capture_output=True, text=True, timeout=60,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True).stdout
    pid, state = out.split()
    child = psutil.Process(int(pid)) if psutil.pid_exists(int(pid)) else None
    try:
        assert state == "armed"
        # The parent has exited: the kernel sent the child SIGTERM, long before its 60 s sleep ends.
        if child is not None:
            child.wait(timeout=30)
    finally:
        if child is not None and child.is_running():
            child.kill()


def test_die_with_parent_reports_a_parent_that_is_already_gone() -> None:
    # Armed in a throw-away process: arming it here would tie pytest to its own parent.
    code = ("import signal; from flexfl.signals import die_with_parent; "
            "print(die_with_parent(signal.SIGTERM, parent_pid=1))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True).stdout
    assert out.strip() == "False"  # its parent (this pytest) is not pid 1


@pytest.mark.parametrize("pattern, owner", [
    (r"prctl\(\s*(_?PR_SET_PDEATHSIG|1\s*,)", "flexfl/signals.py"),  # PR_SET_PDEATHSIG is 1
    (r"raise KeyboardInterrupt\(f?\"(received|signal)", "flexfl/signals.py"),
], ids=["PR_SET_PDEATHSIG", "SIGTERM->KeyboardInterrupt"])
def test_each_signal_helper_is_written_once(pattern: str, owner: str) -> None:
    found = sorted(str(path.relative_to(REPO)) for package in PACKAGES for path in (REPO / package).rglob("*.py")
                   if path != Path(__file__).resolve() and re.search(pattern, path.read_text(encoding="utf-8")))
    assert found == [owner]

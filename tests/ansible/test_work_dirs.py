"""Two provisioning runs on one machine leave each other's folders alone (issue 11, item 11).

Each run claims a folder of its own under the work base and holds an flock on it while it
lives; at start a run removes only folders nobody holds, i.e. those of runs that died,
unmounting what they left mounted. Fast: in `make test`; the mount part needs root.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HOLD = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
        "print('held', flush=True); sys.stdin.read()")

Claim = Callable[[Path], tuple[Path, int]]


class OtherRun:
    """Another process holding a run folder's lock, as a concurrent test run does."""

    def __init__(self, folder: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "held"

    def die(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture
def other_runs() -> Iterator[list[OtherRun]]:
    runs: list[OtherRun] = []
    yield runs
    for run in runs:
        run.die()


def locked_elsewhere(folder: Path) -> bool:
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_run_keeps_live_runs_folders_and_removes_dead_ones(tmp_path: Path, work_dirs: Claim,
                                                             other_runs: list[OtherRun]) -> None:
    live = tmp_path / "run-live"
    (live / "root" / "etc").mkdir(parents=True)
    (live / "root" / "etc" / "os-release").write_text("bookworm\n")
    other_runs.append(OtherRun(live))
    dead = tmp_path / "run-dead"
    (dead / "root").mkdir(parents=True)

    work, fd = work_dirs(tmp_path)
    try:
        assert (live / "root" / "etc" / "os-release").read_text() == "bookworm\n"
        assert not dead.exists()
        assert work.parent == tmp_path and work not in (live, dead)
        # Ours is held too: a third run started now would leave it alone.
        assert locked_elsewhere(work)
        second, second_fd = work_dirs(tmp_path)
        os.close(second_fd)
        assert work.is_dir() and second != work
    finally:
        os.close(fd)

    # Once the other run has died, the next run clears its folder (and ours, closed above).
    other_runs.pop().die()
    third, third_fd = work_dirs(tmp_path)
    os.close(third_fd)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [third.name]


def test_a_dead_runs_mounts_are_unmounted_before_its_folder_goes(tmp_path: Path, work_dirs: Claim) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount the tmpfs a killed run would have left behind")
    proc_dir = tmp_path / "run-killed" / "root" / "proc"
    proc_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(proc_dir)], check=True)
    (proc_dir / "inside-the-mount").write_text("x")
    try:
        _work, fd = work_dirs(tmp_path)
        os.close(fd)
        assert not (tmp_path / "run-killed").exists()
        assert str(proc_dir) not in Path("/proc/self/mountinfo").read_text()
    finally:
        if str(proc_dir) in Path("/proc/self/mountinfo").read_text():
            subprocess.run(["umount", "--lazy", str(proc_dir)], check=False)

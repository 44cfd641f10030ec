"""Signals shared by every process FlexFL starts: SIGTERM as Ctrl-C, and dying with the parent.

Only the standard library is imported here: loadgen.device_exec runs this between entering
a device and exec'ing its command, and loadgen.cpu in a forked child before exec.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

# Set by loadgen.harness on the processes it starts (the harness's pid); read by flexfl.app.cli.main.
DIE_WITH_PARENT_ENV = "FLEXFL_DIE_WITH_PARENT"

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Looked up once, at import: die_with_parent may run between fork and exec (a preexec_fn),
# where loading a library could deadlock on a lock another thread of the parent held.
_libc = ctypes.CDLL(None, use_errno=True)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so `finally` clean-ups run.

    For commands that own resources a default SIGTERM would leak (an emulated fleet's
    namespaces and cgroups, child processes). The handler in place before is restored on
    exit. Main thread only, like every Python signal handler.
    """
    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def die_with_parent(signum: int, *, parent_pid: int) -> bool:
    """Have the kernel send this process `signum` when its parent dies (prctl PR_SET_PDEATHSIG).

    Returns False when the parent is already gone (it died before the signal was armed, so it
    will never fire): the caller should exit. Linux only. Strictly, the signal comes when the
    parent *thread* that started this process exits. Safe between fork and exec.
    """
    if _libc.prctl(_PR_SET_PDEATHSIG, signum) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    return os.getppid() == parent_pid

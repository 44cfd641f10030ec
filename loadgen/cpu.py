"""Hold a device's CPU at a given share with stress-ng, and measure what stress-ng consumed.

stress-ng runs as a subprocess in its own session (so its whole process group can be
signalled) and is always reaped:
- `stop()` sends SIGTERM to the group, SIGKILL after a grace period, and waits;
- on interpreter exit an atexit hook stops every live `CpuLoad`;
- if the parent dies without running Python code (SIGKILL, or SIGTERM with the default
  handler) the kernel sends stress-ng SIGKILL (PR_SET_PDEATHSIG), and stress-ng's workers
  die with it. PDEATHSIG fires when the *thread* that started stress-ng exits, so start and
  change the load from a long-lived thread (the main thread, or the daemon's serving thread).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

import psutil

from flexfl.signals import die_with_parent
from loadgen.cgroup import available_cpus
from loadgen.errors import CpuLoadError

log = logging.getLogger(__name__)

_STARTUP_CHECK_S = 0.2  # stress-ng fails on bad arguments within a few milliseconds
_live: weakref.WeakSet[CpuLoad] = weakref.WeakSet()
_atexit_registered = False


@dataclass(frozen=True)
class CpuSnapshot:
    """Counters at one instant; two snapshots give a `CpuLoadReading`."""

    at_s: float  # time.monotonic()
    stress_cpu_s: float  # CPU seconds consumed by stress-ng since this CpuLoad was created
    system_busy_s: float  # machine-wide non-idle CPU seconds (all cores)
    system_total_s: float


@dataclass(frozen=True)
class CpuLoadReading:
    """Target and achieved load over an interval.

    `achieved_percent` is stress-ng's own CPU time relative to the CPUs it was given
    (`cpus` x interval), so other work on the machine does not inflate it;
    `system_percent` is the whole machine's utilisation, for information.
    """

    target_percent: float
    achieved_percent: float
    system_percent: float
    cpus: float
    workers: int
    interval_s: float


def validate_percent(percent: object) -> float:
    """Return `percent` as a float in [0, 100] or raise CpuLoadError saying what is wrong."""
    if isinstance(percent, bool) or not isinstance(percent, (int, float)):
        raise CpuLoadError(f"CPU percent must be a number in [0, 100], got {percent!r}")
    if not math.isfinite(percent) or not 0 <= percent <= 100:
        raise CpuLoadError(f"CPU percent must be in [0, 100], got {percent!r}")
    return float(percent)


def plan_workers(percent: float, cpus: float) -> tuple[int, int]:
    """(stress-ng workers, --cpu-load per worker) that take `percent` of `cpus` CPUs.

    One worker per (possibly partial) CPU; each worker's duty cycle is scaled so that the
    workers together consume percent/100 * cpus CPU-seconds per second. Under a 0.5-CPU
    quota, 30 % is one worker at 15 %.
    """
    workers = max(1, math.ceil(cpus - 1e-9))
    if percent <= 0:
        return workers, 0
    per_worker = round(percent * cpus / workers)
    return workers, min(100, max(1, per_worker))


class CpuLoad:
    """A stress-ng competitor holding `cpus` CPUs at a target percent (0 = no stress-ng).

    `cpus` defaults to `available_cpus()` (cgroup quota, else affinity). `nice` below 0
    (root or CAP_SYS_NICE) lets stress-ng take its share even when other work keeps the
    machine busy; 0 leaves it competing as an ordinary process.
    """

    def __init__(
        self,
        *,
        cpus: float | None = None,
        nice: int = 0,
        grace_s: float = 2.0,
        stress_ng: str = "stress-ng",
        cpu_method: str | None = None,
    ) -> None:
        self.cpus = float(cpus) if cpus is not None else available_cpus()
        if self.cpus <= 0:
            raise CpuLoadError(f"cpus must be positive, got {cpus!r}")
        if not -20 <= nice <= 19:
            raise CpuLoadError(f"nice must be in [-20, 19], got {nice!r}")
        if cpu_method is not None and not re.fullmatch(r"[a-z0-9_]+", cpu_method):
            raise CpuLoadError(f"bad stress-ng --cpu-method {cpu_method!r}")
        # One uniform method (e.g. "int8") keeps --cpu-load accurate under a cgroup quota:
        # stress-ng sizes each pause from its last busy slice, and the default mix's slow
        # operations get throttled half-way (a 90 % target reached about half).
        self.cpu_method = cpu_method
        self.nice = nice
        self.grace_s = grace_s
        self._stress_ng = stress_ng
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._target = 0.0
        self._workers = 0
        self._retired_cpu_s = 0.0  # CPU time of stress-ng runs already stopped
        self._seen_cpu_s = 0.0  # latest CPU time read from the running stress-ng tree

    # -- state -------------------------------------------------------------------------
    @property
    def target_percent(self) -> float:
        return self._target

    @property
    def workers(self) -> int:
        return self._workers

    @property
    def pid(self) -> int | None:
        """stress-ng's pid, which is also its process-group id; None when not running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    # -- control -----------------------------------------------------------------------
    def start(self, percent: float) -> None:
        """Start holding `percent` of the CPUs; restarts stress-ng if already running."""
        self.set(percent)

    def set(self, percent: float) -> None:
        """Change the level: stop the current stress-ng, start one at the new level.

        Setting the level stress-ng already runs at leaves it running.
        """
        percent = validate_percent(percent)
        with self._lock:
            if percent == self._target and (percent == 0 or self.pid is not None):
                return
            self.stop()
            if percent > 0:
                self._spawn(percent)
            self._target = percent

    def stop(self) -> None:
        """Stop stress-ng (SIGTERM to its group, SIGKILL after the grace period) and reap it."""
        with self._lock:
            proc, self._proc = self._proc, None
            self._target, self._workers = 0.0, 0
            if proc is None:
                return
            self._retired_cpu_s += self._current_cpu_s(proc)
            self._seen_cpu_s = 0.0
            _terminate_group(proc, grace_s=self.grace_s)
            _live.discard(self)

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> CpuLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- measurement -------------------------------------------------------------------
    def snapshot(self) -> CpuSnapshot:
        """Counters now; pair with `reading_since` to measure without blocking."""
        with self._lock:
            stress = self._retired_cpu_s + (self._current_cpu_s(self._proc) if self._proc else 0.0)
        t = psutil.cpu_times()
        # guest time is already counted in user time on Linux
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        idle = t.idle + getattr(t, "iowait", 0.0)
        return CpuSnapshot(time.monotonic(), stress, total - idle, total)

    def reading_since(self, before: CpuSnapshot) -> CpuLoadReading:
        """Load between `before` and now (the target is the current one)."""
        now = self.snapshot()
        interval = max(now.at_s - before.at_s, 1e-9)
        achieved = 100.0 * (now.stress_cpu_s - before.stress_cpu_s) / (interval * self.cpus)
        d_total = now.system_total_s - before.system_total_s
        system = 100.0 * (now.system_busy_s - before.system_busy_s) / d_total if d_total > 0 else 0.0
        return CpuLoadReading(
            target_percent=self._target,
            achieved_percent=achieved,
            system_percent=system,
            cpus=self.cpus,
            workers=self._workers,
            interval_s=interval,
        )

    def measure(self, seconds: float) -> CpuLoadReading:
        """Block for `seconds` and report the load over that interval."""
        if not seconds > 0:
            raise CpuLoadError(f"measure seconds must be positive, got {seconds!r}")
        before = self.snapshot()
        time.sleep(seconds)
        return self.reading_since(before)

    # -- internals ---------------------------------------------------------------------
    def _current_cpu_s(self, proc: subprocess.Popen[bytes]) -> float:
        # Once stress-ng has exited (killed from outside, say) its tree can no longer be
        # read; keeping the last value keeps the counter from going backwards.
        if proc.poll() is None:
            self._seen_cpu_s = max(self._seen_cpu_s, _tree_cpu_s(proc.pid))
        return self._seen_cpu_s

    def _spawn(self, percent: float) -> None:
        exe = shutil.which(self._stress_ng)
        if exe is None:
            raise CpuLoadError(f"{self._stress_ng} is not installed (apt-get install stress-ng)")
        workers, per_worker = plan_workers(percent, self.cpus)
        argv = [exe, "--cpu", str(workers), "--cpu-load", str(per_worker), "--timeout", "0", "--quiet"]
        if self.cpu_method:
            argv += ["--cpu-method", self.cpu_method]
        parent_pid, nice = os.getpid(), self.nice

        def child_setup() -> None:
            if not die_with_parent(signal.SIGKILL, parent_pid=parent_pid):  # parent died before prctl took effect
                os._exit(1)
            if nice:
                os.setpriority(os.PRIO_PROCESS, 0, nice)

        stderr = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=child_setup,
                cwd=tempfile.gettempdir(),  # stress-ng may write temp files in its cwd
            )
        except subprocess.SubprocessError as exc:  # raised by child_setup, before exec
            stderr.close()
            if nice < 0:
                raise CpuLoadError(f"cannot start stress-ng at nice {nice}: a negative nice needs "
                                   f"root or CAP_SYS_NICE ({exc})") from exc
            raise CpuLoadError(f"cannot start {argv}: {exc}") from exc
        except OSError as exc:
            stderr.close()
            raise CpuLoadError(f"cannot start {argv}: {exc}") from exc
        try:
            if nice:
                _set_autogroup_nice(proc.pid, nice)
            try:
                proc.wait(timeout=_STARTUP_CHECK_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                stderr.seek(0)
                err = stderr.read().decode(errors="replace").strip()
                raise CpuLoadError(f"stress-ng exited at once (exit {proc.returncode}) for {argv}: {err}")
        except BaseException:
            _terminate_group(proc, grace_s=self.grace_s)
            raise
        finally:
            stderr.close()
        self._proc, self._workers = proc, workers
        _register(self)
        log.info("stress-ng pid %d: %d worker(s) at %d%% = %.0f%% of %.2f CPUs",
                 proc.pid, workers, per_worker, percent, self.cpus)


def _set_autogroup_nice(pid: int, nice: int) -> None:
    # With kernel.sched_autogroup_enabled, stress-ng's new session is its own scheduling
    # group and process nice only counts inside it; the group's nice decides against
    # other sessions. Absent file (autogroup off, or a cgroup decides) is fine.
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError as exc:
        log.debug("cannot set autogroup nice of %d: %s", pid, exc)


def _tree_cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process and its descendants (live and reaped)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue  # exited between listing and reading
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _terminate_group(proc: subprocess.Popen[bytes], *, grace_s: float) -> None:
    # Signal the group only while its leader is unreaped, so the id cannot be recycled.
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("stress-ng pid %d ignored SIGTERM for %.1f s; killing", proc.pid, grace_s)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    log.debug("stress-ng pid %d reaped (exit %s)", proc.pid, proc.returncode)


def _register(load: CpuLoad) -> None:
    global _atexit_registered
    _live.add(load)
    if not _atexit_registered:
        atexit.register(_stop_all)
        _atexit_registered = True


def _stop_all() -> None:
    for load in list(_live):
        load.stop()

"""Fixtures for tests that need root, network namespaces, tc or stress-ng.

Every namespace these tests create is named `lgt<creator pid, 6 hex><counter, 2 hex><role>`
(at most 15 characters, so the same string also names veth ends). Resources are removed in
`finally` blocks; a session-start sweep removes those of test runs that died (their creator
pid is gone), without touching a concurrent run's.
"""

import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from loadgen import netns

PREFIX = "lgt"
REPO = Path(__file__).resolve().parents[2]
_counter = itertools.count()


def _skip_reason_root_netns() -> str | None:
    if sys.platform != "linux":
        return "needs Linux network namespaces"
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc qdiscs need CAP_NET_ADMIN/CAP_SYS_ADMIN)"
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (apt-get install {pkg})"
    probe = f"{PREFIX}{os.getpid():06x}pr"
    try:
        netns.create_netns(probe)
    except Exception as exc:  # e.g. a container without the privilege to mount /run/netns
        return f"cannot create a network namespace here: {exc}"
    finally:
        try:
            netns.delete_netns(probe)
        except Exception:
            pass
    return None


@pytest.fixture(scope="session")
def root_netns():
    """Skip unless root with working `ip netns` and tc; sweep stale resources once."""
    reason = _skip_reason_root_netns()
    if reason:
        pytest.skip(reason)
    _sweep_stale()


@pytest.fixture(scope="session")
def stress_ng():
    if shutil.which("stress-ng") is None:
        pytest.skip("stress-ng not installed (apt-get install stress-ng)")


@pytest.fixture
def fleet_host(root_netns):
    """An emulated fleet can come up here (root, a cgroup v1 cpu controller: else skip); the fleets of
    test runs that died are taken down first. Test fleets are named f<letter><creator pid, 6 hex>."""
    from loadgen import fleet as fl

    try:
        fl.require_root()
    except fl.FleetError as exc:
        pytest.skip(str(exc))
    for prefix in fl.list_fleets():
        m = re.fullmatch(r"f[a-z]([0-9a-f]{6})", prefix)
        if m and int(m.group(1), 16) != os.getpid() and not psutil.pid_exists(int(m.group(1), 16)):
            fl.down(prefix)


def _sweep_stale() -> None:
    for name in netns.list_netns():
        if not name.startswith(PREFIX) or len(name) < len(PREFIX) + 6:
            continue
        try:
            creator = int(name[len(PREFIX):len(PREFIX) + 6], 16)
        except ValueError:
            continue
        if creator != os.getpid() and not psutil.pid_exists(creator):
            _kill_pids(netns.netns_pids(name))
            netns.delete_netns(name)


def _kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Namespaces:
    """Creates namespaces and veth pairs for one test, and removes them all afterwards."""

    def __init__(self) -> None:
        self.base = f"{PREFIX}{os.getpid():06x}{next(_counter) % 256:02x}"
        self.created: list[str] = []

    def name(self, role: str) -> str:
        return f"{self.base}{role}"

    def create(self, role: str) -> str:
        ns = self.name(role)
        netns.create_netns(ns)
        self.created.append(ns)
        return ns

    def cleanup(self) -> None:
        for ns in reversed(self.created):
            # Only processes inside our own namespaces, and only by pid.
            _kill_pids(netns.netns_pids(ns))
            netns.delete_netns(ns)


@pytest.fixture
def namespaces(root_netns):
    ns = Namespaces()
    try:
        yield ns
    finally:
        ns.cleanup()
        assert not [n for n in netns.list_netns() if n.startswith(ns.base)]


class Processes:
    """Subprocesses started by one test; killed (by pid) and reaped afterwards."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], **kwargs) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(argv, env=env, cwd=REPO, **kwargs)
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr, proc.stdin):
                if stream:
                    stream.close()


@pytest.fixture
def processes():
    procs = Processes()
    try:
        yield procs
    finally:
        procs.cleanup()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group; zombies that are ours get reaped."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and _alive(p.pid):
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def wait_until_gone(pids: list[int], pgid: int | None, *, timeout_s: float) -> list[int]:
    """Wait until none of `pids` (nor any member of `pgid`) lives; return the survivors."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if _alive(p)]
        if pgid is not None:
            alive += [p for p in group_members(pgid) if p not in alive]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)  # a zombie we adopted (see `gone`): reap it now
    except ChildProcessError:
        pass  # someone else's child: its parent reaps it
    return False


_PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def gone():
    """`wait_until_gone`, with this process made a child subreaper for the test.

    When a test kills stress-ng's owner, the orphaned stress-ng processes are adopted by
    this process instead of init, so they are reaped here at once rather than lingering as
    zombies until init gets round to them.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield wait_until_gone
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0)

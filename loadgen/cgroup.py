"""CPU quotas of cgroups (v1 or v2), and how many CPUs this process may use: its quota, else its affinity.

`read_quota_cpus` is the one reader of a cgroup's quota files; the emulated fleet
(loadgen.fleet) reads its devices' quotas through it too. The one writer is here as well
(cgroup v1, root): `write_control`, `cfs_quota_us`, and `remove_cgroup`, which stops what is
left in a cgroup before it removes it; the emulated fleet's device cgroups and the quota
groups of single processes (`CpuQuotaGroup`, e.g. one Flower SuperNode) are made with them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from loadgen.errors import CgroupError, LoadgenError

log = logging.getLogger(__name__)

CGROUP_V1_CPU_ROOT = Path("/sys/fs/cgroup/cpu")
MIN_CFS_QUOTA_US = 1000  # the kernel refuses a smaller cpu.cfs_quota_us (EINVAL)


def available_cpus() -> float:
    """CPUs this process may use: min(cgroup quota, affinity count); fractional under a quota."""
    affinity = float(len(os.sched_getaffinity(0)))
    quota = cgroup_quota_cpus()
    return affinity if quota is None else min(quota, affinity)


def cgroup_quota_cpus(*, proc: Path = Path("/proc/self")) -> float | None:
    """The tightest CPU quota (quota/period) on the way from this cgroup to its mount root.

    None when no quota is set. A quota on a parent cgroup limits its children too, which
    is why every ancestor is read, not only the process's own cgroup.
    """
    limits: list[float] = []
    for path, mount_root, version in _cpu_cgroup_dirs(proc):
        for d in _ancestors(path, mount_root):
            value = read_quota_cpus(d, version=version)
            if value is not None:
                limits.append(value)
    return min(limits) if limits else None


def read_quota_cpus(folder: Path, *, version: int = 1) -> float | None:
    """The CPU quota set on cgroup `folder`, in CPUs (quota / period); None when it sets none.

    v1 reads cpu.cfs_quota_us and cpu.cfs_period_us (quota -1: none), v2 cpu.max ("max
    PERIOD": none). A folder without those files (no cpu controller there) sets none. A
    period of 0 or a value that is not a number is a CgroupError naming the file: the kernel
    never writes one, and guessing would hide a broken cgroup behind a wrong CPU count.
    """
    if version == 1:
        quota_file, period_file = folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"
        try:
            quota_text, period_text = quota_file.read_text(), period_file.read_text()
        except OSError:
            return None
        quota, period = _number(quota_text, quota_file), _number(period_text, period_file)
        where = period_file
    else:
        where = folder / "cpu.max"
        try:
            fields = where.read_text().split()
        except OSError:
            return None
        if len(fields) != 2:
            raise CgroupError(f"{where}: expected 'QUOTA PERIOD', got {' '.join(fields)!r}")
        if fields[0] == "max":
            return None
        quota, period = _number(fields[0], where), _number(fields[1], where)
    if period <= 0:
        raise CgroupError(f"{where}: the CPU period must be > 0 us, got {period}")
    return quota / period if quota > 0 else None


def _number(text: str, where: Path) -> int:
    try:
        return int(text)
    except ValueError:
        raise CgroupError(f"{where}: expected a whole number of microseconds, got {text.strip()!r}") from None


def _ancestors(path: Path, mount_root: Path) -> list[Path]:
    out = [path]
    while path != mount_root and mount_root in path.parents:
        path = path.parent
        out.append(path)
    return out


def _cpu_cgroup_dirs(proc: Path) -> list[tuple[Path, Path, int]]:
    """(this process's cgroup dir, mount point, version) for each mounted cpu hierarchy."""
    try:
        cgroups = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    v1_paths: dict[str, str] = {}
    v2_path: str | None = None
    for line in cgroups:
        hier, controllers, path = line.split(":", 2)
        if hier == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_paths["cpu"] = path
    found: list[tuple[Path, Path, int]] = []
    for line in mounts:
        # mountinfo: id parent major:minor root mountpoint opts ... - fstype source superopts
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint, fstype, superopts = fields[3], Path(fields[4]), tail[0], tail[2]
        if fstype == "cgroup" and "cpu" in superopts.split(",") and "cpu" in v1_paths:
            found.append((_join(mountpoint, root, v1_paths["cpu"]), mountpoint, 1))
        elif fstype == "cgroup2" and v2_path is not None:
            found.append((_join(mountpoint, root, v2_path), mountpoint, 2))
    log.debug("cpu cgroup dirs: %s", found)
    return found


def _join(mountpoint: Path, mount_root: str, cgroup_path: str) -> Path:
    # Inside a cgroup namespace or a bind mount the mount root is not "/": strip it.
    rel = os.path.relpath(cgroup_path, mount_root) if cgroup_path.startswith(mount_root) else cgroup_path
    rel = rel.lstrip("/")
    return mountpoint if rel in ("", ".") else mountpoint / rel


# ---- writing (cgroup v1 cpu, root) -------------------------------------------------------------


def cfs_quota_us(cpus: float | None, *, period_us: int) -> int:
    """cpu.cfs_quota_us for a cap of `cpus` CPUs at `period_us` (-1: no cap); below 1 ms a period, 1 ms."""
    return -1 if cpus is None else max(MIN_CFS_QUOTA_US, round(cpus * period_us))


def write_control(path: Path, value: object, *, error: type[LoadgenError] = CgroupError) -> None:
    """Write `value` to the cgroup control file `path`; `error` names the file and the kernel's reason."""
    try:
        path.write_text(str(value))
    except OSError as exc:
        raise error(f"cannot write {value} to {path}: {exc.strerror}") from None


def cgroup_pids(folder: Path) -> list[int]:
    """The pids in cgroup `folder` (none when it is gone)."""
    try:
        return [int(x) for x in (folder / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def terminate(pids: list[int], *, grace_s: float) -> None:
    """SIGTERM to each of `pids`, SIGKILL to those still alive after `grace_s`; waits for them."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=2.0)


def remove_cgroup(folder: Path, *, error: type[LoadgenError] = CgroupError) -> None:
    """Remove cgroup `folder` (gone already: fine), stopping the processes still in it first."""
    for _ in range(50):  # a killed task may take a moment to leave its cgroup
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            terminate(cgroup_pids(folder), grace_s=0.5)
            time.sleep(0.1)
    raise error(f"cannot remove cgroup {folder}: it still holds processes {cgroup_pids(folder)}")


@dataclass(frozen=True)
class CpuQuotaGroup:
    """A cgroup v1 cpu folder capping what runs in it at `cpus` CPUs (root); `create`, then `remove`.

    A process enters it with loadgen.device_exec --cgroup before it execs its command, so that
    everything it starts is in it too."""

    path: Path
    cpus: float | None  # None: no cap (yet: cpu_quota_while sets one from inside)
    period_us: int

    @classmethod
    def create(cls, name: str, *, cpus: float | None, period_us: int = 10_000,
               root: Path = CGROUP_V1_CPU_ROOT) -> CpuQuotaGroup:
        """The cgroup ROOT/NAME (it must not exist) with cpu.cfs_period_us and cpu.cfs_quota_us set."""
        if not (root / "cpu.cfs_quota_us").exists():
            raise CgroupError(f"a CPU quota needs the cgroup v1 cpu controller at {root} (cpu.cfs_quota_us) and root")
        if cpus is not None and not cpus * period_us >= MIN_CFS_QUOTA_US:
            raise CgroupError(f"a quota of {cpus:g} CPU is below the kernel's minimum at a {period_us} us period "
                              f"({MIN_CFS_QUOTA_US / period_us:g} CPU: 1 ms per period)")
        group = cls(path=root / name, cpus=cpus, period_us=period_us)
        try:
            group.path.mkdir()
        except OSError as exc:
            raise CgroupError(f"cannot create cgroup {group.path}: {exc.strerror}") from None
        try:
            write_control(group.path / "cpu.cfs_period_us", period_us)
            write_control(group.path / "cpu.cfs_quota_us", cfs_quota_us(cpus, period_us=period_us))
        except BaseException:
            remove_cgroup(group.path)
            raise
        return group

    def pids(self) -> list[int]:
        return cgroup_pids(self.path)

    def remove(self) -> None:
        """Stop what is still in it, and remove it."""
        remove_cgroup(self.path)


def own_cpu_cgroup(*, proc: Path = Path("/proc/self")) -> Path:
    """The cgroup v1 cpu folder this process is in; a CgroupError when it has none, or only the hierarchy's root."""
    for path, mount_root, version in _cpu_cgroup_dirs(proc):
        if version == 1:
            if path == mount_root:
                raise CgroupError(f"this process is in the root cpu cgroup ({path}), which takes no quota: start it in "
                                  "a cgroup of its own (loadgen.cgroup.CpuQuotaGroup; loadgen.flower_fleet's "
                                  "NodeSpec.cgroup)")
            return path
    raise CgroupError("this process is in no cgroup v1 cpu hierarchy: a CPU quota needs one (root)")


@contextmanager
def cpu_quota_while(cpus: float, *, proc: Path = Path("/proc/self")) -> Iterator[Path]:
    """Cap this process's own cgroup (v1 cpu, root) at `cpus` CPUs inside the block; its earlier quota after it.

    Everything in that cgroup is capped meanwhile, as on a slow device. For a process that only its busy
    stretch should be slowed in: a Flower ClientApp starts afresh each round (its imports take 5 CPU
    seconds here), and a Flower 1.42 SuperNode restarts one that has not reported within 60 s."""
    folder = own_cpu_cgroup(proc=proc)
    quota_file = folder / "cpu.cfs_quota_us"
    try:
        before, period_us = quota_file.read_text().strip(), int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError) as exc:
        raise CgroupError(f"cannot read the CPU quota of {folder}: {exc}") from None
    if not cpus * period_us >= MIN_CFS_QUOTA_US:
        raise CgroupError(f"{folder}: a quota of {cpus:g} CPU is below the kernel's minimum at its {period_us} us "
                          f"period ({MIN_CFS_QUOTA_US / period_us:g} CPU)")
    write_control(quota_file, cfs_quota_us(cpus, period_us=period_us))
    try:
        yield folder
    finally:
        write_control(quota_file, before)

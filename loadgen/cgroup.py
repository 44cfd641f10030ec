"""CPU quotas of cgroups (v1 or v2), and how many CPUs this process may use: its quota, else its affinity.

`read_quota_cpus` is the one reader of a cgroup's quota files; the emulated fleet
(loadgen.fleet) reads its devices' quotas through it too.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from loadgen.errors import CgroupError

log = logging.getLogger(__name__)


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

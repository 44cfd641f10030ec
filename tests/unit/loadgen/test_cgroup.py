"""loadgen.cgroup.read_quota_cpus: the one reader of a cgroup's CPU quota (v1 and v2), and its errors."""

from __future__ import annotations

import pytest

from loadgen import cgroup
from loadgen.cgroup import read_quota_cpus
from loadgen.errors import CgroupError


def v1(folder, quota: str, period: str):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.cfs_quota_us").write_text(quota + "\n")
    (folder / "cpu.cfs_period_us").write_text(period + "\n")
    return folder


def v2(folder, text: str):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.max").write_text(text + "\n")
    return folder


def test_quotas_in_cpus_and_none_where_none_is_set(tmp_path) -> None:
    assert read_quota_cpus(v1(tmp_path / "a", "2500", "10000")) == 0.25
    assert read_quota_cpus(v1(tmp_path / "b", "-1", "10000")) is None
    assert read_quota_cpus(v2(tmp_path / "c", "50000 100000"), version=2) == 0.5
    assert read_quota_cpus(v2(tmp_path / "d", "max 100000"), version=2) is None
    assert read_quota_cpus(tmp_path / "no-cpu-controller") is None
    assert read_quota_cpus(tmp_path / "no-cpu-controller", version=2) is None


@pytest.mark.parametrize("version, make, message", [
    (1, lambda d: v1(d, "5000", "0"), r"cpu.cfs_period_us: the CPU period must be > 0 us, got 0"),
    (2, lambda d: v2(d, "5000 0"), r"cpu.max: the CPU period must be > 0 us, got 0"),
    (1, lambda d: v1(d, "lots", "10000"), r"cpu.cfs_quota_us: expected a whole number of microseconds, got 'lots'"),
    (2, lambda d: v2(d, "5000"), r"cpu.max: expected 'QUOTA PERIOD', got '5000'"),
], ids=["v1 period 0", "v2 period 0", "v1 not a number", "v2 one field"])
def test_what_the_kernel_never_writes_is_an_error_naming_the_file(tmp_path, version, make, message) -> None:
    folder = make(tmp_path / "dev0")
    with pytest.raises(CgroupError, match=message) as caught:
        read_quota_cpus(folder, version=version)
    assert str(folder) in str(caught.value)


def test_a_broken_ancestor_is_an_error_not_an_ignored_quota(tmp_path) -> None:
    mnt = tmp_path / "cpu"
    v1(mnt, "-1", "100000")
    v1(mnt / "fleet", "150000", "0")
    v1(mnt / "fleet" / "dev1", "300000", "100000")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("4:cpu,cpuacct:/fleet/dev1\n")
    (proc / "mountinfo").write_text(f"30 25 0:26 / {mnt} rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n")
    with pytest.raises(CgroupError, match=r"fleet/cpu.cfs_period_us"):
        cgroup.cgroup_quota_cpus(proc=proc)


def _in_cgroup(tmp_path, cgroup_path: str):
    """A /proc/self stand-in whose process is in `cgroup_path` of a v1 cpu hierarchy mounted at tmp_path/cpu."""
    mnt = tmp_path / "cpu"
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(f"4:cpu:{cgroup_path}\n")
    (proc / "mountinfo").write_text(f"30 25 0:26 / {mnt} rw,relatime shared:9 - cgroup cgroup rw,cpu\n")
    return mnt, proc


def test_a_quota_while_a_block_runs_is_its_own_cgroups_and_the_earlier_one_comes_back(tmp_path) -> None:
    mnt, proc = _in_cgroup(tmp_path, "/fflt/node3")
    v1(mnt / "fflt" / "node3", "-1", "100000")
    with cgroup.cpu_quota_while(0.02, proc=proc) as folder:
        assert folder == mnt / "fflt" / "node3"
        assert read_quota_cpus(folder) == 0.02  # 2 ms of each 100 ms period
    assert read_quota_cpus(folder) is None and (folder / "cpu.cfs_quota_us").read_text() == "-1"
    with pytest.raises(RuntimeError), cgroup.cpu_quota_while(0.5, proc=proc):
        raise RuntimeError("the block failed")
    assert read_quota_cpus(folder) is None  # lifted on the way out all the same


@pytest.mark.parametrize("where, cpus, message", [
    ("/", 0.5, r"in the root cpu cgroup .* start it in a cgroup of its own"),
    ("/fflt/node3", 0.005, r"0.005 CPU is below the kernel's minimum at its 100000 us period \(0.01 CPU\)"),
], ids=["root cgroup", "below the minimum"])
def test_a_quota_the_kernel_would_refuse_is_an_error_that_says_what_to_do(tmp_path, where, cpus, message) -> None:
    mnt, proc = _in_cgroup(tmp_path, where)
    v1(mnt / "fflt" / "node3", "-1", "100000")
    v1(mnt, "-1", "100000")
    with pytest.raises(CgroupError, match=message), cgroup.cpu_quota_while(cpus, proc=proc):
        pass
    assert read_quota_cpus(mnt / "fflt" / "node3") is None

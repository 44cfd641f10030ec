"""CPU-load sizing, validation and cgroup quota detection (no stress-ng needed)."""

import pytest

from loadgen import cgroup
from loadgen.cpu import CpuLoad, plan_workers, validate_percent
from loadgen.errors import CpuLoadError


@pytest.mark.parametrize("bad", [-1, 100.1, float("nan"), float("inf"), "30", None, True])
def test_percent_out_of_range_or_wrong_type_is_rejected(bad):
    with pytest.raises(CpuLoadError, match=r"\[0, 100\]"):
        validate_percent(bad)


@pytest.mark.parametrize("percent, cpus, expected", [
    (30, 2.0, (2, 30)),
    (70, 4.0, (4, 70)),
    (30, 0.5, (1, 15)),     # half a CPU: one worker at half the duty cycle
    (50, 1.5, (2, 38)),     # 0.75 CPU of work spread over two workers
    (0, 2.0, (2, 0)),
    (0.1, 1.0, (1, 1)),     # a tiny non-zero level still runs stress-ng
    (100, 2.0, (2, 100)),
])
def test_plan_workers(percent, cpus, expected):
    assert plan_workers(percent, cpus) == expected


def test_missing_stress_ng_says_how_to_install():
    load = CpuLoad(cpus=1, stress_ng="no-such-stress-ng-binary")
    with pytest.raises(CpuLoadError, match="apt-get install stress-ng"):
        load.start(30)
    assert load.pid is None and load.target_percent == 0


def test_zero_percent_runs_nothing_and_measures_zero():
    load = CpuLoad(cpus=1, stress_ng="no-such-stress-ng-binary")
    load.start(0)
    assert load.pid is None
    reading = load.measure(0.05)
    assert reading.achieved_percent == 0 and reading.target_percent == 0
    with pytest.raises(CpuLoadError, match="positive"):
        load.measure(0)


def test_bad_constructor_arguments():
    with pytest.raises(CpuLoadError, match="cpus"):
        CpuLoad(cpus=0)
    with pytest.raises(CpuLoadError, match="nice"):
        CpuLoad(cpus=1, nice=-21)


def _fake_proc(tmp_path, cgroup_lines, mount_lines):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    (proc / "mountinfo").write_text("\n".join(mount_lines) + "\n")
    return proc


def test_cgroup_v1_quota_is_the_tightest_ancestor(tmp_path):
    mnt = tmp_path / "cpu"
    for d, quota in ((mnt, -1), (mnt / "fleet", 150000), (mnt / "fleet" / "dev1", 300000)):
        d.mkdir(parents=True)
        (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (d / "cpu.cfs_period_us").write_text("100000\n")
    proc = _fake_proc(
        tmp_path,
        ["4:cpu,cpuacct:/fleet/dev1", "3:cpuset:/", "0::/"],
        [f"30 25 0:26 / {mnt} rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct",
         f"31 25 0:27 / {tmp_path}/cpuset rw - cgroup cgroup rw,cpuset"],
    )
    assert cgroup.cgroup_quota_cpus(proc=proc) == 1.5


def test_cgroup_v2_cpu_max(tmp_path):
    mnt = tmp_path / "unified"
    (mnt / "dev2").mkdir(parents=True)
    (mnt / "dev2" / "cpu.max").write_text("50000 100000\n")
    (mnt / "cpu.max").write_text("max 100000\n")
    proc = _fake_proc(tmp_path, ["0::/dev2"], [f"40 25 0:30 / {mnt} rw - cgroup2 cgroup2 rw"])
    assert cgroup.cgroup_quota_cpus(proc=proc) == 0.5


def test_no_quota_and_no_cgroup_files(tmp_path):
    mnt = tmp_path / "unified"
    mnt.mkdir()
    (mnt / "cpu.max").write_text("max 100000\n")
    proc = _fake_proc(tmp_path, ["0::/"], [f"40 25 0:30 / {mnt} rw - cgroup2 cgroup2 rw"])
    assert cgroup.cgroup_quota_cpus(proc=proc) is None
    assert cgroup.cgroup_quota_cpus(proc=tmp_path / "absent") is None
    assert cgroup.available_cpus() > 0


def test_bad_cpu_method_rejected_before_anything_runs():
    from loadgen.cpu import CpuLoad
    from loadgen.errors import CpuLoadError

    with pytest.raises(CpuLoadError, match="--cpu-method"):
        CpuLoad(cpus=1.0, cpu_method="int8; rm -rf /")

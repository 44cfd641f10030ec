"""A sweep run as Ray tasks on a local two-CPU Ray instance writes the same results as the local executor."""

import signal

import pytest

ray = pytest.importorskip("ray",
                          reason="Ray is an optional extra: pip install -e '.[cluster]' (make setup installs it)")

from simulator.executors import LocalExecutor, RayExecutor  # noqa: E402
from simulator.sweep import run_sweep  # noqa: E402

from .test_sweep import files_of, groups, quiet  # noqa: E402

LIMIT_S = 120  # Ray starts in ~7 s on this 2-core box; the sweep itself takes a second


@pytest.fixture
def local_ray():
    """A fresh local Ray instance with two CPUs (not one started by someone else), shut down after."""
    def too_slow(signum, frame):
        raise TimeoutError(f"the Ray sweep test took more than {LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(LIMIT_S)
    for attempt in (1, 2):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except RuntimeError:  # Ray's own start-up wait ("Timed out waiting for file ...") on a loaded machine
            ray.shutdown()
            if attempt == 2:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, previous)
                raise
    try:
        yield
    finally:
        ray.shutdown()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_ray_sweep_writes_what_the_local_executor_writes(tmp_path, local_ray):
    assert ray.cluster_resources()["CPU"] == 2
    lines: list[str] = []
    summaries = run_sweep(groups(), work_dir=tmp_path / "ray", executor=RayExecutor(None), report=quiet(lines))
    assert "on a local Ray instance" in lines[0] and not any(s["cached"] for s in summaries)
    assert ray.is_initialized()  # a Ray the test started is left to the test
    run_sweep(groups(), work_dir=tmp_path / "local", executor=LocalExecutor(jobs=1), report=quiet([]))
    for name in ("s0_A", "s0_B", "s0_C", "s1_A", "s1_B", "s1_C"):
        ours, theirs = files_of(tmp_path / "ray", name), files_of(tmp_path / "local", name)
        assert ours["summary"]["final_params_sha256"] == theirs["summary"]["final_params_sha256"]
        assert ours == theirs
    # Resume works across executors: the local executor finds the Ray sweep's runs finished.
    again = run_sweep(groups(), work_dir=tmp_path / "ray", executor=LocalExecutor(jobs=1), report=quiet([]))
    assert all(s["cached"] for s in again)

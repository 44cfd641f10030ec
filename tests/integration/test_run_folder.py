"""One run per output folder, with real coordinator processes: a lock, no silent overwrite, no leftovers."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from coordinator.metrics import read_metrics
from edge_agent.config import ParticipationConfig
from loadgen.harness import CoordinatorClient

from .conftest import TOKEN, coordinator_toml, flexfl_process, free_port


def _coordinator(config: Path, *args: str) -> subprocess.Popen:
    return flexfl_process("coordinator", "--config", str(config), *args)


def test_a_second_coordinator_on_the_same_folder_is_refused_and_a_restart_needs_resume_or_fresh(
        tmp_path, fleet_factory, live_config, procs, wait_for):
    port = free_port()
    config = coordinator_toml(tmp_path, port, rounds=40)
    first = _coordinator(config)
    procs.append(first)
    helper = fleet_factory(live_config(rounds=1, n_devices=3, min_devices=99))  # agents only (threads)
    helper.port = port
    for i in range(3):
        helper.start_agent(i, participation=ParticipationConfig(min_update_s=0.05))
    metrics = tmp_path / "out" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(read_metrics(metrics)) >= 2, what="two rounds")

    # Same config, another port: before the lock it started and truncated the first one's metrics.
    second = _coordinator(config, "--listen", f"127.0.0.1:{free_port()}")
    procs.append(second)
    printed, _ = second.communicate(timeout=60)
    assert second.returncode == 2, printed[-2000:]
    assert "is in use by another FlexFL process" in printed and f"pid {first.pid}" in printed, printed[-2000:]
    rows = read_metrics(metrics)
    assert rows[0].round == 1 and first.poll() is None  # the first one's rows are intact and it runs on

    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    rows = read_metrics(metrics)
    before = metrics.read_bytes()

    # A restart without --resume silently emptied metrics.jsonl and overwrote the checkpoint.
    restart = _coordinator(config)
    procs.append(restart)
    printed, _ = restart.communicate(timeout=60)
    assert restart.returncode == 2, printed[-2000:]
    assert f"holds an earlier run (metrics.jsonl with {len(rows)} rows; a checkpoint after round" in printed
    assert "--resume" in printed and "--fresh" in printed
    assert metrics.read_bytes() == before

    # --fresh moves the whole folder aside (nothing deleted) and starts again at round 1.
    (tmp_path / "out" / ".checkpoint.pt.x1y2.tmp").write_bytes(b"half a checkpoint")
    fresh = _coordinator(config, "--fresh", "--rounds", "1")
    procs.append(fresh)
    printed, _ = fresh.communicate(timeout=90)
    assert fresh.returncode == 0, printed[-2000:]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("out.previous-")]
    assert len(aside) == 1 and (aside[0] / "metrics.jsonl").read_bytes() == before
    assert [r.round for r in read_metrics(metrics)] == [1]


def test_resume_removes_the_temporaries_of_a_write_killed_midway(tmp_path, procs):
    port = free_port()
    config = coordinator_toml(tmp_path, port, rounds=50)
    coord = _coordinator(config)
    procs.append(coord)
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN)
    try:
        limit = time.monotonic() + 60
        while client.status() is None:
            assert time.monotonic() < limit and coord.poll() is None
            time.sleep(0.1)
    finally:
        client.close()
    coord.send_signal(signal.SIGTERM)
    coord.communicate(timeout=30)
    out = tmp_path / "out"
    # What a SIGKILL inside atomic_file leaves (60 kills left 15 of these, 12 full-size).
    leftovers = [out / ".checkpoint.pt.k3j4l5.tmp", out / ".metrics.jsonl.abcd.tmp"]
    for f in leftovers:
        f.write_bytes(b"\0" * 4096)
    resumed = _coordinator(config, "--resume", "--rounds", "1")  # no devices: stop it once it listens
    procs.append(resumed)
    limit = time.monotonic() + 60
    while any(f.exists() for f in leftovers):
        assert time.monotonic() < limit and resumed.poll() is None, "leftover temp files were not removed"
        time.sleep(0.1)
    resumed.send_signal(signal.SIGTERM)
    assert resumed.wait(timeout=30) == 0
    assert (out / "checkpoint.pt").exists()

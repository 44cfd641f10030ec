"""Every device departs: the run pauses until one joins (or ends with exit code 3), and --resume works.

Before: the round engine thread died with "the objective holds no samples", the process
printed "stopped after round 2" and exited 0, and every --resume crashed the same way.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from coordinator.metrics import read_metrics
from edge_agent.config import ParticipationConfig
from loadgen.harness import CoordinatorClient

from .conftest import TOKEN, coordinator_toml, flexfl_process, free_port

FAST = ParticipationConfig(min_update_s=0.05)


def _coordinator(config: Path, log: Path, *args: str) -> subprocess.Popen:
    return flexfl_process("coordinator", "--config", str(config), *args, log=log)


def test_every_device_departing_pauses_the_run_until_one_comes_back_also_after_resume(tmp_path, procs, agents,
                                                                                        wait_for):
    port = free_port()
    config = coordinator_toml(tmp_path, port, rounds=6)
    coord = _coordinator(config, tmp_path / "c1.log")
    procs.append(coord)
    fleet = [agents(port, i, participation=FAST) for i in range(3)]
    metrics = tmp_path / "out" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(read_metrics(metrics)) >= 2, timeout=90, what="two rounds")
    for agent in fleet:
        agent.stop(announce=True)  # what SIGTERM (or Ctrl-C) on `flexfl agent` does
    log = tmp_path / "c1.log"
    wait_for(lambda: "no device is left to train" in log.read_text(), timeout=60, what="the pause")
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN)
    try:
        paused_at = client.status().completed_round
        time.sleep(4.0)  # longer than a deadline: a run that went on would have closed a round
        st = client.status()
        assert coord.poll() is None and st.completed_round == paused_at and not st.finished, log.read_text()[-2000:]
    finally:
        client.close()
    assert "Traceback" not in log.read_text()
    coord.send_signal(signal.SIGTERM)
    assert coord.wait(timeout=30) == 0, log.read_text()[-2000:]

    resumed = _coordinator(config, tmp_path / "c2.log", "--resume")
    procs.append(resumed)
    agents(port, 1, participation=FAST)  # dev-1 comes back: it arrives and the run goes on to the end
    assert resumed.wait(timeout=120) == 0, (tmp_path / "c2.log").read_text()[-3000:]
    rows = read_metrics(metrics)
    assert [r.round for r in rows] == list(range(1, 7))
    after = [r for r in rows if r.round > paused_at]
    assert after and all(list(r.s) == ["dev-1"] and r.s["dev-1"] > 0 for r in after), [r.s for r in after]


def test_on_empty_stop_ends_with_exit_code_3_and_one_line_and_resume_continues(tmp_path, procs, agents, wait_for):
    port = free_port()
    config = coordinator_toml(tmp_path, port, on_empty="stop", rounds=4)
    log = tmp_path / "c1.log"
    coord = _coordinator(config, log)
    procs.append(coord)
    fleet = [agents(port, i, participation=FAST) for i in range(3)]
    metrics = tmp_path / "out" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(read_metrics(metrics)) >= 1, timeout=90, what="a round")
    for agent in fleet:
        agent.stop(announce=True)
    assert coord.wait(timeout=60) == 3, log.read_text()[-2000:]
    text = log.read_text()
    assert "every device departed before round" in text and "run.on_empty = stop" in text
    assert "Traceback" not in text

    resumed = _coordinator(config, tmp_path / "c2.log", "--resume")
    procs.append(resumed)
    agents(port, 2, participation=FAST)
    assert resumed.wait(timeout=120) == 0, (tmp_path / "c2.log").read_text()[-3000:]
    assert [r.round for r in read_metrics(metrics)] == [1, 2, 3, 4]

"""Real processes: an agent killed mid-round, a coordinator killed and resumed, SIGTERM checkpoints."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from coordinator.checkpoint import load_checkpoint
from coordinator.metrics import read_metrics
from edge_agent.config import ParticipationConfig

TOKEN = "test-fleet-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def _flexfl(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flexfl.cli", *args], stdout=open(log, "w"), stderr=subprocess.STDOUT)


@pytest.fixture
def procs():
    running: list[subprocess.Popen] = []
    yield running
    for p in running:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def test_agent_killed_mid_round_counts_as_inactive(live_config, fleet_factory, tmp_path, procs, wait_for):
    cfg = live_config(rounds=4, n_devices=3, min_devices=3, deadline_s=3.0)
    fleet = fleet_factory(cfg)
    slow = ParticipationConfig(min_update_s=0.2)  # 5 updates take ~1 s: a wide window to kill in
    fleet.start_agent(0, participation=slow)
    fleet.start_agent(1, participation=slow)
    t = cfg.training
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "agent.toml").write_text(f"""
coordinator = "127.0.0.1:{fleet.port}"
device_id = "dev-2"
fleet_token_file = "token"
pull_wait_s = 0.5
[data]
dataset = "{t.dataset}"
n_devices = {t.n_devices}
total_samples = {t.total_samples}
shard_index = 2
[participation]
min_update_s = 0.2
""")
    agent = _flexfl("agent", "--config", str(tmp_path / "agent.toml"), log=tmp_path / "agent.log")
    procs.append(agent)
    engine = fleet.coordinator.engine

    def dev2_training_in_round_2():
        r = engine.current
        return r is not None and r.round_id == 2 and "dev-2" in r.delivered and "dev-2" not in r.updates

    wait_for(dev2_training_in_round_2, what="dev-2 to be mid-round 2")
    agent.send_signal(signal.SIGKILL)
    assert fleet.coordinator.wait(timeout=60)
    rows = {r["round"]: r for r in read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")}
    assert rows[1]["s"]["dev-2"] == 5
    assert rows[2]["s"]["dev-2"] == 0 and rows[2]["close_reason"] == "deadline"
    assert rows[2]["s"]["dev-0"] == 5 and rows[2]["s"]["dev-1"] == 5
    assert rows[2]["coefficients"]["dev-2"] == 0
    # A silent device stays in the objective.
    assert rows[4]["p"]["dev-2"] > 0 and "dev-2" in rows[4]["participants"]


def _coordinator_toml(tmp_path: Path, port: int, rounds: int) -> Path:
    (tmp_path / "token").write_text(TOKEN)
    path = tmp_path / "coordinator.toml"
    path.write_text(f"""
[server]
listen = "127.0.0.1:{port}"
fleet_token_file = "token"
pull_wait_s = 0.5
[training]
dataset = "synthetic"
n_devices = 3
total_samples = 1600
rounds = {rounds}
required_updates = 5
deadline_s = 3.0
min_devices = 3
[output]
dir = "out"
""")
    return path


def test_coordinator_killed_and_resumed_continues_and_agents_reconnect(fleet_factory, live_config, tmp_path, procs, wait_for):
    port = _free_port()
    config = _coordinator_toml(tmp_path, port, rounds=6)
    coord = _flexfl("coordinator", "--config", str(config), log=tmp_path / "c1.log")
    procs.append(coord)
    # Agents as threads pointing at the subprocess coordinator (fleet_factory only for agent configs).
    helper = fleet_factory(live_config(rounds=1, n_devices=3, min_devices=99))
    helper.port = port
    agents = [helper.start_agent(i, participation=ParticipationConfig(min_update_s=0.05)) for i in range(3)]
    metrics = tmp_path / "out" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(read_metrics(metrics)) >= 2, what="two rounds")
    coord.send_signal(signal.SIGKILL)
    coord.wait(timeout=10)
    done_before = len(read_metrics(metrics))
    ckpt = load_checkpoint(tmp_path / "out" / "checkpoint.pt", expected={"linear.weight": ((10, 60), None), "linear.bias": ((10,), None)})
    assert ckpt.completed_round >= 2
    time.sleep(1.0)  # agents now see UNAVAILABLE and back off
    coord2 = _flexfl("coordinator", "--config", str(config), "--resume", log=tmp_path / "c2.log")
    procs.append(coord2)
    assert coord2.wait(timeout=90) == 0, (tmp_path / "c2.log").read_text()[-2000:]
    rounds = [r["round"] for r in read_metrics(metrics)]
    assert rounds == sorted(set(rounds)) and rounds[-1] == 6, rounds
    assert rounds[done_before] == ckpt.completed_round + 1  # continued from the next round
    after = read_metrics(metrics)[done_before:]
    # All three agents reconnected and trained after the restart.
    assert all(all(v == 5 for v in r["s"].values()) for r in after), [r["s"] for r in after]
    assert all(any(d["round"] > ckpt.completed_round for d in a.rounds_done) for a in agents)
    assert "resumed from" in (tmp_path / "c2.log").read_text()


def test_sigterm_leaves_a_final_checkpoint(tmp_path, procs, wait_for):
    port = _free_port()
    config = _coordinator_toml(tmp_path, port, rounds=50)
    coord = _flexfl("coordinator", "--config", str(config), log=tmp_path / "c.log")
    procs.append(coord)
    wait_for(lambda: "listening" in (tmp_path / "c.log").read_text(), what="coordinator to listen")
    coord.send_signal(signal.SIGTERM)
    assert coord.wait(timeout=20) == 0
    ckpt = tmp_path / "out" / "checkpoint.pt"
    assert ckpt.exists()
    raw = torch.load(ckpt, weights_only=True)
    assert raw["completed_round"] == 0 and set(raw["params"]) == {"linear.weight", "linear.bias"}
    assert "stopped after round 0" in (tmp_path / "c.log").read_text()

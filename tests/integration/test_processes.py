"""Real processes: an agent killed mid-round, a coordinator killed and resumed, SIGTERM checkpoints."""

from __future__ import annotations

import logging
import signal
from dataclasses import replace

import torch

from coordinator.checkpoint import load_checkpoint
from coordinator.metrics import read_metrics
from edge_agent.config import ParticipationConfig
from flexfl.config import write_config
from loadgen.harness import CoordinatorClient

from .conftest import TOKEN, coordinator_toml, flexfl_process, free_port


def test_agent_killed_mid_round_counts_as_inactive(live_config, fleet_factory, tmp_path, procs, wait_for):
    cfg = live_config(rounds=4, n_devices=3, min_devices=3, deadline_s=3.0)
    fleet = fleet_factory(cfg)
    slow = ParticipationConfig(min_update_s=0.2)  # 5 updates take ~1 s: a wide window to kill in
    fleet.start_agent(0, participation=slow)
    fleet.start_agent(1, participation=slow)
    (tmp_path / "token").write_text(TOKEN)
    config = write_config(tmp_path / "agent.toml", replace(fleet.agent_config(2, participation=slow),
                                                           fleet_token="", fleet_token_file=str(tmp_path / "token")))
    agent = flexfl_process("agent", "--config", str(config), log=tmp_path / "agent.log")
    procs.append(agent)
    engine = fleet.coordinator.engine

    def dev2_training_in_round_2():
        r = engine.current
        return r is not None and r.round_id == 2 and "dev-2" in r.delivered and "dev-2" not in r.updates

    wait_for(dev2_training_in_round_2, what="dev-2 to be mid-round 2")
    agent.send_signal(signal.SIGKILL)
    assert fleet.coordinator.wait(timeout=60)
    rows = {r.round: r for r in read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")}
    assert rows[1].s["dev-2"] == 5
    assert rows[2].s["dev-2"] == 0 and rows[2].live.close_reason == "deadline"
    assert rows[2].s["dev-0"] == 5 and rows[2].s["dev-1"] == 5
    assert rows[2].coefficients["dev-2"] == 0
    # A silent device stays in the objective.
    assert rows[4].p["dev-2"] > 0 and "dev-2" in rows[4].participants


def test_coordinator_killed_and_resumed_continues_and_agents_reconnect(fleet_factory, live_config, tmp_path, procs,
                                                                       wait_for, caplog):
    caplog.set_level(logging.WARNING, logger="edge_agent.transport")
    port = free_port()
    config = coordinator_toml(tmp_path, port, rounds=6)
    coord = flexfl_process("coordinator", "--config", str(config), log=tmp_path / "c1.log")
    procs.append(coord)
    # Agents as threads pointing at the subprocess coordinator (fleet_factory only for agent configs).
    helper = fleet_factory(live_config(rounds=1, n_devices=3, min_devices=99))
    helper.port = port
    agents = [helper.start_agent(i, participation=ParticipationConfig(min_update_s=0.05)) for i in range(3)]
    metrics = tmp_path / "out" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(read_metrics(metrics)) >= 2, what="two rounds")
    coord.send_signal(signal.SIGKILL)
    coord.wait(timeout=10)
    ckpt = load_checkpoint(tmp_path / "out" / "checkpoint.pt",
                           expected={"linear.weight": ((10, 60), None), "linear.bias": ((10,), None)})
    # Each round's row is written before its checkpoint: the kill may fall between the two.
    assert ckpt.completed_round >= 1 and len(read_metrics(metrics)) in (ckpt.completed_round, ckpt.completed_round + 1)
    # Every agent has seen the coordinator gone and is backing off (its transport's retry warning names it first),
    # so the restart below is met by reconnects, the branch this test is about.
    def retrying() -> set:
        return {r.args[0] for r in caplog.records if r.name == "edge_agent.transport" and r.levelno == logging.WARNING
                and isinstance(r.args, tuple) and r.args}

    wait_for(lambda: retrying() >= {"dev-0", "dev-1", "dev-2"}, what="every agent retrying")
    coord2 = flexfl_process("coordinator", "--config", str(config), "--resume", log=tmp_path / "c2.log")
    procs.append(coord2)
    assert coord2.wait(timeout=90) == 0, (tmp_path / "c2.log").read_text()[-2000:]
    rounds = [r.round for r in read_metrics(metrics)]
    assert rounds == [1, 2, 3, 4, 5, 6], rounds  # one row per round: a row the checkpoint lacked was redone
    after = [r for r in read_metrics(metrics) if r.round > ckpt.completed_round]
    # All three agents reconnected and trained after the restart.
    assert all(all(v == 5 for v in r.s.values()) for r in after), [r.s for r in after]
    assert all(any(d.round_id > ckpt.completed_round for d in a.rounds_done) for a in agents)
    assert "resumed from" in (tmp_path / "c2.log").read_text()


def test_sigterm_leaves_a_final_checkpoint(tmp_path, procs, wait_for):
    port = free_port()
    config = coordinator_toml(tmp_path, port, rounds=50)
    coord = flexfl_process("coordinator", "--config", str(config), log=tmp_path / "c.log")
    procs.append(coord)
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN)
    wait_for(lambda: client.status() is not None, what="coordinator to answer Status")
    client.close()
    coord.send_signal(signal.SIGTERM)
    assert coord.wait(timeout=20) == 0
    ckpt = tmp_path / "out" / "checkpoint.pt"
    assert ckpt.exists()
    raw = torch.load(ckpt, weights_only=True)
    assert raw["completed_round"] == 0 and set(raw["params"]) == {"linear.weight", "linear.bias"}
    assert "stopped after round 0" in (tmp_path / "c.log").read_text()


def test_a_departure_announced_before_a_crash_is_not_lost(tmp_path, procs, agents, wait_for):
    """Before: the Leave lived only in memory until its round's checkpoint; a coordinator killed in
    between came back with the device still in the objective (silent forever: it will not announce
    again). Found by the soak, whose departures sometimes vanished after its coordinator kill."""
    port = free_port()
    config = coordinator_toml(tmp_path, port, rounds=3, deadline_s=60.0)
    log = tmp_path / "c1.log"
    coord = flexfl_process("coordinator", "--config", str(config), log=log)
    procs.append(coord)
    slow = agents(port, 0, participation=ParticipationConfig(min_update_s=3.0))  # holds each round ~15 s
    leaving = agents(port, 1, participation=ParticipationConfig(min_update_s=0.05))
    agents(port, 2, participation=ParticipationConfig(min_update_s=0.05))
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN)
    try:
        checkpoint = tmp_path / "out" / "checkpoint.pt"
        wait_for(lambda: (st := client.status()) is not None and st.open_round == 2 and checkpoint.exists(),
                 timeout=90, what="round 1's checkpoint and round 2 open")
        leaving.stop(announce=True)
        wait_for(lambda: any(d.device_id == "dev-1" and d.departed for d in client.status().devices), timeout=30,
                 what="dev-1's departure to reach the coordinator")
        assert client.status().open_round == 2  # round 2 (and its checkpoint) have not closed
    finally:
        client.close()
    coord.send_signal(signal.SIGKILL)
    coord.wait(timeout=10)
    slow.stop(announce=False)  # let the resumed rounds run at the others' pace
    resumed = flexfl_process("coordinator", "--config", str(config), "--resume", log=tmp_path / "c2.log")
    procs.append(resumed)
    agents(port, 0, participation=ParticipationConfig(min_update_s=0.05))
    assert resumed.wait(timeout=120) == 0, (tmp_path / "c2.log").read_text()[-3000:]
    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r.round for r in rows] == [1, 2, 3]
    assert rows[1].departures == ("dev-1",), [r.departures for r in rows]
    assert "dev-1" not in rows[2].participants and "dev-1" not in rows[2].p

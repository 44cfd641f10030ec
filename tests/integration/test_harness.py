"""The process harness: ready through Status, joined devices, exits reported, children die with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig
from coordinator.metrics import read_metrics
from edge_agent.config import AgentConfig
from flexfl.config import load_config, write_config
from loadgen.harness import Harness, HarnessError, free_port

from .conftest import make_config

TOKEN = "harness-token"


def _configs(tmp_path: Path, *, rounds: int = 2, start_grace_s: float = 0.0) -> tuple[Path, str]:
    (tmp_path / "token").write_text(TOKEN)
    address = f"127.0.0.1:{free_port()}"
    cfg = make_config(tmp_path, n_devices=2, min_devices=2, rounds=rounds, deadline_s=5.0)
    cfg = cfg.__class__(server=cfg.server.__class__(listen=address, fleet_token_file=str(tmp_path / "token"),
                                                    pull_wait_s=0.5),
                        partition=cfg.partition, rules=cfg.rules,
                        run=RunConfig(rounds=rounds, deadline_s=5.0, min_devices=2, start_grace_s=start_grace_s),
                        output=OutputConfig(dir=str(tmp_path / "out")))
    write_config(tmp_path / "c.toml", cfg)
    for i in range(2):
        write_config(tmp_path / f"a{i}.toml", AgentConfig(coordinator=address, device_id=f"dev-{i}", shard_index=i,
                                                         fleet_token_file=str(tmp_path / "token"), pull_wait_s=0.5))
    return tmp_path / "c.toml", address


def test_harness_waits_through_status_and_reports_exits(tmp_path: Path) -> None:
    # Two rounds of this size take well under a poll of the harness: the grace keeps the joined
    # devices visible long enough for wait_joined to see them before the run ends.
    config, address = _configs(tmp_path, start_grace_s=2.0)
    with Harness(tmp_path / "logs") as h:
        h.start_coordinator(config, address=address, token=TOKEN)
        st = h.wait_ready(timeout_s=120)
        assert st.completed_round == 0 and not st.started and st.rounds == 2
        for i in range(2):
            h.start_agent(f"agent-{i}", tmp_path / f"a{i}.toml")
        st = h.wait_joined(["dev-0", "dev-1"], timeout_s=120)
        assert {d.device_id: d.shard_index for d in st.devices} == {"dev-0": 0, "dev-1": 1}
        h.procs["coordinator"].proc.wait(timeout=60)
        with pytest.raises(HarnessError, match="coordinator exited with code 0 while waiting for round 3"):
            h.wait_round(3, timeout_s=60)
        exits = h.exits()  # the coordinator was waited for above: its exit is known
        assert exits.get("coordinator") == 0, exits
        again = h.exits()  # each exit is reported once: only an agent that ended since may appear
        assert set(again) <= {"agent-0", "agent-1"} - set(exits), (exits, again)
    with pytest.raises(HarnessError, match="agent-x exited with code"), Harness(tmp_path / "logs2") as h2:
        h2.start_agent("agent-x", tmp_path / "no-such.toml")
        h2.procs["agent-x"].proc.wait(timeout=60)
        h2.check("agent-x")


def test_children_die_when_the_harness_is_killed(tmp_path: Path) -> None:
    config, address = _configs(tmp_path, rounds=100)
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from loadgen.harness import Harness
        h = Harness(Path({str(tmp_path / 'logs')!r}))
        m = h.start_coordinator(Path({str(config)!r}), address={address!r}, token={TOKEN!r})
        h.wait_ready(timeout_s=120)
        print(m.proc.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert psutil.pid_exists(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        psutil.Process(child).wait(timeout=30)  # raises TimeoutExpired if it outlives the harness
    finally:
        if parent.poll() is None:
            parent.kill()


def test_an_agent_that_serves_runs_joins_the_next_run_after_one_finished(tmp_path: Path) -> None:
    """serve_runs (a fleet's agent service): after a run's FINISHED the agent waits for the coordinator's next run,
    a new coordinator on the same address, and trains in it with the new run's partition."""
    config, address = _configs(tmp_path)
    for i in range(2):
        write_config(tmp_path / f"a{i}.toml", AgentConfig(coordinator=address, device_id=f"dev-{i}", shard_index=i,
                                                         fleet_token_file=str(tmp_path / "token"), pull_wait_s=0.5,
                                                         backoff_max_s=1.0, serve_runs=True))
    assert "serve_runs = true" in (tmp_path / "a0.toml").read_text()
    first = load_config(CoordinatorConfig, config)
    second = replace(first, run=replace(first.run, seed=1), partition=replace(first.partition, seed=7),
                     output=OutputConfig(dir=str(tmp_path / "out2")))
    write_config(tmp_path / "c2.toml", second)
    with Harness(tmp_path / "logs") as h:
        h.start_coordinator(config, address=address, token=TOKEN)
        h.wait_ready(timeout_s=120)
        for i in range(2):
            h.start_agent(f"agent-{i}", tmp_path / f"a{i}.toml")
        h.procs["coordinator"].proc.wait(timeout=120)
        assert h.procs["coordinator"].proc.returncode == 0
        h.start_coordinator(tmp_path / "c2.toml", address=address, token=TOKEN, name="coordinator-2")
        h.procs["coordinator-2"].proc.wait(timeout=180)
        assert h.procs["coordinator-2"].proc.returncode == 0
        time.sleep(1.0)
        assert all(h.procs[f"agent-{i}"].proc.poll() is None for i in range(2)), "an agent exited after a run"
    for name, out in (("first", tmp_path / "out"), ("second", tmp_path / "out2")):
        rows = read_metrics(out / "metrics.jsonl")
        assert len(rows) == 2 and all(r.s["dev-0"] > 0 and r.s["dev-1"] > 0 for r in rows), (name, rows)
    log = (tmp_path / "logs" / "agent-0.log").read_text()
    assert log.count("dev-0 joined as index") == 2 and "waiting for the coordinator's next run" in log, log

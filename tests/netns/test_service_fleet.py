"""A campaign on a fleet whose agents run as services on their devices (as on Pis): each run starts only its
coordinator here, and the agents, started once and never by the campaign, join run after run (serve_runs).

The devices are emulated (a network namespace and veth link each) and their agents are started by the test,
as systemd starts them on a Pi, dialing the address the fleet file's [server] listens on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from coordinator.metrics import read_metrics
from edge_agent.config import AgentConfig
from flexfl.config import write_config
from loadgen import fleet as fl
from loadgen.harness import Harness, free_port


def test_a_campaign_on_service_agents_runs_every_run_with_only_its_coordinator_here(fleet_host,
                                                                                  tmp_path: Path) -> None:
    prefix = f"fs{os.getpid():06x}"
    subnet = f"10.78.{(os.getpid() % 60) * 4}"
    token = tmp_path / "fleet_token"
    token.write_text("service-fleet-token\n")
    fleet = fl.EmulatedFleet.up(fl.FleetSpec(devices=(fl.DeviceSpec(cpu_quota=None),) * 2, prefix=prefix,
                                             subnet=subnet))
    try:
        address = f"{fleet.coordinator_host}:{free_port(fleet.coordinator_host)}"
        with Harness(tmp_path / "devices", fleet=fleet) as devices:
            for i in range(2):  # the devices' own agents: started once, as their services
                write_config(tmp_path / f"pi-{i}.toml", AgentConfig(
                    coordinator=address, device_id=f"pi-{i}", shard_index=i, fleet_token_file=str(token),
                    pull_wait_s=0.5, backoff_max_s=1.0, serve_runs=True))
                devices.start_agent(f"pi-{i}", tmp_path / f"pi-{i}.toml", device=i)
            (tmp_path / "fleet.toml").write_text(f'devices = ["pi-0", "pi-1"]\n[server]\nlisten = "{address}"\n'
                                                 f'fleet_token_file = "{token}"\n')
            (tmp_path / "c.toml").write_text("""
[campaign]
name = "services"
[base]
arrive_round = 0
depart_round = 0
[base.run]
rounds = 2
deadline_s = 2.0
[base.partition]
dataset = "synthetic"
n_devices = 2
[base.rules]
required_updates = 10
[axes]
"run.seed" = [0, 1]
""")
            out = tmp_path / "campaign"
            run = subprocess.run([sys.executable, "-m", "flexfl.app.cli", "campaign", "run", str(tmp_path / "c.toml"),
                                  "--fleet", str(tmp_path / "fleet.toml"), "--out", str(out)],
                                 capture_output=True, text=True, timeout=600)
            assert run.returncode == 0, (run.stdout[-3000:], run.stderr)
            assert f"on the fleet of {tmp_path / 'fleet.toml'}" in run.stdout
            assert f"watch the fleet: flexfl status {address} --token-file {token}" in run.stdout
            assert all(devices.procs[f"pi-{i}"].proc.poll() is None for i in range(2))  # still serving
        logs = {i: (tmp_path / "devices" / f"pi-{i}.log").read_text() for i in range(2)}
    finally:
        fleet.down()
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
    index = json.loads((out / "campaign.json").read_text())
    assert [(r["name"], r["state"], r["rounds"]) for r in index["runs"]] == [("seed-0", "done", 2),
                                                                             ("seed-1", "done", 2)]
    for name in ("seed-0", "seed-1"):
        rows = read_metrics(out / "runs" / name / "coordinator" / "metrics.jsonl")
        assert [sorted(r.s) for r in rows] == [["pi-0", "pi-1"]] * 2 and all(v > 0 for r in rows for v in r.s.values())
        assert not list((out / "runs" / name).glob("agent-*.toml"))  # no agent of flexfl live's own
        for i in range(2):  # each device's own log of this run, as its service sent it (no login on the device)
            kept = (out / "runs" / name / "coordinator" / "agent_logs" / f"pi-{i}.log").read_text()
            assert kept.count(f"pi-{i} joined as index {i}") == 1 and kept.count("training finished") == 1, kept
            assert kept.count(f"pi-{i} round ") == 2, kept
    for i, log in logs.items():
        assert log.count(f"pi-{i} joined as index") == 2, log  # one agent process, two runs

"""`flexfl new`'s starter runs as written, in simulation and live on loopback, from another folder; an agent that
cannot import the coordinator's plug-ins stops before it joins, with one line that says so."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.metrics import read_metrics
from coordinator.rules.config import RulesConfig
from edge_agent.config import AgentConfig
from flexfl.config import write_config
from workloads.partition_spec import PartitionSpec

from .conftest import TOKEN, flexfl_process, free_port


def _flexfl(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flexfl.app.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _rounds_with_accuracy(path: Path) -> list[int]:
    rows = read_metrics(path)
    assert all(math.isfinite(r.test_acc) and 0 <= r.test_acc <= 1 for r in rows), rows
    return [r.round for r in rows]


def test_the_starter_runs_in_simulation_and_live_from_another_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"  # not the starter's folder, nor the checkout
    elsewhere.mkdir()
    new = _flexfl("new", str(tmp_path / "exp"), cwd=elsewhere, timeout=120)
    assert new.returncode == 0, new.stderr
    # The starter's own commands, shortened: fewer rounds and devices.
    sim = _flexfl("sim", "run", "--config", str(tmp_path / "exp" / "sim.toml"), "--scheme", "myfl.strategy:SqrtRescale",
                  "--scheme", "C", "--rounds", "3", "--out", "out/sim", cwd=elsewhere, timeout=300)
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert _rounds_with_accuracy(elsewhere / "out" / "sim" / "sqrt-c" / "metrics.jsonl") == [1, 2, 3]
    assert _rounds_with_accuracy(elsewhere / "out" / "sim" / "C" / "metrics.jsonl") == [1, 2, 3]
    assert "final test accuracy: Scheme C, square-root rescaling " in sim.stdout
    live = _flexfl("live", "--config", str(tmp_path / "exp" / "live.toml"), "--rounds", "4", "--devices", "3",
                   "--deadline-s", "3", cwd=elsewhere, timeout=300)
    assert live.returncode == 0, live.stdout + live.stderr
    out = tmp_path / "exp" / "out" / "live"  # live.toml's out, relative to the file
    assert _rounds_with_accuracy(out / "coordinator" / "metrics.jsonl") == [1, 2, 3, 4]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "myfl.strategy:SqrtRescale" and summary["rounds"] == 4
    assert "under Scheme C, square-root rescaling after 4 of 4 rounds" in live.stdout


def test_an_agent_without_the_plug_in_stops_before_joining_with_one_line(tmp_path: Path, monkeypatch, procs,
                                                                         forget_myfl) -> None:
    """The coordinator has the starter's package (plugin_path); the agent's config has no plugin_path."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _flexfl("new", str(tmp_path / "exp"), cwd=elsewhere, timeout=120).returncode == 0
    monkeypatch.syspath_prepend(str(tmp_path / "exp"))  # this process builds the config, which checks the plug-ins
    port = free_port()
    (tmp_path / "token").write_text(TOKEN)
    coordinator = CoordinatorConfig(
        server=ServerConfig(listen=f"127.0.0.1:{port}", fleet_token_file=str(tmp_path / "token")),
        partition=PartitionSpec(dataset="myfl.data:blobs", n_devices=2, iid=True),
        rules=RulesConfig(model="myfl.model:TinyNet", eta0=0.5, batch_size=16, required_updates=3),
        run=RunConfig(rounds=1, min_devices=2), output=OutputConfig(dir=str(tmp_path / "out")),
        plugin_path=str(tmp_path / "exp"))
    config = write_config(tmp_path / "coordinator.toml", coordinator)
    procs.append(flexfl_process("coordinator", "--config", str(config), log=tmp_path / "coordinator.log"))
    agent = AgentConfig(coordinator=f"127.0.0.1:{port}", device_id="pi-1", shard_index=0,
                        fleet_token_file=str(tmp_path / "token"), give_up_after_s=60.0)
    run = _flexfl("agent", "--config", str(write_config(tmp_path / "agent.toml", agent)), cwd=elsewhere, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("flexfl: error: ")]
    assert errors == [f"flexfl: error: coordinator 127.0.0.1:{port}: [partition] partition.dataset: dataset plug-in "
                      "'myfl.data:blobs' cannot be imported here: no module named 'myfl'. A plug-in must be importable "
                      "by every program that uses it (simulator, coordinator and each agent): install its package "
                      "there, or set plugin_path in that program's config to the folder that holds myfl"], run.stderr

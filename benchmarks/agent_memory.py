"""Benchmark: an edge agent's memory beside torch's own, in one run (issue 12's Pi budget).

    python -m benchmarks.agent_memory [--dataset mnist] [--devices 10] [--repeat 3]

Measures, from /proc/<pid>/status of real processes:
- a bare `python -c "import torch"`: VmRSS and VmHWM (the floor any agent pays);
- a real `flexfl agent` process that learned its partition, loaded its shard and joined a
  coordinator on loopback (started and awaited by flexfl.harness): VmRSS right after it
  joined and 5 s later (idle, waiting for a round), and VmHWM (its start-up peak); the
  resident memory the agent itself reported when joining (coordinator registry);
and prints them against the goals: idle RSS <= torch + 30 MiB, peak <= torch + 80 MiB.
Each figure is the median of --repeat alternating runs (torch, agent, torch, agent, ...).
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from edge_agent.config import AgentConfig
from flexfl.config import write_config
from flexfl.files import atomic_file
from flexfl.harness import Harness, free_port
from workloads.partition_spec import PartitionSpec, Sizes

TOKEN = "memory-bench"


def status_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def torch_floor() -> dict[str, float]:
    code = ("import torch, pathlib; s = pathlib.Path('/proc/self/status').read_text().splitlines(); "
            "print(' '.join(l.split()[1] for l in s if l.startswith(('VmRSS:', 'VmHWM:'))))")
    rss, hwm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return {"VmRSS": int(rss) / 1024, "VmHWM": int(hwm) / 1024}


def agent_once(dataset: str, devices: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d, Harness(Path(d)) as h:
        tmp = Path(d)
        with atomic_file(tmp / "token", perms=0o600) as f:
            f.write(TOKEN)
        address = f"127.0.0.1:{free_port()}"
        partition = PartitionSpec(dataset=dataset, n_devices=devices, iid=True, sizes=Sizes.EQUAL)
        write_config(tmp / "c.toml", CoordinatorConfig(
            server=ServerConfig(listen=address, fleet_token_file=str(tmp / "token")), partition=partition,
            run=RunConfig(rounds=1, min_devices=2), output=OutputConfig(dir=str(tmp / "out"))))
        write_config(tmp / "a.toml", AgentConfig(coordinator=address, device_id="pi-0", shard_index=1,
                                                 fleet_token_file=str(tmp / "token")))
        h.start_coordinator(tmp / "c.toml", address=address, token=TOKEN)
        h.wait_ready()
        agent = h.start_agent("agent", tmp / "a.toml")
        h.wait_joined(["pi-0"], timeout_s=300)
        joined = status_mib(agent.proc.pid)
        time.sleep(5)
        idle = status_mib(agent.proc.pid)
        return {"joined_rss": joined["VmRSS"], "idle_rss": idle["VmRSS"], "peak": idle["VmHWM"],
                "reported": _reported(h)}


def _reported(h: Harness) -> float:
    """The agent's own RSS at join, from the coordinator's log line (the registry is not in Status)."""
    text = (h.out / "coordinator.log").read_text()
    for line in text.splitlines():
        if "device pi-0 joined" in line:
            return float(line.split(" MiB resident")[0].rsplit(" ", 1)[-1])
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="mnist", choices=["mnist", "synthetic"])
    ap.add_argument("--devices", type=int, default=10, help="partition size (the agent holds 1/N of the data)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import torch

    floors, agents = [], []
    for _ in range(args.repeat):
        floors.append(torch_floor())
        agents.append(agent_once(args.dataset, args.devices))
    floor_rss = float(np.median([f["VmRSS"] for f in floors]))
    floor_hwm = float(np.median([f["VmHWM"] for f in floors]))

    def med(key: str) -> float:
        return float(np.median([a[key] for a in agents]))

    idle, peak = med("idle_rss"), med("peak")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}; "
          f"{args.dataset}, IID, {args.devices} equal shards; medians of {args.repeat} runs (MiB)")
    print(f"import torch alone:           RSS {floor_rss:7.1f}   peak (VmHWM) {floor_hwm:7.1f}")
    print(f"agent joined:                 RSS {med('joined_rss'):7.1f}   (reported by the agent at join: "
          f"{med('reported'):.0f})")
    print(f"agent idle 5 s later:         RSS {idle:7.1f}   peak (VmHWM) {peak:7.1f}")
    print(f"over torch: idle +{idle - floor_rss:.1f} MiB (goal <= +30: {'met' if idle - floor_rss <= 30 else 'NOT met'}), "
          f"peak +{peak - floor_hwm:.1f} MiB (goal <= +80: {'met' if peak - floor_hwm <= 80 else 'NOT met'})")


if __name__ == "__main__":
    main()

"""Benchmark: an edge agent's memory beside torch's own, idle and after training (issues 12 and 18).

    python -m benchmarks.agent_memory [--dataset mnist] [--devices 10] [--rounds 5] [--repeat 3]

Measures, from /proc/<pid>/status of real processes:
- a bare `python -c "import torch"`: VmRSS, VmHWM and RssAnon (the floor any agent pays);
- a real `flexfl agent` process that learned its partition, loaded its shard and joined a
  coordinator on loopback (started and awaited by flexfl.harness): VmRSS right after it
  joined and 5 s later (idle, waiting for a round), and VmHWM (its start-up peak); the
  resident memory the agent itself reported when joining (coordinator registry);
- the same process after it trained --rounds rounds (a second agent joins so that the
  coordinator's min_devices = 2 is met): VmRSS, RssAnon and VmHWM as the agent read them
  from its own /proc/self/status at the end of the last round, from its round log line;
and prints them against the goals: idle RSS and RSS after training <= torch + 30 MiB, peak
<= torch + 80 MiB. Each figure is the median of --repeat alternating runs (torch, agent,
torch, agent, ...). The agents run without OMP_NUM_THREADS, as the devices' systemd unit
starts them (torch then picks its own thread count).
"""

from __future__ import annotations

import argparse
import platform
import re
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
            "print(' '.join(l.split()[1] for k in ('VmRSS:', 'VmHWM:', 'RssAnon:') for l in s if l.startswith(k)))")
    rss, hwm, anon = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout.split()
    return {"VmRSS": int(rss) / 1024, "VmHWM": int(hwm) / 1024, "RssAnon": int(anon) / 1024}


def agent_once(dataset: str, devices: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d, Harness(Path(d)) as h:
        tmp = Path(d)
        with atomic_file(tmp / "token", perms=0o600) as f:
            f.write(TOKEN)
        address = f"127.0.0.1:{free_port()}"
        partition = PartitionSpec(dataset=dataset, n_devices=devices, iid=True, sizes=Sizes.EQUAL)
        write_config(tmp / "c.toml", CoordinatorConfig(
            server=ServerConfig(listen=address, fleet_token_file=str(tmp / "token")), partition=partition,
            run=RunConfig(rounds=rounds, min_devices=2), output=OutputConfig(dir=str(tmp / "out"))))
        for i in range(2):
            write_config(tmp / f"a{i}.toml", AgentConfig(coordinator=address, device_id=f"pi-{i}", shard_index=i + 1,
                                                         fleet_token_file=str(tmp / "token")))
        h.start_coordinator(tmp / "c.toml", address=address, token=TOKEN)
        h.wait_ready()
        h.env.pop("OMP_NUM_THREADS", None)  # the agents as their systemd unit starts them
        agent = h.start_agent("agent", tmp / "a0.toml")
        h.wait_joined(["pi-0"], timeout_s=300)
        joined = status_mib(agent.proc.pid)
        time.sleep(5)
        idle = status_mib(agent.proc.pid)
        h.start_agent("helper", tmp / "a1.toml")  # min_devices = 2: the rounds start
        h.wait_round(rounds, timeout_s=300 + 60 * rounds)
        agent.proc.wait(timeout=60)  # it leaves once told the run is finished
        trained = _rounds_logged(h.out / "agent.log", "pi-0")
        if len(trained) != rounds or not all(r["s"] for r in trained):
            raise RuntimeError(f"pi-0 trained in {sum(bool(r['s']) for r in trained)} of {rounds} rounds; "
                               f"see {h.out / 'agent.log'}")
        last = trained[-1]
        return {"joined_rss": joined["VmRSS"], "idle_rss": idle["VmRSS"], "peak": idle["VmHWM"],
                "reported": _reported(h), "trained_rss": last["resident"], "trained_anon": last["anonymous"],
                "trained_peak": last["peak"]}


_ROUND_LINE = re.compile(r"(?P<device>\S+) round (?P<round>\d+): s = (?P<s>\d+)/\d+ .*; resident (?P<resident>[\d.]+) "
                         r"MiB \((?P<anonymous>[\d.]+|nan) anonymous\), peak (?P<peak>[\d.]+|nan) MiB")


def _rounds_logged(log_path: Path, device_id: str) -> list[dict[str, float]]:
    """The agent's round log lines (edge_agent.agent): s and its memory at the end of each round."""
    out = []
    for line in log_path.read_text().splitlines():
        m = _ROUND_LINE.search(line)
        if m and m["device"] == device_id:
            out.append({k: float(m[k]) for k in ("round", "s", "resident", "anonymous", "peak")})
    return out


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
    ap.add_argument("--rounds", type=int, default=5, help="rounds the agent trains before the last measurement")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import torch

    floors, agents = [], []
    for _ in range(args.repeat):
        floors.append(torch_floor())
        agents.append(agent_once(args.dataset, args.devices, args.rounds))
    floor_rss = float(np.median([f["VmRSS"] for f in floors]))
    floor_hwm = float(np.median([f["VmHWM"] for f in floors]))
    floor_anon = float(np.median([f["RssAnon"] for f in floors]))

    def med(key: str) -> float:
        return float(np.median([a[key] for a in agents]))

    idle, peak = med("idle_rss"), med("peak")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}; "
          f"{args.dataset}, IID, {args.devices} equal shards; medians of {args.repeat} runs (MiB)")
    print(f"import torch alone:           RSS {floor_rss:7.1f}   peak (VmHWM) {floor_hwm:7.1f}")
    print(f"agent joined:                 RSS {med('joined_rss'):7.1f}   (reported by the agent at join: "
          f"{med('reported'):.0f})")
    print(f"agent idle 5 s later:         RSS {idle:7.1f}   peak (VmHWM) {peak:7.1f}")
    idle_goal = "met" if idle - floor_rss <= 30 else "NOT met"
    peak_goal = "met" if peak - floor_hwm <= 80 else "NOT met"
    print(f"over torch: idle +{idle - floor_rss:.1f} MiB (goal <= +30: {idle_goal}), "
          f"peak +{peak - floor_hwm:.1f} MiB (goal <= +80: {peak_goal})")
    trained, trained_peak, anon = med("trained_rss"), med("trained_peak"), med("trained_anon")
    print(f"agent after {args.rounds} trained rounds: RSS {trained:7.1f}   peak (VmHWM) {trained_peak:7.1f}   "
          f"(anonymous {anon:.1f}; torch alone {floor_anon:.1f})")
    print(f"over torch after training: RSS +{trained - floor_rss:.1f} MiB "
          f"(goal <= +30: {'met' if trained - floor_rss <= 30 else 'NOT met'}), "
          f"peak +{trained_peak - floor_hwm:.1f} MiB "
          f"(goal <= +80: {'met' if trained_peak - floor_hwm <= 80 else 'NOT met'}); "
          f"anonymous +{anon - floor_anon:.1f} MiB (the rest is file-backed: libraries' code)")


if __name__ == "__main__":
    main()

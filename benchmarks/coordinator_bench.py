"""Benchmark: coordinator overhead per round, bytes per device per round, agent idle memory.

    python -m benchmarks.coordinator_bench --agents 5,20,50 --rounds 6 --dataset mnist

The coordinator runs as its own process (`flexfl coordinator`, started and awaited by
flexfl.harness); agents run as threads of
this process in no-training mode (they return a zero delta of the model's full size with
s = E at once), so a round's time is transfer + aggregation + evaluation + checkpoint.
"Overhead" is the coordinator's own measurement: from the moment a round closed (all
answered or deadline) to the moment the next round was opened for sending; it includes
aggregation, evaluation on the test set, the checkpoint and the metrics line. Bytes are
protobuf message bytes per device per round (header + chunks; HTTP/2 framing not counted).
Agent idle memory: one real agent process (MNIST shard loaded, joined, waiting for a round),
its resident set size from psutil.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.metrics import read_metrics
from edge_agent.agent import EdgeAgent
from edge_agent.config import AgentConfig, ParticipationConfig
from flexfl.config import write_config
from flexfl.files import atomic_file
from flexfl.harness import Harness, free_port
from workloads.partition_spec import Dataset, PartitionSpec, Sizes

TOKEN = "bench-token"


def _write_coordinator(tmp: Path, *, dataset: str, n: int, rounds: int, min_devices: int) -> tuple[Path, str]:
    """The benchmark coordinator's config, dumped from the dataclasses; returns it and its address."""
    with atomic_file(tmp / "token", perms=0o600) as f:
        f.write(TOKEN)
    address = f"127.0.0.1:{free_port()}"
    cfg = CoordinatorConfig(
        server=ServerConfig(listen=address, fleet_token_file=str(tmp / "token"), pull_wait_s=2.0),
        partition=PartitionSpec(dataset=Dataset(dataset), n_devices=max(n, 2), sizes=Sizes.EQUAL),
        run=RunConfig(rounds=rounds, deadline_s=30.0, min_devices=min_devices), output=OutputConfig(dir=str(tmp / "out")))
    return write_config(tmp / "c.toml", cfg, header="coordinator benchmark"), address


def overhead(n_agents: int, *, rounds: int, dataset: str) -> dict:
    with tempfile.TemporaryDirectory() as d, Harness(Path(d)) as harness:
        tmp = Path(d)
        config, address = _write_coordinator(tmp, dataset=dataset, n=n_agents, rounds=rounds, min_devices=n_agents)
        harness.start_coordinator(config, address=address, token=TOKEN)
        harness.wait_ready()
        agents = []
        try:
            for i in range(n_agents):
                cfg = AgentConfig(coordinator=address, device_id=f"bench-{i}", shard_index=i, fleet_token=TOKEN,
                                  pull_wait_s=2.0, backoff_initial_s=0.2, participation=ParticipationConfig(no_train=True))
                a = EdgeAgent(cfg)
                threading.Thread(target=a.run, daemon=True).start()
                agents.append(a)
            harness.procs["coordinator"].proc.wait(timeout=600)
            harness.check("coordinator")
        finally:
            for a in agents:
                a.stop(announce=False)
        rows = read_metrics(tmp / "out" / "metrics.jsonl")
    over = [r["overhead_s"] for r in rows if r["overhead_s"] is not None]
    agg = [r["aggregate_eval_s"] for r in rows]
    bytes_in = [v for r in rows for v in r["bytes_in"].values()]
    bytes_out = [v for r in rows for v in r["bytes_out"].values()]
    return {"agents": n_agents, "rounds": len(rows), "overhead_s_median": float(np.median(over)),
            "overhead_s_max": float(np.max(over)), "aggregate_eval_s_median": float(np.median(agg)),
            "round_s_median": float(np.median([r["round_s"] for r in rows])),
            "bytes_in_per_device": int(np.median(bytes_in)), "bytes_out_per_device": int(np.median(bytes_out))}


def agent_idle_rss(dataset: str) -> tuple[float, float]:
    """RSS (MiB) of a real agent process joined and idle, right after joining and 5 s later."""
    with tempfile.TemporaryDirectory() as d, Harness(Path(d)) as harness:
        tmp = Path(d)
        config, address = _write_coordinator(tmp, dataset=dataset, n=10, rounds=1, min_devices=2)
        harness.start_coordinator(config, address=address, token=TOKEN)
        harness.wait_ready()
        agent = write_config(tmp / "a.toml", AgentConfig(coordinator=address, device_id="idle-0",
                                                         fleet_token_file=str(tmp / "token")))
        managed = harness.start_agent("agent", agent)
        harness.wait_joined(["idle-0"], timeout_s=120)
        first = psutil.Process(managed.proc.pid).memory_info().rss / 2**20
        time.sleep(5)
        later = psutil.Process(managed.proc.pid).memory_info().rss / 2**20
    return first, later


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default="5,20,50")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dataset", default="mnist", choices=["mnist", "synthetic"])
    args = ap.parse_args()
    import torch

    model_bytes = 199_210 * 4 if args.dataset == "mnist" else 610 * 4
    print(f"model: {args.dataset} ({model_bytes} bytes of float32 parameters); torch {torch.__version__}; "
          f"{psutil.cpu_count()} CPUs")
    print("agents  rounds  overhead median/max (s)  aggregate+eval median (s)  round median (s)  bytes in/out per device")
    for n in [int(x) for x in args.agents.split(",")]:
        r = overhead(n, rounds=args.rounds, dataset=args.dataset)
        print(f"{r['agents']:>6}  {r['rounds']:>6}  {r['overhead_s_median']:.3f} / {r['overhead_s_max']:.3f}"
              f"{'':>13}{r['aggregate_eval_s_median']:.3f}{'':>22}{r['round_s_median']:.3f}{'':>10}"
              f"{r['bytes_in_per_device']} / {r['bytes_out_per_device']} ({r['bytes_in_per_device'] / model_bytes:.4f}x model)",
              flush=True)
    first, later = agent_idle_rss(args.dataset)
    print(f"agent idle RSS ({args.dataset} shard loaded, joined, waiting): {first:.0f} MiB after joining, {later:.0f} MiB 5 s later")


if __name__ == "__main__":
    main()

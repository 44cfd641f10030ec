"""Benchmark: an edge agent's memory beside torch's own, idle and after training (issues 12 and 18).

    python -m benchmarks.agent_memory [--dataset mnist] [--devices 10] [--rounds 5] [--repeat 3]

Measures, from /proc/<pid>/status of real processes, against two floors:
- floor 1, a bare `python -c "import torch"`: VmRSS, VmHWM and RssAnon (what any agent pays
  before it does anything);
- floor 2, torch after training: a bare process that imports torch, builds the dataset's
  model (workloads.models) and runs FLOOR_STEPS SGD steps with autograd at the dataset's
  batch size on random data of its shape. Running any torch op at all pages in ~10 MiB of
  libtorch_cpu.so's code that `import torch` never touches; every process that trains pays
  it, so floor 2 is what the agent adds beyond "torch has trained";
- a real `flexfl agent` process that learned its partition, loaded its shard and joined a
  coordinator on loopback (started and awaited by loadgen.harness): VmRSS right after it
  joined and 5 s later (idle, waiting for a round), and VmHWM (its start-up peak); the
  resident memory the agent itself reported when joining (coordinator registry);
- the same process after it trained --rounds rounds (a second agent joins so that the
  coordinator's min_devices = 2 is met): VmRSS, RssAnon and VmHWM as the agent read them
  from its own /proc/self/status at the end of the last round, from its round log line;
and prints them against the goals: idle RSS <= floor 1 + 30 MiB; after training RSS <= +30
MiB and peak <= +80 MiB, over each floor, each line naming its floor. Each figure is the
median of --repeat interleaved runs (floor 1, floor 2, agent, floor 1, ...); the after-
training lines also list each run's own difference. The agents and floors run without
OMP_NUM_THREADS, as the devices' systemd unit starts the agent (torch then picks its own
thread count).

Where the agent's memory after 5 MNIST rounds goes, beyond floor 2 (/proc/<pid>/smaps of the
three processes; AMD EPYC, Python 3.11, torch 2.13; MiB resident, about +28 in all):
gRPC's cygrpc.so code +10.4; anonymous mappings +8.8 (the shard, 6000 x 784 uint8 bytes,
4.5; the Python objects of gRPC, protobuf, numpy.random and FlexFL's modules ~3.4; malloc's
second arena ~1); the main heap +2.6 to +4.3 (varies between runs); numpy's libraries +2.4
(numpy.random's); libtorch_cpu.so +1.6 (the agent's own ops: uint8 batches to float, copying
the received model in). Floor 2 is floor 1 + ~14: libtorch_cpu.so +9.7, heap +2.3.
"""

from __future__ import annotations

import argparse
import os
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
from loadgen.harness import Harness, free_port
from loadgen.hostinfo import cpu_description
from workloads.defaults import DEFAULTS
from workloads.partition_spec import PartitionSpec, Sizes

TOKEN = "memory-bench"
REPO = Path(__file__).resolve().parent.parent


def status_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


# The floors: a bare process that imports torch (and, for the second, trains the agent's model
# with autograd on random data of its dataset's shape), then prints VmRSS, VmHWM and RssAnon in kB.
_FLOOR = """
import pathlib, sys
import torch
steps = int(sys.argv[1])
if steps:
    from workloads.defaults import DEFAULTS
    from workloads.models import build_model
    d = DEFAULTS[sys.argv[2]]
    model = build_model(d.model, in_features=d.in_features, num_classes=d.num_classes)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(steps):
        x, y = torch.rand(d.batch_size, d.in_features), torch.randint(0, d.num_classes, (d.batch_size,))
        loss = loss_fn(model(x), y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad, alpha=d.eta0)
    model.zero_grad(set_to_none=True)
s = pathlib.Path('/proc/self/status').read_text().splitlines()
print(' '.join(l.split()[1] for k in ('VmRSS:', 'VmHWM:', 'RssAnon:') for l in s if l.startswith(k)))
"""
FLOOR_STEPS = 100  # 5 rounds of E = 20 updates; torch pages in what training touches within the first few


def torch_floor(*, dataset: str, steps: int = 0) -> dict[str, float]:
    """VmRSS, VmHWM and RssAnon (MiB) of a process that imports torch, then trains `steps` SGD steps."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torch's threads as the agent's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    rss, hwm, anon = subprocess.run([sys.executable, "-c", _FLOOR, str(steps), dataset], capture_output=True,
                                    text=True, check=True, env=env).stdout.split()
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
        # The agent leaves once told the run is finished. Its exit is what is waited for: a short run can end,
        # and its coordinator exit, between two of the harness's Status polls (wait_round then saw only the exit).
        agent.proc.wait(timeout=300 + 60 * rounds)
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

    floors, trained_floors, agents = [], [], []
    for _ in range(args.repeat):  # interleaved, so that a change in the machine's load touches all three alike
        floors.append(torch_floor(dataset=args.dataset))
        trained_floors.append(torch_floor(dataset=args.dataset, steps=FLOOR_STEPS))
        agents.append(agent_once(args.dataset, args.devices, args.rounds))

    def med(runs: list[dict[str, float]], key: str) -> float:
        return float(np.median([r[key] for r in runs]))

    def goal(over: float, limit: float) -> str:
        return f"goal <= +{limit:g}: {'met' if over <= limit else 'NOT met'}"

    floor1, floor2 = ({k: med(runs, k) for k in ("VmRSS", "VmHWM", "RssAnon")} for runs in (floors, trained_floors))
    model = DEFAULTS[args.dataset]
    print(f"machine: {platform.machine()} ({cpu_description()}), Python {platform.python_version()}, "
          f"torch {torch.__version__}; {args.dataset}, IID, {args.devices} equal shards; "
          f"medians of {args.repeat} interleaved runs (MiB)")
    print(f"floor 1, import torch alone:   RSS {floor1['VmRSS']:7.1f}   peak (VmHWM) {floor1['VmHWM']:7.1f}   "
          f"(anonymous {floor1['RssAnon']:.1f})")
    print(f"floor 2, torch after training: RSS {floor2['VmRSS']:7.1f}   peak (VmHWM) {floor2['VmHWM']:7.1f}   "
          f"(anonymous {floor2['RssAnon']:.1f}; import torch, then {FLOOR_STEPS} SGD steps with autograd of the "
          f"{model.model} at batch {model.batch_size} on random data)")
    print(f"agent joined:                  RSS {med(agents, 'joined_rss'):7.1f}   (reported by the agent at join: "
          f"{med(agents, 'reported'):.0f})")
    idle, peak = med(agents, "idle_rss"), med(agents, "peak")
    print(f"agent idle 5 s later:          RSS {idle:7.1f}   peak (VmHWM) {peak:7.1f}")
    print(f"idle, over floor 1 (import torch alone): RSS +{idle - floor1['VmRSS']:.1f} MiB "
          f"({goal(idle - floor1['VmRSS'], 30)}), peak +{peak - floor1['VmHWM']:.1f} MiB "
          f"({goal(peak - floor1['VmHWM'], 80)})")
    trained, trained_peak, anon = (med(agents, k) for k in ("trained_rss", "trained_peak", "trained_anon"))
    print(f"agent after {args.rounds} trained rounds: RSS {trained:7.1f}   peak (VmHWM) {trained_peak:7.1f}   "
          f"(anonymous {anon:.1f})")
    for name, floor, runs in (("floor 1 (import torch alone)", floor1, floors),
                              ("floor 2 (torch after training)", floor2, trained_floors)):
        over, over_peak = trained - floor["VmRSS"], trained_peak - floor["VmHWM"]
        each = ", ".join(f"+{a['trained_rss'] - f['VmRSS']:.1f}" for a, f in zip(agents, runs, strict=True))
        print(f"after training, over {name}: RSS +{over:.1f} MiB ({goal(over, 30)}; runs {each}), "
              f"peak +{over_peak:.1f} MiB ({goal(over_peak, 80)}); anonymous +{anon - floor['RssAnon']:.1f} "
              f"(the rest is file-backed: libraries' code)")

if __name__ == "__main__":
    main()

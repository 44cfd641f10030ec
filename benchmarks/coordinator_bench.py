"""Benchmark: the coordinator's cost per round as the fleet grows to a thousand agents.

    python -m benchmarks.coordinator_bench --agents 50,100,200,500,1000 --rounds 8

The coordinator runs as its own process (`flexfl coordinator`, started and awaited by
loadgen.harness) on MNIST (the MLP, 199,210 float32 parameters). Agents are light no-training
agents (benchmarks/light_agents.py): asyncio + grpc.aio, one channel (TCP connection) each,
up to --agents-per-process in each of several processes; each answers every round with
s = E and a zero delta of the model's size.

Reported per fleet size, over the rounds after the first:
- overhead: from a round's close (all answered) to the next round's opening, as the
  coordinator measures it (aggregation, the round's events, the next model's encoding);
  evaluation, metrics and checkpoint run beside the next round and are not in it;
- period: one round's opening to the next's (round + overhead);
- eval: the central evaluation of 10k test images (off the path);
- pull wake-ups per round: parked PullRound calls notified (N when only openings wake them);
- coordinator resident memory: before any agent, with all agents joined and parked in a
  long poll, and the peak during the rounds; per connected agent = (joined - idle) / N;
- bytes in/out per device per round (protobuf message bytes; HTTP/2 framing not counted).
The closing line fits the overhead's growth per added agent (goal: < 0.1 ms per agent, and
<= 20 ms at 50 agents).
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from benchmarks.report import Output
from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.metrics import read_metrics
from coordinator.rules.round_record import LiveRound, RoundRecord
from flexfl.config import write_config
from flexfl.files import atomic_file
from loadgen.harness import Harness, HarnessError, free_port
from workloads.partition_spec import Dataset, PartitionSpec, Sizes

TOKEN = "bench-token"
REPO = Path(__file__).resolve().parents[1]


def write_coordinator(tmp: Path, *, dataset: str, n: int, rounds: int, evaluate: bool = True,
                      start_grace_s: float = 0.0) -> tuple[Path, str]:
    """The benchmark coordinator's config, dumped from the dataclasses; returns it and its address."""
    with atomic_file(tmp / "token", perms=0o600) as f:
        f.write(TOKEN)
    address = f"127.0.0.1:{free_port()}"
    cfg = CoordinatorConfig(
        server=ServerConfig(listen=address, fleet_token_file=str(tmp / "token"), pull_wait_s=30.0),
        partition=PartitionSpec(dataset=Dataset(dataset), n_devices=max(n, 2), sizes=Sizes.EQUAL),
        run=RunConfig(rounds=rounds, deadline_s=120.0, min_devices=n, start_grace_s=start_grace_s, evaluate=evaluate),
        output=OutputConfig(dir=str(tmp / "out")))
    return write_config(tmp / "c.toml", cfg, header="coordinator benchmark"), address


def start_agents(address: str, token_file: Path, n: int, *, per_process: int, log_dir: Path,
                 shared_connection: bool = False, encode_every_round: bool = False) -> list[subprocess.Popen]:
    """Light agents bench-0 .. bench-(n-1) in ceil(n / per_process) processes."""
    procs = []
    for first in range(0, n, per_process):
        count = min(per_process, n - first)
        argv = [sys.executable, "-m", "benchmarks.light_agents", "--coordinator", address, "--token-file",
                str(token_file), "--first", str(first), "--count", str(count)]
        if shared_connection:
            argv.append("--shared-connection")
        if encode_every_round:
            argv.append("--encode-every-round")
        # Plain Popen (no preexec_fn): this process holds gRPC channels, and forking it is unsafe.
        with open(log_dir / f"agents-{first}.log", "wb") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}))
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class RssSampler:
    """Resident memory of one process every `every_s`, in a thread; peak() over the samples since mark()."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self.proc = psutil.Process(pid)
        self.every_s = every_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.proc.memory_info().rss)
            except psutil.Error:
                return
            self._stop.wait(self.every_s)

    def now(self) -> int:
        return self.proc.memory_info().rss

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Run:
    agents: int
    rows: list[RoundRecord]
    rss_idle: int
    rss_joined: int
    rss_peak: int

    def series(self, of: Callable[[LiveRound], float | None]) -> np.ndarray:
        """A live measure of each round after the first (rows that lack it left out)."""
        values = [of(r.live) for r in self.rows[1:] if r.live is not None]
        return np.array([v for v in values if v is not None], dtype=float)

    def periods(self) -> np.ndarray:
        """Opening of round r to opening of round r + 1, for r >= 2 (round 1 includes connection set-up)."""
        live = [r.live for r in self.rows[1:] if r.live is not None]
        return np.array([a.round_s + b.overhead_s for a, b in itertools.pairwise(live)
                         if b.overhead_s is not None])


def run_fleet(n: int, *, rounds: int, dataset: str = "mnist", evaluate: bool = True, per_process: int = 250,
              shared_connection: bool = False, measure_memory: bool = True, encode_every_round: bool = False) -> Run:
    """One coordinator and n light agents for `rounds` rounds; its metrics rows and memory."""
    with tempfile.TemporaryDirectory() as d, Harness(Path(d)) as harness:
        tmp = Path(d)
        # With memory measured, round 1 waits a moment after the last join: every agent is parked by then.
        config, address = write_coordinator(tmp, dataset=dataset, n=n, rounds=rounds, evaluate=evaluate,
                                            start_grace_s=2.0 if measure_memory else 0.0)
        harness.start_coordinator(config, address=address, token=TOKEN)
        harness.wait_ready()
        pid = harness.procs["coordinator"].proc.pid
        sampler = RssSampler(pid)
        time.sleep(0.5)
        rss_idle = sampler.now()
        agents = start_agents(address, tmp / "token", n, per_process=per_process, log_dir=tmp,
                              shared_connection=shared_connection, encode_every_round=encode_every_round)
        try:
            rss_joined = 0
            if measure_memory:
                harness.wait_joined([f"bench-{i}" for i in range(n)], timeout_s=600)
                time.sleep(1.0)  # inside the 2 s grace: all joined, each with a parked PullRound
                rss_joined = sampler.now()
            harness.procs["coordinator"].proc.wait(timeout=3600)
            harness.check("coordinator")
            for p in agents:
                p.wait(timeout=60)
            failed = [p.returncode for p in agents if p.returncode != 0]
            if failed:
                raise HarnessError(f"agent processes failed ({failed}); logs in {tmp}")
        finally:
            stop(agents)
            sampler.close()
        rows = read_metrics(tmp / "out" / "metrics.jsonl")
    return Run(agents=n, rows=rows, rss_idle=rss_idle, rss_joined=rss_joined, rss_peak=max(sampler.samples))


def _ms(values: np.ndarray) -> str:
    return f"{1e3 * np.median(values):.1f} [{1e3 * values.min():.1f}, {1e3 * values.max():.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default="50,100,200,500,1000", help="fleet sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--agents-per-process", type=int, default=250)
    ap.add_argument("--no-eval", action="store_true", help="skip central evaluation (run.evaluate = false)")
    ap.add_argument("--shared-connection", action="store_true", help="the agents of a process share one channel")
    ap.add_argument("--markdown", type=Path,
                    help="also write the output as a section of this file (results/performance.md)")
    args = ap.parse_args()
    say = Output()
    sizes = [int(x) for x in args.agents.split(",")]
    channels = "one channel per process" if args.shared_connection else "one channel (TCP connection) per agent"
    say(f"coordinator benchmark: mnist MLP (199,210 float32), {args.rounds} rounds per size, "
        f"{'no evaluation' if args.no_eval else 'central evaluation on 10k test images'}, light agents in processes "
        f"of up to {args.agents_per_process}, {channels}")
    say("medians over rounds 2.., [min, max]; times in ms")
    say(f"{'agents':>6}  {'overhead close->open':>24}  {'round period':>26}  {'eval':>6}  {'wake-ups':>8}  "
        f"{'coordinator RSS (MiB)':>23}  {'per agent':>9}  {'bytes per device':>17}")
    say(f"{'':>6}  {'median [min, max]':>24}  {'median [min, max]':>26}  {'(off':>6}  {'per':>8}  "
        f"{'idle / joined / peak':>23}  {'(KiB)':>9}  {'in / out':>17}")
    say(f"{'':>6}  {'':>24}  {'':>26}  {'path)':>6}  {'round':>8}")
    runs = []
    for n in sizes:
        r = run_fleet(n, rounds=args.rounds, evaluate=not args.no_eval, per_process=args.agents_per_process,
                      shared_connection=args.shared_connection)
        runs.append(r)
        reasons = {row.live.close_reason for row in r.rows if row.live is not None}
        eval_s = r.series(lambda live: live.eval_s)
        wakeups = r.series(lambda live: live.pull_wakeups)
        bytes_in = int(np.median([v for row in r.rows if row.live for v in row.live.bytes_in.values()]))
        bytes_out = int(np.median([v for row in r.rows if row.live for v in row.live.bytes_out.values()]))
        rss = f"{r.rss_idle / 2**20:.0f} / {r.rss_joined / 2**20:.0f} / {r.rss_peak / 2**20:.0f}"
        say(f"{n:>6}  {_ms(r.series(lambda live: live.overhead_s)):>24}  {_ms(r.periods()):>26}  "
            f"{1e3 * np.median(eval_s) if len(eval_s) else 0:6.0f}  {np.median(wakeups):8.0f}  "
            f"{rss:>23}  {(r.rss_joined - r.rss_idle) / n / 1024:9.1f}  {f'{bytes_in} / {bytes_out}':>17}"
            + ("" if reasons == {"all answered"} else f"  (closes: {sorted(reasons)})"))
    at_50 = next((np.median(r.series(lambda live: live.overhead_s)) * 1e3 for r in runs if r.agents == 50), None)
    if at_50 is not None:
        say(f"overhead at 50 agents: {at_50:.1f} ms (goal <= 20)")
    if len(runs) >= 2:
        n = np.array([r.agents for r in runs], dtype=float)
        med = np.array([np.median(r.series(lambda live: live.overhead_s)) for r in runs]) * 1e3
        slope = np.polyfit(n, med, 1)[0]
        ends = (med[-1] - med[0]) / (n[-1] - n[0])
        say(f"overhead growth: {ends:.4f} ms per added agent from {n[0]:.0f} to {n[-1]:.0f} agents "
            f"(medians); least-squares slope over all sizes {slope:.4f} ms per agent (goal < 0.1)")
    if args.markdown:
        say.write_section(args.markdown, "coordinator-scaling", title="Coordinator cost per round, 50 to 1,000 agents")


if __name__ == "__main__":
    main()

"""Benchmark: FlexFL's round period against Flower's legacy gRPC API, interleaved in one run.

    python -m benchmarks.flower_compare --agents 5,20,50 --rounds 12 --repeat 3

For every fleet size, with and without central evaluation, and every repetition, it runs
FlexFL (A) and Flower (B) back to back, alternating which goes first (A B, B A, ...):
- FlexFL: `flexfl coordinator` (MNIST MLP, Scheme C, run.evaluate on or off) and light
  no-training agents in one process (benchmarks/light_agents.py: asyncio; each checks the
  model's checksum and answers a zero delta, encoded every round as Flower's clients do);
- Flower: benchmarks/flower_side.py in the Flower virtualenv: start_server with FedAvg and
  no-op NumPyClients (they return the parameters; Flower's NumPy API decodes and encodes
  them) as threads of one process; with evaluation, evaluate_fn tests on the same 10k MNIST
  images with FlexFL's evaluate().
Every agent and client has its own TCP connection (--connections shared: one per process).
Both servers run with OMP_NUM_THREADS=1 (as loadgen.harness starts the coordinator). A round's
period is its opening to the next round's opening (FlexFL: round_s + the next overhead_s;
Flower: between configure_fit calls), rounds 2 .. R-1 of each run; a run's figure is the
median. The ratio is FlexFL / Flower per interleaved pair; min/median/max over the pairs.
Goal: <= 0.8 at 5, 20 and 50 agents, with and without evaluation.

Flower 1.41 needs protobuf < 7 and FlexFL protobuf >= 7, so Flower lives in its own
virtualenv: `make setup-flower` (or --flower-python PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.coordinator_bench import REPO, run_fleet
from benchmarks.report import Output
from loadgen.harness import free_port


def flower_periods(n: int, *, rounds: int, evaluate: bool, python: Path, shared_connection: bool = False,
                   processes: int = 1) -> tuple[np.ndarray, str]:
    """Periods of rounds 2 .. R-1 of one Flower run, and Flower's version."""
    side = str(REPO / "benchmarks" / "flower_side.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        address = f"127.0.0.1:{free_port()}"
        out = tmp / "times.json"
        argv = [str(python), side, "server", "--address", address, "--agents", str(n), "--rounds", str(rounds),
                "--out", str(out)] + (["--eval"] if evaluate else [])
        with open(tmp / "server.log", "wb") as log:
            srv = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=REPO)
        clients = []
        try:
            _wait_listening(address, srv, tmp / "server.log")
            for i, count in enumerate(_split(n, processes)):
                with open(tmp / f"clients-{i}.log", "wb") as log:
                    clients.append(subprocess.Popen(
                        [str(python), side, "clients", "--address", address, "--agents", str(count),
                         *(["--shared-connection"] if shared_connection else [])],
                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=REPO))
            if srv.wait(timeout=1800) != 0:
                raise RuntimeError(f"Flower server failed:\n{(tmp / 'server.log').read_text()[-3000:]}")
            times = json.loads(out.read_text())
        finally:
            for p in (*clients, srv):
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
    return np.diff(times["fit_started"])[1:], times["flwr"]


def _wait_listening(address: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> None:
    host, _, port = address.rpartition(":")
    limit = time.monotonic() + timeout_s
    while time.monotonic() < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"Flower server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"Flower server did not listen on {address} within {timeout_s:.0f} s")


def flexfl_periods(n: int, *, rounds: int, evaluate: bool, shared_connection: bool = False,
                   processes: int = 1) -> np.ndarray:
    # Equal work: Flower's clients serialise their parameters every round, so FlexFL's light agents
    # encode their update every round too (not once per process, as the coordinator benchmark's do).
    return run_fleet(n, rounds=rounds, evaluate=evaluate, measure_memory=False, shared_connection=shared_connection,
                     per_process=max(_split(n, processes)), encode_every_round=True).periods()


def _split(n: int, processes: int) -> list[int]:
    """n clients over `processes` processes, as evenly as possible (as run_fleet's per_process does)."""
    per = -(-n // processes)
    return [min(per, n - first) for first in range(0, n, per)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default="5,20,50")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved pairs per (fleet size, evaluation)")
    ap.add_argument("--flower-python", type=Path, default=REPO / ".venv-flower" / "bin" / "python")
    ap.add_argument("--client-processes", type=int, default=1,
                    help="processes the agents (FlexFL) and clients (Flower) are spread over, the same for both")
    ap.add_argument("--connections", choices=["own", "shared"], default="own",
                    help="own: one TCP connection per agent/client (separate devices; default); shared: all "
                         "clients of a process on one (gRPC's default for Flower's channels)")
    ap.add_argument("--markdown", type=Path,
                    help="also write the output as a section of this file (results/performance.md)")
    args = ap.parse_args()
    say = Output()
    if not args.flower_python.exists():
        raise SystemExit(f"{args.flower_python} not found: `make setup-flower` creates Flower's virtualenv")
    sizes = [int(x) for x in args.agents.split(",")]
    shared = args.connections == "shared"
    connections = "one TCP connection for all clients" if shared else "one TCP connection per client"
    say(f"FlexFL vs Flower legacy gRPC API: mnist MLP (199,210 float32), {args.rounds} rounds per run, "
        f"{args.repeat} interleaved pairs, {connections}, "
        f"clients in {args.client_processes} process(es) per system")
    results: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    version = "?"
    for rep in range(args.repeat):
        for n in sizes:
            for evaluate in (False, True):
                order = ("flexfl", "flower") if rep % 2 == 0 else ("flower", "flexfl")
                got = {}
                for system in order:
                    if system == "flexfl":
                        got[system] = float(np.median(flexfl_periods(n, rounds=args.rounds, evaluate=evaluate,
                                                                     shared_connection=shared,
                                                                     processes=args.client_processes)))
                    else:
                        periods, version = flower_periods(n, rounds=args.rounds, evaluate=evaluate,
                                                          python=args.flower_python, shared_connection=shared,
                                                          processes=args.client_processes)
                        got[system] = float(np.median(periods))
                results.setdefault((n, evaluate), []).append((got["flexfl"], got["flower"]))
                say(f"  pair {rep + 1}: {n:>3} agents, evaluation {'on ' if evaluate else 'off'}: FlexFL "
                    f"{1e3 * got['flexfl']:7.1f} ms, Flower {1e3 * got['flower']:7.1f} ms "
                    f"(ratio {got['flexfl'] / got['flower']:.2f}; order {' '.join(order)})")
    say()
    say(f"round period, median of per-run medians (ms); ratio FlexFL / Flower {version} over the pairs")
    say(f"{'agents':>6}  {'evaluation':>10}  {'FlexFL':>8}  {'Flower':>8}  {'ratio min / median / max':>25}  "
        "goal <= 0.8")
    for (n, evaluate), pairs in sorted(results.items()):
        a = np.array([p[0] for p in pairs])
        b = np.array([p[1] for p in pairs])
        ratio = a / b
        say(f"{n:>6}  {'on' if evaluate else 'off':>10}  {1e3 * np.median(a):8.1f}  {1e3 * np.median(b):8.1f}  "
              f"{ratio.min():7.2f} / {np.median(ratio):5.2f} / {ratio.max():5.2f}  "
            f"{'met' if ratio.max() <= 0.8 else 'not met' if np.median(ratio) > 0.8 else 'median met'}")
    if args.markdown:
        say.write_section(args.markdown, "coordinator-vs-flower",
                          title="Round period against Flower's legacy gRPC API, interleaved")


if __name__ == "__main__":
    main()

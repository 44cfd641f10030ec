"""Torch thread settings for simulator workers: one thread per process or torch's default, quiet or contended.

    python -m benchmarks.threads [--reps 3] [--rounds 1] [--trainers fast,plain] [--workload mnist]

Worker processes each build the MNIST workload of benchmarks.sim_speed (MLP, 100 devices,
batch 10, E = 20) once and then train whole rounds on command (`--workload synthetic`: its
logistic regression on 50 devices, a smoke run in seconds, not the figures the page quotes). Configurations, interleaved
within every repetition:
- 1proc x 1thr: one worker, torch.set_num_threads(1)
- 1proc x 2thr: one worker at torch's default here (2 threads, one per core)
- 2proc x 1thr: two workers with one thread each, running at the same time (a sweep's pool)
each quiet and "contended": with a busy-looping process started beside them that wants one
core (as another job on the machine would). It prints round throughput in device-steps/s
(summed over workers) per configuration, min/median/max, and ratios to 1proc x 1thr.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time

import numpy as np

CONFIGS = ("1proc x 1thr", "1proc x 2thr", "2proc x 1thr")


def worker(threads: int, workload: str, commands: mp.Queue, results: mp.Queue) -> None:
    import torch

    torch.set_num_threads(threads)
    from benchmarks.sim_speed import build_workload, variant_fns
    from edge_agent.trainer import device_rng

    w = build_workload(workload, participation="full", seed=0)
    fns = variant_fns(w, ["fast", "plain"], stats={})
    results.put("ready")
    while True:
        cmd = commands.get()
        if cmd is None:
            return
        trainer, rounds = cmd
        t0 = time.perf_counter()
        for r in range(rounds):
            fns[trainer]([device_rng(0, r, int(k)) for k in w.rows])
        results.put((int(w.steps.sum()) * rounds, time.perf_counter() - t0))


def spread(values: list[float], fmt: str) -> str:
    low, median, high = (fmt.format(v) for v in (min(values), float(np.median(values)), max(values)))
    return f"min {low}  median {median}  max {high}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.threads", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="rounds per measurement and worker (default 1)")
    p.add_argument("--trainers", default="fast", help="comma-separated: fast, plain (default fast)")
    p.add_argument("--workload", choices=["mnist", "synthetic"], default="mnist",
                   help="benchmarks.sim_speed's workload the workers train (default mnist; synthetic: a smoke run)")
    args = p.parse_args(argv)
    trainers = [t for t in args.trainers.split(",") if t]
    if any(t not in ("fast", "plain") for t in trainers):
        p.error(f"unknown trainer in {trainers}; choose fast, plain")
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    # Two one-thread workers (the pool) and one two-thread worker.
    pools = {1: [], 2: []}
    for threads, count in ((1, 2), (2, 1)):
        for _ in range(count):
            q = ctx.Queue()
            proc = ctx.Process(target=worker, args=(threads, args.workload, q, results), daemon=True)
            proc.start()
            pools[threads].append((proc, q))
    workers = [proc for pool in pools.values() for proc, _ in pool]

    def result():
        """The next worker's answer; exits with an error if a worker died (its traceback is above)."""
        while True:
            try:
                return results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in workers if p.exitcode is not None]
                if dead:
                    sys.exit(f"benchmarks.threads: a worker exited with code {dead[0].exitcode}")

    for _ in range(3):
        result()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, {args.workload}, "
          f"{args.reps} reps of {args.rounds} rounds")

    def measure(config: str, trainer: str) -> float:
        queues = {"1proc x 1thr": [pools[1][0][1]], "1proc x 2thr": [pools[2][0][1]],
                  "2proc x 1thr": [q for _, q in pools[1]]}[config]
        t0 = time.perf_counter()
        for q in queues:
            q.put((trainer, args.rounds))
        done = [result() for _ in queues]
        return sum(steps for steps, _ in done) / (time.perf_counter() - t0)

    rates: dict[tuple[str, str, bool], list[float]] = {}
    try:
        for rep in range(args.reps):
            for contended in (False, True):
                spinner = None
                if contended:
                    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    time.sleep(0.5)
                try:
                    for trainer in trainers:
                        order = CONFIGS[rep % 3:] + CONFIGS[: rep % 3]
                        for config in order:
                            rates.setdefault((trainer, config, contended), []).append(measure(config, trainer))
                finally:
                    if spinner is not None:
                        spinner.kill()
                        spinner.wait()
    finally:
        for pool in pools.values():
            for proc, q in pool:
                q.put(None)
                proc.join(timeout=10)
    for trainer in trainers:
        for contended in (False, True):
            label = "contended (a busy loop wants one core)" if contended else "quiet"
            print(f"\n== {trainer} trainer, {label}: device-steps/s summed over workers")
            base = rates[(trainer, CONFIGS[0], contended)]
            for config in CONFIGS:
                r = rates[(trainer, config, contended)]
                ratio = [a / b for a, b in zip(r, base)]
                print(f"  {config}: {spread(r, '{:.0f}')}   vs 1proc x 1thr: {spread(ratio, '{:.2f}x')}")


if __name__ == "__main__":
    main()

"""Paired runs trained together (simulator.engine.run_paired) against the same runs one by one, interleaved.

    python -m benchmarks.sweep_speed [--reps 5] [--workloads mnist,synthetic] [--schemes A,B,C] [--seeds 0]

A group is what a sweep hands one worker: runs that share their data and differ in policy,
here Schemes x model seeds over one partition (the paper's Table 3 cell: non-IID, |T| = 8
of traces/paper, E = 20 SGD steps, 100 devices (MNIST MLP, eta_0 = 0.1 as `make sim-mnist`)
or 50 (SYNTHETIC(1,1) logistic regression)). Each repetition times, in rotating order,
- paired:   run_paired(configs): one FastTrainer call per round for every run's contributors;
- separate: run_simulation(config) for each config in turn (what the sweep did before);
both on the same data and trace set (built once, as a sweep worker does), with one torch
thread (as sweep workers run). Each variant computes every round of every run, evaluation
on the test set included. It prints run-rounds per second per variant (min/median/max over
repetitions), the per-repetition ratio paired/separate (min/median/max) and, from the
warm-up, the largest difference between the two variants' final parameters.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import torch

from coordinator.rules.config import RulesConfig
from flexfl.run_spec import RunSpec
from simulator.engine import DEFAULT_TRACE_SET, SimConfig, TracesConfig, load_data, run_paired, run_simulation
from simulator.paper_numbers import PAPER_DEVICES
from trace_recorder.format import read_trace_set
from workloads.partition_spec import PartitionSpec

VARIANTS = ("paired", "separate")


def group(dataset: str, *, schemes: list[str], seeds: list[int], rounds: int) -> list[SimConfig]:
    base = SimConfig(partition=PartitionSpec(dataset=dataset, n_devices=PAPER_DEVICES[dataset], iid=False, seed=0),
                     rules=RulesConfig(required_updates=20, eta0=0.1 if dataset == "mnist" else None),
                     traces=TracesConfig(num_traces=8), run=RunSpec(rounds=rounds))
    return [replace(base.with_run(seed=seed), rules=base.rules.with_strategy(scheme))
            for seed in seeds for scheme in schemes]


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    ordered = sorted(values)
    return (f"min {fmt.format(ordered[0])}  median {fmt.format(ordered[len(ordered) // 2])}  "
            f"max {fmt.format(ordered[-1])}")


def run(dataset: str, *, schemes: list[str], seeds: list[int], rounds: int, reps: int) -> None:
    configs = group(dataset, schemes=schemes, seeds=seeds, rounds=rounds)
    data = load_data(configs[0])
    traces = read_trace_set(DEFAULT_TRACE_SET)
    fns = {
        "paired": lambda: run_paired(configs, data=data, traces={DEFAULT_TRACE_SET.as_posix(): traces}),
        "separate": lambda: [run_simulation(c, data=data, traces=traces) for c in configs],
    }
    run_rounds = rounds * len(configs)
    print(f"\n== {configs[0].partition.describe()}: {len(configs)} runs (schemes {','.join(schemes)} x seeds "
          f"{','.join(map(str, seeds))}), {rounds} rounds each, E = 20, |T| = 8")
    speed: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(-1, reps):  # rep -1 warms up and compares the variants' models
        order = VARIANTS[rep % 2:] + VARIANTS[: rep % 2]
        out = {}
        for v in order:
            t0 = time.perf_counter()
            out[v] = fns[v]()
            if rep >= 0:
                speed[v].append(run_rounds / (time.perf_counter() - t0))
        if rep == -1:
            diff = max(float((a.final_params[n] - b.final_params[n]).abs().max())
                       for a, b in zip(out["paired"], out["separate"]) for n in a.final_params)
            steps = sum(r.device_updates for r in out["separate"])
            print(f"max |paired - separate| over final parameters: {diff:.1e}; {steps} device-steps per repetition")
    for v in VARIANTS:
        print(f"{v:>9}: run-rounds/s  {spread(speed[v])}")
    print(f"  paired/separate: {spread([p / s for p, s in zip(speed['paired'], speed['separate'])], '{:.2f}x')}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per variant (default 5)")
    p.add_argument("--workloads", default="mnist,synthetic", help="comma-separated: mnist, synthetic")
    p.add_argument("--schemes", default="A,B,C", help="schemes in the group (default A,B,C)")
    p.add_argument("--seeds", default="0", help="model seeds in the group, over one partition (default 0)")
    p.add_argument("--rounds", type=int, default=0, help="rounds per run (default: 4 for MNIST, 20 for SYNTHETIC)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    schemes = [s.strip().upper() for s in args.schemes.split(",") if s.strip()]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}, {args.reps} reps")
    for name in [n for n in args.workloads.split(",") if n]:
        if name not in ("mnist", "synthetic"):
            p.error(f"unknown workload {name!r}; choose mnist or synthetic")
        rounds = args.rounds or (4 if name == "mnist" else 20)
        run(name, schemes=schemes, seeds=seeds, rounds=rounds, reps=args.reps)


if __name__ == "__main__":
    main()

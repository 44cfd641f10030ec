"""E in epochs on MNIST: the cache trainer on ragged work, and what Table 3's epoch regime costs.

    python -m benchmarks.epoch_speed [--reps 5] [--round 1] [--epochs 20] [--setting niid] [--num-traces 8]
    python -m benchmarks.epoch_speed --price [--rate-rounds 2] [--reps 3]

Both use Table 3's headline MNIST runs (simulator.paper.table3: the per-label reading's partition,
100 devices, batch 10, 200 rounds) with E counted in epochs (simulator.paper.regime; eta_0 the
paper's 2e-3, which changes no count and no speed). Device k trains s_k x ceil(n_k / 10)
SGD steps, s_k drawn by the engine itself (simulator.device_steps.round_work runs
simulator.engine's rounds with a no-op trainer).

Ragged vs equal (default): the cache trainer (simulator.trainers.cache_trainer, one thread) trains
one round of a Scheme B/C run (every device with s > 0; round --round of seed --seed, |T| =
--num-traces) from the initial model: "ragged" is that round's steps, "equal" gives every one
of the same devices the same step count, round(total / devices), so the totals agree to
within devices / 2 steps. The two alternate in one process (A B, B A, ...), each repetition
on fresh minibatch generators; it prints device-steps/s of both and ragged/equal per
repetition.

Price (--price): device-steps counted exactly (no training) for (a) one paired group (Schemes
A, B, C of --setting, --num-traces, --seed), (b) Table 3's MNIST grid (IID and non-IID x |T|
= 1..8 x seeds 0-4; |T| = 1 runs once per group, A = B = C) and (c) the sweep that
`make paper-table3-mnist-epoch` runs (non-IID and IID, |T| in {2, 4, 8}, seeds 0-1); then the
device-steps/s of (a)'s group trained by simulator.engine.run_paired (the cache trainer, one
thread) for --rate-rounds rounds, --reps times, from the rounds' own seconds (training,
aggregation and evaluation on the 10k test set; not the group's set-up), and the wall time
of (a), (b), (c) at that rate, in core-hours and in days on 2 cores.

Measured on the 2-core AMD EPYC (family 26, model 2), load average 5-6 from other runs:
ragged/equal 0.954 median [0.940, 0.974] over 7 reps (12.3k vs 12.9k device-steps/s; the
longest device, 11,460 steps on 5,962 images, streams a shard that leaves the cache, which
is our guess at the 5 %, not measured); the price: (a) 38.6 M device-steps, (b) 3.30 G, (c)
0.57 G; run_paired 12.9k device-steps/s median [12.5k, 16.8k] over 5 reps of 2 rounds ->
(a) 0.8 core-h, (b) 71 core-h = 1.5 days on 2 cores, (c) 12.3 core-h = 0.26 days.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from benchmarks.sim_speed import machine_line, spread
from edge_agent.trainer import device_rng
from flexfl.vocabulary import Unit
from simulator.device_steps import StepCount, count_group, count_groups, round_work
from simulator.engine import SimConfig, run_paired
from simulator.groups import Group
from simulator.paper.regime import Regime
from simulator.paper.table3 import HEADLINE, READINGS, SETTINGS, reading_groups
from simulator.trainers.cache_trainer import CacheTrainer
from workloads.federated import build_federated, initial_model

REGIME = Regime(unit=Unit.EPOCH, eta0="paper")
GRID = {"settings": SETTINGS, "num_traces": range(1, 9), "seeds": range(5)}  # (b): Table 3's MNIST grid
SUBSET = {"settings": ("niid", "iid"), "num_traces": (2, 4, 8), "seeds": (0, 1)}  # (c): make paper-table3-mnist-epoch
CORES = 2


def groups(*, settings: Sequence[str], num_traces: Sequence[int], seeds: Sequence[int], epochs: int = 20,
           rounds: int = 200) -> list[Group]:
    """Table 3's headline MNIST groups under E = `epochs` epochs, as `flexfl sim table3 --unit epoch` builds them."""
    out = reading_groups("mnist", READINGS[HEADLINE], seeds=seeds, num_traces=num_traces, settings=settings,
                         regime=REGIME)
    def in_epochs(r):
        return replace(r, config=with_e(r.config, epochs=epochs, rounds=rounds))

    return [Group(tuple(in_epochs(r) for r in g.runs)) for g in out]


def with_e(cfg: SimConfig, *, epochs: int, rounds: int) -> SimConfig:
    return replace(cfg.with_run(rounds=rounds), rules=replace(cfg.rules, required_updates=epochs))


def header(mode: str) -> None:
    print(f"{machine_line()} (machine shared with other runs); {mode}")


# ---- ragged vs equal -----------------------------------------------------------------------------


def ragged_vs_equal(*, setting: str, num_traces: int, seed: int, round_index: int, epochs: int, reps: int) -> None:
    group = groups(settings=[setting], num_traces=[num_traces], seeds=[seed], epochs=epochs, rounds=round_index)[0]
    cfg = next(r.config for r in group.runs if r.labels["scheme"] == "C")
    data = build_federated(cfg.partition)
    work = list(round_work(cfg, data=data))[-1]  # the engine's round `round_index`: its s draws and weighing
    shards = np.array(work.shards, dtype=np.int64)
    ragged = np.array(work.steps, dtype=np.int64)
    equal = np.full(len(shards), round(ragged.sum() / len(shards)), dtype=np.int64)
    model, start = initial_model("mnist", seed=seed)
    batch = cfg.rules.batch_size_for(cfg.partition.dataset)
    trainer = CacheTrainer(model, data.train, batch_size=batch)
    out = {n: torch.empty((len(shards), *p.shape)) for n, p in start.items()}
    header(f"ragged vs equal, {reps} reps")
    s = np.array([work.s[d] for d in work.rows])
    print(f"MNIST {setting} ({HEADLINE} sizes), |T| = {num_traces}, seed {seed}, round {round_index}, E = {epochs} "
          f"epochs, batch {batch}: {len(shards)} devices with s > 0 (s: min {s.min()} median {np.median(s):.0f} max "
          f"{s.max()}), n_k: min {data.sample_counts[shards].min()} max {data.sample_counts[shards].max()}")
    print(f"  ragged: steps per device min {ragged.min()} median {np.median(ragged):.0f} max {ragged.max()}, "
          f"total {ragged.sum():,}")
    print(f"  equal:  {equal[0]} steps per device, total {equal.sum():,}")
    variants = {"ragged": ragged, "equal": equal}
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(-1, reps):  # rep -1 warms up (numba kernels, buffers)
        for v in (("ragged", "equal") if rep % 2 == 0 else ("equal", "ragged")):
            steps = variants[v]
            rngs = [device_rng(seed, 1000 + rep, int(k)) for k in shards]
            t0, c0 = time.perf_counter(), time.thread_time()
            trainer.train(start, shard_of_row=shards, steps=steps, lr=work.opening.lr, rngs=rngs, out=out)
            if rep >= 0:
                wall[v].append(int(steps.sum()) / (time.perf_counter() - t0))
                cpu[v].append(int(steps.sum()) / (time.thread_time() - c0))
    for v in variants:
        print(f"{v:>7}: device-steps/s  {spread(wall[v])}   (per CPU-second: {spread(cpu[v])})")
    ratios = [r / e for r, e in zip(wall["ragged"], wall["equal"])]
    print(f"ragged/equal: {spread(ratios, '{:.3f}')}   [each: {' '.join(f'{r:.3f}' for r in ratios)}]   (CPU time: "
          f"{spread([r / e for r, e in zip(cpu['ragged'], cpu['equal'])], '{:.3f}')})")


# ---- the regime's price --------------------------------------------------------------------------


def total(counts: Sequence[dict[str, StepCount]]) -> StepCount:
    out = StepCount(0, 0, 0)
    for group in counts:
        for c in group.values():
            out = out + c
    return out


def label(g: Group) -> tuple[str, int, int]:
    first = g.runs[0].labels
    return first["setting"], first["num_traces"], first["seed"]


def measure_rate(group: Group, *, rounds: int, reps: int) -> tuple[list[float], list[float]]:
    """device-steps/s of the group's first `rounds` rounds in run_paired: per second of round time, per CPU-second."""
    configs = [r.config.with_run(rounds=rounds) for r in group.runs if r.same_as is None]
    data = build_federated(configs[0].partition)
    model, start = initial_model("mnist", seed=0)
    CacheTrainer(model, data.train[:1], batch_size=10).train(start, shard_of_row=[0], steps=[1], lr=1e-3,
                                                             rngs=[np.random.default_rng(0)])  # load the kernels
    wall, cpu = [], []
    for rep in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        results = run_paired(configs, data=data)
        call_s, cpu_s = time.perf_counter() - t0, time.thread_time() - c0
        steps = sum(r.device_updates for r in results)
        round_s = sum(r.wall_s for r in results)  # the rounds' seconds add up to the group's (run_paired)
        wall.append(steps / round_s)
        cpu.append(steps / cpu_s)
        print(f"  rep {rep}: {steps:,} device-steps in {round_s:.1f} s of rounds ({call_s - round_s:.1f} s set-up), "
              f"{steps / round_s:,.0f} device-steps/s; {cpu_s:.1f} CPU-s for the call, {steps / cpu_s:,.0f} per CPU-s",
              flush=True)
    return wall, cpu


def price(*, setting: str, num_traces: int, seed: int, rate_rounds: int, reps: int) -> None:
    header(f"the price of E in epochs, MNIST, {HEADLINE} reading")
    t0 = time.perf_counter()
    grid = groups(**GRID)
    counts = count_groups(grid, load=build_federated)
    by_label = dict(zip(map(label, grid), counts))
    chosen = groups(settings=[setting], num_traces=[num_traces], seeds=[seed])[0]
    one = by_label.get(label(chosen)) or count_group(chosen, data=build_federated(chosen.runs[0].config.partition))
    subset = [c for key, c in by_label.items() if key[0] in SUBSET["settings"] and key[1] in SUBSET["num_traces"]
              and key[2] in SUBSET["seeds"]]
    print(f"counted in {time.perf_counter() - t0:.0f} s (no training)")
    print(f"\n(a) one paired group, {setting} |T| = {num_traces} seed {seed}, E = 20 epochs, 200 rounds:")
    for name, c in one.items():
        print(f"  {name}: {c.device_steps:,} device-steps, {c.device_rounds:,} device-rounds "
              f"({c.device_steps / max(c.device_rounds, 1):.0f} steps each)")
    print("\nper cell, device-steps summed over the computed runs of seeds 0-4 (millions):")
    print("  |T|      " + "".join(f"{j:>9}" for j in GRID["num_traces"]))
    for st in GRID["settings"]:
        cells = [sum(total([c]).device_steps for key, c in by_label.items() if key[:2] == (st, j)) / 1e6
                 for j in GRID["num_traces"]]
        print(f"  {st:<8} " + "".join(f"{v:>9.1f}" for v in cells))
    jobs = {"(a) one group": total([one]), f"(b) grid, {len(grid)} groups": total(counts),
            f"(c) subset, {len(subset)} groups": total(subset)}
    print(f"\nrate: run_paired on (a)'s group, {rate_rounds} rounds x {reps} reps, cache trainer, 1 thread, "
          "evaluation on the 10k test set every round of every run:", flush=True)
    wall, cpu = measure_rate(chosen, rounds=rate_rounds, reps=reps)
    print(f"device-steps/s: {spread(wall)} per second of rounds   (per CPU-second of the call: {spread(cpu)})")
    rate = float(np.median(wall))
    print(f"\nwall time at the median rate {rate:,.0f} device-steps/s [range over reps], one core per group, "
          f"{CORES} cores:")
    for name, c in jobs.items():
        hours = c.device_steps / rate / 3600
        lo, hi = c.device_steps / max(wall) / 3600, c.device_steps / min(wall) / 3600
        at_cpu = c.device_steps / float(np.median(cpu)) / 3600
        print(f"  {name}: {c.device_steps:,} device-steps, {c.device_rounds:,} device-rounds -> {hours:,.1f} core-h "
              f"[{lo:,.1f}, {hi:,.1f}] = {hours / CORES / 24:.2f} days on {CORES} cores [{lo / CORES / 24:.2f}, "
              f"{hi / CORES / 24:.2f}]   (at the CPU-time rate: {at_cpu:,.1f} core-h, {at_cpu / CORES / 24:.2f} days)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.epoch_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--price", action="store_true", help="count the device-steps of a group, the grid and the subset, "
                   "measure run_paired's rate and estimate their wall time")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (default 5; 3 with --price)")
    p.add_argument("--setting", choices=SETTINGS, default="niid")
    p.add_argument("--num-traces", type=int, default=8, help="|T| (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--round", type=int, default=1,
                   help="ragged vs equal: the round whose draws are trained (default 1)")
    p.add_argument("--epochs", type=int, default=20, help="ragged vs equal: E in epochs (default 20)")
    p.add_argument("--rate-rounds", type=int, default=2, help="--price: rounds of the group per timed repetition")
    args = p.parse_args(argv)
    if not 1 <= args.num_traces <= 8:
        p.error(f"--num-traces {args.num_traces}: expected 1..8")
    for flag in ("round", "epochs", "rate_rounds"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    torch.set_num_threads(1)
    if args.price:
        price(setting=args.setting, num_traces=args.num_traces, seed=args.seed, rate_rounds=args.rate_rounds,
              reps=args.reps or 3)
    else:
        ragged_vs_equal(setting=args.setting, num_traces=args.num_traces, seed=args.seed, round_index=args.round,
                        epochs=args.epochs, reps=args.reps or 5)


if __name__ == "__main__":
    main()

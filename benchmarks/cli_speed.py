"""Benchmark: how long `flexfl` takes to answer --help and an argument error, beyond Python itself.

    python -m benchmarks.cli_speed [--reps 9]

Runs, as fresh processes in rotated order (A B C D, B C D A, ...), `python -c pass` (the
floor) and three answers that must not import torch or data: `flexfl --help`,
`flexfl traces record --help` (its parser names the recording profile) and
`flexfl sim table3 --bogus` (an argument error, exit code 2). Prints each command's wall
time and its excess over the floor of the same rotation, min / median / max, against the
goal: excess < 0.5 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np

GOAL_S = 0.5
FLOOR = ("python -c pass", [sys.executable, "-c", "pass"], 0)
FLEXFL = [sys.executable, "-m", "flexfl.app.cli"]
COMMANDS = (
    ("flexfl --help", [*FLEXFL, "--help"], 0),
    ("flexfl traces record --help", [*FLEXFL, "traces", "record", "--help"], 0),
    ("flexfl sim table3 --bogus", [*FLEXFL, "sim", "table3", "--bogus"], 2),
)


def timed(argv: list[str], expect: int) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != expect:
        raise SystemExit(f"{' '.join(argv)}: exit code {proc.returncode}, expected {expect}\n{proc.stderr[-2000:]}")
    return took


def fmt(xs: list[float]) -> str:
    return f"min {min(xs):.3f} / median {float(np.median(xs)):.3f} / max {max(xs):.3f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9, help="rotations (each runs every command once)")
    args = ap.parse_args()
    everything = (FLOOR, *COMMANDS)
    for _name, argv, expect in everything:  # warm the page cache once; not counted
        timed(argv, expect)
    times: dict[str, list[float]] = {name: [] for name, _, _ in everything}
    excess: dict[str, list[float]] = {name: [] for name, _, _ in COMMANDS}
    for rep in range(args.reps):
        order = everything[rep % len(everything):] + everything[:rep % len(everything)]
        this = {name: timed(argv, expect) for name, argv, expect in order}
        for name in times:
            times[name].append(this[name])
        for name in excess:
            excess[name].append(this[name] - this[FLOOR[0]])
    print(f"{args.reps} rotations, fresh processes, rotated order")
    for name, xs in times.items():
        print(f"{name:30s} {fmt(xs)}")
    worst = 0.0
    for name, xs in excess.items():
        print(f"excess of {name:27s} {fmt(xs)}")
        worst = max(worst, float(np.median(xs)))
    print(f"goal: excess < {GOAL_S} s: {'met' if worst < GOAL_S else 'NOT met'} (worst median excess {worst:.3f} s)")


if __name__ == "__main__":
    main()

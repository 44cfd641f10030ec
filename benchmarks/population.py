"""Simulated populations: what a round costs as the participants grow (issue 36 item 4).

    python -m benchmarks.population close [--devices 10000] [--reps 3] [--rounds 3] [--chunk-rows R]
    python -m benchmarks.population sizes [--sizes 1000,10000,100000] [--per-round 1000] [--rounds 3]

`close`: one MNIST run (the real MNIST, IID in equal shards, MLP 784-200-200-10, E = 5 steps, every device
training every round: s = E) with `--devices` participants per round, its rounds' deltas stacked
(chunk_rows above the population: the engine before issue 36) against trained and summed in chunks
(simulator.local_training.STACK_BUDGET_BYTES' worth of rows, the default), in fresh processes in
alternating order (A B, B A, ...). Per variant: set-up seconds (data split, RunState), seconds
per round, and the process's peak resident memory (ru_maxrss); then the chunked / stacked ratios
per repetition, min / median / max, and the largest difference between the two final models.

`sizes`: SYNTHETIC(1,1) populations of each size replaying a FedScale-like device timeline (the
shapes of FedScale's client_device_capacity and client_behave_trace, drawn here with fixed
seeds: see `fedscale_like`) through `flexfl sim run`'s own path (simulator.sim_run), `--per-round`
devices sampled uniformly per round from those available. One fresh process per size; per size:
set-up seconds, seconds per round, peak memory.

Every figure comes from this machine at the time of the run; the script prints the CPU model.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pickle
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flexfl.files import atomic_file

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name, family and model number (every figure is recorded with it)."""
    try:
        block = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or "unknown"
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())}
    family, model = fields.get("cpu family", "?"), fields.get("model", "?")
    return f"{fields.get('model name', 'unknown')} (family {family} model {model})"


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# --- one measured run, in its own process --------------------------------------------------------------

def _close_run(devices: int, rounds: int, chunk_rows: int | None, model_out: str) -> dict:
    import torch

    from coordinator.rules.config import RulesConfig
    from flexfl.run_spec import RunSpec
    from simulator.engine import SimConfig, TracesConfig, load_data, run_simulation
    from simulator.participation import FixedParticipation
    from workloads.partition_spec import PartitionSpec, Sizes

    E = 5
    t0 = time.perf_counter()
    # Equal shards (6 samples each at 10,000 devices): the Pareto split keeps 20 per device, at most 3,000 devices.
    cfg = SimConfig(partition=PartitionSpec(dataset="mnist", n_devices=devices, iid=True, total_samples=60000,
                                            sizes=Sizes.EQUAL),
                    rules=RulesConfig(required_updates=E), traces=TracesConfig(num_traces=8),
                    run=RunSpec(rounds=rounds))
    data = load_data(cfg)
    loaded = time.perf_counter()
    rounds_s: list[float] = []  # round 1's includes the run's set-up (RunState: the federation, the trainer)
    last = [time.perf_counter()]

    def on_round(_record) -> None:
        now = time.perf_counter()
        rounds_s.append(now - last[0])
        last[0] = now

    result = run_simulation(cfg, data=data, participation=FixedParticipation([[E] * devices], E=E),
                            on_round=on_round, chunk_rows=chunk_rows)
    torch.save(result.final_params, model_out)
    return {"load_s": loaded - t0, "rounds_s": rounds_s, "peak_mib": peak_mib(),
            "acc": result.records[-1].test_acc}


def fedscale_like(devices: int, folder: Path, *, seed: int = 0) -> tuple[Path, Path]:
    """FedScale-shaped device files for `devices` clients (trace_recorder.importers.fedscale reads them).

    FedScale's own files are not on this machine; these have their shapes, with distributions
    chosen here (not fitted to FedScale's): computation lognormal around 60 ms per sample (sigma
    0.8), communication lognormal around 5,000 kbit/s (sigma 1), and a day-long availability
    trace per client of 1-4 online windows of 10 min to 4 h at uniform starts (a tenth of the
    clients never go offline). Fixed seeds: every run of the benchmark gets the same population.
    """
    rng = np.random.default_rng([seed, devices])
    capacity = {k: {"computation": float(c), "communication": float(b)}
                for k, c, b in zip(range(devices), rng.lognormal(np.log(60.0), 0.8, devices),
                                   rng.lognormal(np.log(5000.0), 1.0, devices))}
    day = 86400
    behave = {}
    for k in range(devices):
        if rng.random() < 0.1:
            active, inactive = [0], [day]
        else:
            starts = np.sort(rng.uniform(0, day, rng.integers(1, 5)))
            ends = np.minimum(starts + rng.uniform(600, 4 * 3600, len(starts)), day)
            active, inactive = [], []
            for a, b in zip(starts, ends):  # merge overlapping windows, as a device's log would show them
                if inactive and a <= inactive[-1]:
                    inactive[-1] = max(inactive[-1], float(b))
                else:
                    active.append(float(a))
                    inactive.append(float(b))
        behave[k] = {"duration": day, "active": active, "inactive": inactive, "finish_time": day, "model": "phone"}
    cap, beh = folder / "client_device_capacity", folder / "client_behave_trace"
    for path, content in ((cap, capacity), (beh, behave)):
        with atomic_file(path, "wb") as f:
            pickle.dump(content, f)
    return cap, beh


def _measured(cmd: list[str]) -> tuple[float, float, str]:
    """Run `cmd` (cwd: the checkout); its wall seconds, its peak resident MiB (wait4's rusage) and its output."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{text[-3000:]}")
    return wall, usage.ru_maxrss / 1024, text


def sizes(args: argparse.Namespace) -> None:
    flexfl = [str(Path(sys.executable).with_name("flexfl"))]  # the console script of this environment
    print(f"# SYNTHETIC(1,1) populations on a FedScale-like timeline, {args.per_round} sampled per round, "
          f"{args.rounds} rounds; {cpu_model()}, {os.cpu_count()} CPUs", flush=True)
    print("| devices | timeline import s | sim run wall s | set-up s | seconds per round (min / median / max) | "
          "peak MiB | devices with s > 0 per round |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    for n in (int(v) for v in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            cap, beh = fedscale_like(n, folder)
            timeline = folder / "timeline.csv"
            import_s, _, _ = _measured([*flexfl, "traces", "import-fedscale", "--capacity", str(cap), "--behave",
                                        str(beh), "--out", str(timeline), "--horizon-s", "86400"])
            out = folder / "run"
            # 20 samples per device (18 to train, 2 held out): equal shards, so every size has the same devices.
            wall, peak, _ = _measured([*flexfl, "sim", "run", "--dataset", "synthetic", "--devices", str(n),
                                       "--sizes", "equal", "--total-samples", str(20 * n), "--scheme", "C",
                                       "--sample-k", str(args.per_round), "--rounds", str(args.rounds),
                                       "--timeline", str(timeline), "--deadline-s", "120", "--update-s", "2",
                                       "--round-s", "600", "--out", str(out)])
            with (out / "rounds.csv").open(newline="") as f:
                rows = list(csv.DictReader(f))  # the run's seconds per round, which metrics.jsonl leaves out
            per_round = [float(r["seconds"]) for r in rows]
            active = [int(r["active"]) for r in rows]
            print(f"| {n:,} | {import_s:.1f} | {wall:.1f} | {wall - sum(per_round):.1f} | {_spread(per_round)} | "
                  f"{peak:.0f} | {_spread(active)} |", flush=True)


def _one(args: argparse.Namespace) -> None:
    spec = json.loads(args.spec)
    out = _close_run(spec["devices"], spec["rounds"], spec["chunk_rows"], spec["model_out"])
    print("RESULT " + json.dumps(out), flush=True)


def _child(spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.population", "_one", json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"benchmark child failed (exit {proc.returncode}) for {spec}:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _spread(values: list[float]) -> str:
    return f"{min(values):.3g} / {statistics.median(values):.3g} / {max(values):.3g}"


def close(args: argparse.Namespace) -> None:
    import torch

    print(f"# chunked close against stacked: MNIST, {args.devices} participants per round, {args.rounds} rounds, "
          f"{args.reps} repetitions, alternating order; {cpu_model()}, {os.cpu_count()} CPUs", flush=True)
    variants = {"stacked": 10**9, "chunked": args.chunk_rows}  # None: the budget's rows (the engine's default)
    got: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        # Not counted: the first process on a machine compiles the cache trainer's numba kernels into its cache.
        _child({"devices": 100, "rounds": 1, "chunk_rows": None, "model_out": str(Path(tmp) / "w.pt")})
        for rep in range(args.reps):
            order = list(variants) if rep % 2 == 0 else list(reversed(variants))
            models = {}
            for name in order:
                models[name] = str(Path(tmp) / f"{name}-{rep}.pt")
                r = _child({"devices": args.devices, "rounds": args.rounds,
                            "chunk_rows": variants[name], "model_out": models[name]})
                got[name].append(r)
                print(f"rep {rep} {name:8s} load {r['load_s']:.1f} s, rounds "
                      f"{', '.join(f'{s:.1f}' for s in r['rounds_s'])} s, peak {r['peak_mib']:.0f} MiB, "
                      f"accuracy {r['acc']:.4f}", flush=True)
            a, b = torch.load(models["stacked"]), torch.load(models["chunked"])
            diff = max(float((a[n] - b[n]).abs().max() / a[n].abs().max()) for n in a)
            print(f"rep {rep} max |w_chunked - w_stacked| / max |w_stacked| = {diff:.2e}", flush=True)
    for name, runs in got.items():
        per_round = [statistics.median(r["rounds_s"][1:]) for r in runs]
        print(f"{name:8s} first round (with set-up) {_spread([r['rounds_s'][0] for r in runs])} s; later rounds "
              f"(median of a run's) min/median/max {_spread(per_round)} s; "
              f"peak MiB {_spread([r['peak_mib'] for r in runs])}")
    speed = [statistics.median(c["rounds_s"][1:]) / statistics.median(s["rounds_s"][1:])
             for c, s in zip(got["chunked"], got["stacked"])]
    memory = [c["peak_mib"] / s["peak_mib"] for c, s in zip(got["chunked"], got["stacked"])]
    print(f"chunked / stacked per repetition: seconds per round {_spread(speed)}; peak memory {_spread(memory)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.population", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("close", help="a large round stacked against chunked: time and peak memory")
    p.add_argument("--devices", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk-rows", type=int, help="rows per chunk (default: STACK_BUDGET_BYTES' worth, the engine's)")
    p = sub.add_parser("sizes", help="SYNTHETIC populations on a FedScale-like timeline: set-up, round, memory")
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--per-round", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("_one")
    p.add_argument("spec")
    args = parser.parse_args(argv)
    {"close": close, "sizes": sizes, "_one": _one}[args.what](args)


if __name__ == "__main__":
    main()

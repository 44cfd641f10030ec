"""Sync or async on the same devices (issue 36 item 3): Scheme C with a deadline, FedAvg waiting for everyone, FedAvg
dropping late devices, FedBuff with two buffer sizes and FedBuff with Scheme C's E / s factor, on the simulated clock.

The protocol, written before any run under it (2026-12-02) and not changed after seeing a result:

1. Setup per dataset: the operating-point protocol's (results/operating_point.md): Table 3's headline
   setup (per-label sample sizes; 50 SYNTHETIC devices, 100 MNIST; batch 20 / 10), E = 20 SGD steps,
   eta_tau = eta_0 / tau with the protocol's eta_0 for E in steps (read from
   results/operating_point.toml), the non-IID setting, |T| = 8 of the paper's traces. FedBuff's
   client rate follows the same schedule after as many accepted updates (simulator/async_run.py).
2. Devices' speed, two sources:
   - `paper`: the paper's calibrated traces read on the clock with a deadline D = 10 s (a device
     that completed s of E in D takes D / s per update; simulator/clock.py). D only scales every
     time alike.
   - `fedscale`: a FedScale-like population of the same size (benchmarks.population.fedscale_like,
     seed 0: lognormal speeds and bandwidths, day-long online windows), imported with `flexfl
     traces import-fedscale`; one update costs 2 s at CPU share 1 and the deadline is 120 s (the
     values benchmarks/population.py uses), rounds back to back.
3. Rules (`VARIANTS`): Scheme C with the deadline; FedAvg waiting for everyone (`--wait-all`:
   every participant does E, a round lasts until its last update); FedAvg dropping late
   devices (Scheme A: only devices that finished E by the deadline); FedBuff with K = 5 and
   K = 20 (staleness 1 / sqrt(1 + t), server rate 1, every device training at once, E updates
   per task); FedBuff K = 5 whose tasks end at the deadline with the deadline rule's s, each
   update counted E / s times (`--budget --es-factor`).
4. Horizon: the same simulated time for every rule, 200 deadlines (the tables' 200 rounds):
   2,000 s (`paper`) and 24,000 s (`fedscale`); a run ends at its first row at or after it
   ([clock] until_s).
5. Seeds 0-4 (data, model and draws), the same for every rule.
6. Target accuracy, per dataset: 90 % of the mean final test accuracy that the protocol's
   chosen eta_0 reached in its non-IID full-participation runs (operating_point_runs.csv):
   a level the rules' common ancestor reaches, taken from runs this comparison does not use.
7. Reported per (dataset, source, rule), median (min-max) over seeds: test accuracy at the
   horizon, simulated seconds to the target (seeds that never reach it counted apart), rows
   (rounds or server steps), updates and megabytes per device (a round sends the model to
   each participant and takes an upload from each with s > 0; a FedBuff task is one of each),
   and the share of the local steps computed that entered the model with a weight > 0.

`python -m benchmarks.sync_vs_async [--datasets synthetic,mnist] [--sources paper,fedscale] [--seeds 0-4]
[--markdown results/sync_vs_async.md] [--jobs N] [--kept-only]`: resumable (a finished run's rows are kept under
--out and not run again; --kept-only runs nothing and tabulates what is kept; --jobs runs that many at once);
--markdown puts the tables between the page's markers, and the figure beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from benchmarks.report import machine, write_section
from coordinator.rules.round_record import RoundRecord
from flexfl.vocabulary import Unit
from simulator.clock import ClockConfig
from simulator.paper.operating_point import RUNS_CSV, base_config, read_runs
from simulator.paper.regime import OPERATING_POINT_FILE, protocol_eta0
from simulator.paper.schemes import cell_config
from simulator.sim_config import SimConfig

UNIT = Unit.STEP
NUM_TRACES = 8
SETTING = "niid"
PAPER_DEADLINE_S = 10.0
FEDSCALE = {"deadline_s": 120.0, "update_s": 2.0}
HORIZON_DEADLINES = 200
TARGET_SHARE = 0.9
ROW_CAP = 1_000_000  # rows are ended by the horizon, not by this


@dataclass(frozen=True)
class Variant:
    name: str
    title: str
    strategy: str
    params: tuple[tuple[str, object], ...] = ()
    wait_all: bool = False


VARIANTS = (
    Variant("scheme-c", "Scheme C, deadline", "C"),
    Variant("fedavg-wait-all", "FedAvg waiting for everyone", "C", wait_all=True),
    Variant("fedavg-drop-late", "FedAvg dropping late devices (Scheme A)", "A"),
    Variant("fedbuff-k5", "FedBuff K = 5", "fedbuff", (("buffer", 5),)),
    Variant("fedbuff-k20", "FedBuff K = 20", "fedbuff", (("buffer", 20),)),
    Variant("fedbuff-k5-es", "FedBuff K = 5, deadline budget + E / s", "fedbuff",
            (("buffer", 5), ("budget", True), ("es_factor", True))),
)


def deadline_s(source: str) -> float:
    return PAPER_DEADLINE_S if source == "paper" else FEDSCALE["deadline_s"]


def horizon_s(source: str) -> float:
    return HORIZON_DEADLINES * deadline_s(source)


def run_config(dataset: str, source: str, variant: Variant, seed: int) -> SimConfig:
    """The protocol's config for one run (the module docstring, items 1-5)."""
    base, reading = base_config(dataset, UNIT)
    cfg = cell_config(base, setting=SETTING, seed=seed, num_traces=NUM_TRACES)
    cfg = replace(cfg, partition=replace(cfg.partition, sizes=reading.sizes(cfg.partition)))
    rules = replace(cfg.rules, eta0=protocol_eta0(dataset, UNIT)).with_strategy(variant.strategy,
                                                                                 params=dict(variant.params))
    clock = ClockConfig(deadline_s=PAPER_DEADLINE_S if source == "paper" else None, wait_all=variant.wait_all,
                        until_s=horizon_s(source))
    return replace(cfg, rules=rules, clock=clock).with_run(rounds=ROW_CAP)


def target_accuracy(dataset: str) -> float:
    """Item 6: TARGET_SHARE of the protocol's chosen eta_0's mean final non-IID accuracy."""
    eta0 = protocol_eta0(dataset, UNIT)
    accs = [r.final_acc for r in read_runs(OPERATING_POINT_FILE.with_name(RUNS_CSV))
            if r.dataset == dataset and r.unit == str(UNIT) and r.setting == SETTING
            and math.isclose(r.eta0, eta0, rel_tol=1e-6) and r.final_acc is not None]
    if not accs:
        raise SystemExit(f"no non-IID {dataset} run at eta0 {eta0} in {OPERATING_POINT_FILE.with_name(RUNS_CSV)}")
    return TARGET_SHARE * float(np.mean(accs))


def fedscale_timeline(n: int, folder: Path) -> Path:
    """Item 2's FedScale-like population of `n` devices as a timeline (made once, kept in `folder`)."""
    from benchmarks.population import fedscale_like

    timeline = folder / f"fedscale-{n}.csv"
    if not timeline.exists():
        folder.mkdir(parents=True, exist_ok=True)
        cap, beh = fedscale_like(n, folder)
        flexfl = str(Path(sys.executable).with_name("flexfl"))
        subprocess.run([flexfl, "traces", "import-fedscale", "--capacity", str(cap), "--behave", str(beh),
                        "--out", str(timeline), "--horizon-s", "86400"], check=True, stdout=subprocess.DEVNULL)
    return timeline


def simulate(dataset: str, source: str, variant: Variant, seed: int, *, out: Path,
             run: bool = True) -> list[RoundRecord] | None:
    """Run one (dataset, source, rule, seed) of the protocol and keep its rows; a kept run is read back (and with
    run=False, one not kept is None)."""
    from simulator.engine import load_data, run_simulation
    from simulator.report import write_jsonl_atomic

    path = out / f"{dataset}-{source}" / variant.name / f"seed-{seed}.jsonl"
    if path.exists():
        return read_rows(path)
    if not run:
        return None
    cfg = run_config(dataset, source, variant, seed)
    data = load_data(cfg)
    participation = None
    if source == "fedscale":
        from simulator.timeline_source import TimelineRun, timeline_participation

        timeline = fedscale_timeline(cfg.partition.n_devices, out / "timelines")
        participation = timeline_participation(cfg, TimelineRun(path=str(timeline), **FEDSCALE),
                                               sample_counts=[int(n) for n in data.sample_counts])
    t0 = time.perf_counter()
    result = run_simulation(cfg, data=data, participation=participation)
    wall = time.perf_counter() - t0
    write_jsonl_atomic(path, result.rows)
    print(f"  {dataset} {source} {variant.name} seed {seed}: {len(result.records)} rows, "
          f"{100 * result.records[-1].test_acc:.1f} % at {result.records[-1].clock_s:.0f} s, {wall:.1f} s wall",
          flush=True)
    return list(result.records)


def run_missing(cells: Sequence[tuple[str, str, Variant, int]], *, out: Path, jobs: int) -> None:
    """Run the cells not kept yet, `jobs` at a time (each in a process of its own with one torch thread)."""
    missing = [c for c in cells if not (out / f"{c[0]}-{c[1]}" / c[2].name / f"seed-{c[3]}.jsonl").exists()]
    for dataset in sorted({c[0] for c in missing if c[1] == "fedscale"}):  # made once, before workers read it
        fedscale_timeline(run_config(dataset, "fedscale", VARIANTS[0], 0).partition.n_devices, out / "timelines")
    if jobs <= 1:
        for dataset, source, v, seed in missing:
            simulate(dataset, source, v, seed, out=out)
        return
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs, initializer=_one_thread) as pool:
        for future in [pool.submit(simulate, dataset, source, v, seed, out=out)
                       for dataset, source, v, seed in missing]:
            future.result()


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def read_rows(path: Path) -> list[RoundRecord]:
    lines = path.read_text().splitlines()
    return [RoundRecord.from_json(json.loads(line), where=f"{path}:{i}") for i, line in enumerate(lines, 1)]


@dataclass(frozen=True)
class Outcome:
    """One run's figures (item 7)."""

    final_acc: float
    to_target_s: float | None
    rows: int
    updates_per_device: float
    mb_per_device: float
    work_used: float
    curve: tuple[tuple[float, float], ...]  # (clock_s, test_acc)


def outcome(records: Sequence[RoundRecord], *, target: float, devices: int, model_bytes: int) -> Outcome:
    reached = [r.clock_s for r in records if r.test_acc >= target and r.clock_s is not None]
    updates = downloads = 0
    computed = used = 0.0
    for r in records:
        for d in r.participants:
            s = int(r.s.get(d, 0))
            weight = float(r.coefficients.get(d, 0.0))
            computed += s
            used += s if weight > 0 else 0
            updates += int(s > 0)
            # The model reached the device if it worked, or if it was cut short with nothing to send (the row's
            # reason says so); offline devices (and a trace's s = 0, which says nothing more) got nothing.
            reason = (r.stop_reason or {}).get(d)
            downloads += int(s > 0 or (reason is not None and reason not in ("offline", "trace")))
    return Outcome(final_acc=records[-1].test_acc, to_target_s=reached[0] if reached else None, rows=len(records),
                   updates_per_device=updates / devices,
                   mb_per_device=(updates + downloads) * model_bytes / devices / 1e6,
                   work_used=used / computed if computed else float("nan"),
                   curve=tuple((float(r.clock_s or 0.0), r.test_acc) for r in records))


def _spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "-"
    return f"{fmt.format(float(np.median(values)))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def label(dataset: str) -> str:
    return dataset.upper()


def table(dataset: str, source: str, outcomes: dict[str, dict[int, Outcome]], *, target: float) -> list[str]:
    lines = [f"#### {label(dataset)}, {source} devices: horizon "
             f"{horizon_s(source):,.0f} s, target {100 * target:.1f} %", "",
             "| rule | seeds | accuracy at the horizon, % | seconds to target | rows | updates per device | "
             "MB per device | work used |", "|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        runs = list(outcomes.get(v.name, {}).values())
        if not runs:
            continue
        times = [o.to_target_s for o in runs if o.to_target_s is not None]
        lines.append(f"| {v.title} | {len(runs)} | {_spread([100 * o.final_acc for o in runs])} | "
                     f"{_spread(times, '{:,.0f}')} ({len(times)} of {len(runs)} reach it) | "
                     f"{_spread([o.rows for o in runs], '{:.0f}')} | "
                     f"{_spread([o.updates_per_device for o in runs])} | {_spread([o.mb_per_device for o in runs])} | "
                     f"{_spread([100 * o.work_used for o in runs], '{:.0f}')} % |")
    return lines


def ratios(outcomes: dict[str, dict[int, Outcome]]) -> list[str]:
    """Per rule, seconds to target over Scheme C's on the same seed (seeds where both reach it)."""
    base = outcomes.get("scheme-c", {})
    lines = []
    for v in VARIANTS[1:]:
        pairs = [o.to_target_s / base[seed].to_target_s for seed, o in outcomes.get(v.name, {}).items()
                 if seed in base and o.to_target_s is not None and base[seed].to_target_s is not None]
        if pairs:
            lines.append(f"- {v.title} / Scheme C: {_spread(pairs, '{:.2f}')} over {len(pairs)} seeds")
    return lines


def plot(curves: dict[tuple[str, str], dict[str, dict[int, Outcome]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4.2), squeeze=False)
    for ax, ((dataset, source), outcomes) in zip(axes[0], curves.items()):
        grid = np.linspace(0, horizon_s(source), 201)
        for v in VARIANTS:
            runs = list(outcomes.get(v.name, {}).values())
            if not runs:
                continue
            ys = [np.interp(grid, [0.0] + [c[0] for c in o.curve], [np.nan] + [c[1] for c in o.curve],
                            left=np.nan) for o in runs]
            ax.plot(grid, 100 * np.nanmedian(np.array(ys), axis=0), label=v.title)
        seeds = max(len(runs) for runs in outcomes.values())
        ax.set_title(f"{label(dataset)}, {source} devices (median of up to {seeds} seeds)",
                     fontsize=9)
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("test accuracy, %")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _seeds(spec: str) -> list[int]:
    if "-" in spec:
        lo, hi = spec.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(v) for v in spec.split(",")]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sync_vs_async", description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default="synthetic,mnist")
    p.add_argument("--sources", default="paper,fedscale")
    p.add_argument("--seeds", default="0-4")
    p.add_argument("--variants", default=",".join(v.name for v in VARIANTS))
    p.add_argument("--out", type=Path, default=Path("out/sync-vs-async"))
    p.add_argument("--markdown", type=Path, help="the page whose sync-vs-async markers get the tables")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each in a process of its own with one torch "
                                                       "thread (default 1: in this process, one after another)")
    p.add_argument("--kept-only", action="store_true",
                   help="run nothing: tabulate the runs already kept under --out (a sweep still going, or stopped)")
    args = p.parse_args(argv)
    wanted = args.variants.split(",")
    unknown = [w for w in wanted if w not in {v.name for v in VARIANTS}]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(v.name for v in VARIANTS)}")
    started = time.time()
    header = (f"`python -m benchmarks.sync_vs_async`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
              f"{machine()}")
    print(header, flush=True)
    # seeds outermost: a stopped sweep has whole seeds of every rule
    cells = [(dataset, source, v, seed) for dataset in args.datasets.split(",") for source in args.sources.split(",")
             for seed in _seeds(args.seeds) for v in VARIANTS if v.name in wanted]
    if not args.kept_only:
        run_missing(cells, out=args.out, jobs=args.jobs)
    from simulator.timeline_source import model_bytes

    body, curves, left = [header, ""], {}, 0
    for dataset in args.datasets.split(","):
        target = target_accuracy(dataset)
        for source in args.sources.split(","):
            outcomes: dict[str, dict[int, Outcome]] = {}
            for d, src, v, seed in cells:
                if (d, src) != (dataset, source):
                    continue
                records = simulate(dataset, source, v, seed, out=args.out, run=False)
                if records is None:
                    left += 1
                    continue
                cfg = run_config(dataset, source, v, seed)
                outcomes.setdefault(v.name, {})[seed] = outcome(
                    records, target=target, devices=cfg.partition.n_devices, model_bytes=model_bytes(cfg))
            if not outcomes:
                body += [f"#### {label(dataset)}, {source} devices: no run kept yet", ""]
                continue
            body += [*table(dataset, source, outcomes, target=target), "", *ratios(outcomes), ""]
            curves[(dataset, source)] = outcomes
    if left:
        body.append(f"**Partial**: {left} of the runs asked for are not kept yet (--kept-only tabulates what is); "
                    "the same command without --kept-only runs them and keeps the rest.")
    body.append(f"Wall time {(time.time() - started) / 60:.1f} min (runs kept under {args.out} are read back).")
    print("\n".join(body))
    if args.markdown:
        write_section(args.markdown, "sync-vs-async", title="Sync and async rules on the same devices",
                      intro=header, lines=body[2:], fenced=False)
        plot(curves, args.markdown.with_name("sync_vs_async.png"))


if __name__ == "__main__":
    main()

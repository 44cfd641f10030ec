"""Flower's FedAvg with its round timeout beside the same Flower app under FlexFL's deadline client and Scheme C.

Issue 35 item 4: same fleet, same deadline, same seeds. The fleet is FlexFL's emulated one (root: a network
namespace, a cgroup CPU quota and a veth per device, loadgen.fleet), each device a Flower SuperNode inside its
namespace and cgroup (its ClientApp processes too), the SuperLink on the fleet's bridge (loadgen.flower_fleet). The
app is benchmarks/flower_side_by_side/ (sbs): one ClientApp, the ServerApp's rules chosen by `variant`:

- flower-fedavg: Flower's FedAvg; every node is asked for all E updates; a reply later than the round timeout is
  dropped (Flower's rule for late work);
- flexfl-scheme-c: FlexFL's strategy (Scheme C, fast-reboot); the ClientApp races the deadline with
  DeadlineTraining and reports s; the same round timeout.

The operating point is PROTOCOL, fixed before any run and never tuned on the comparison: MNIST over 5 devices (IID:
FlexFL's non-IID split gives each device one digit; sbs/task.py), the operating point FlexFL's protocol chose for
MNIST with E in steps (results/operating_point.md: E = 20 minibatch steps of 10, eta0 = its [mnist.step] choice),
dev-2 at 0.25 CPU and the others at 0.5 (twice `make live-emulated`'s shares: at 0.1 CPU a Flower 1.42 node never
answered, its SuperExec starting another ClientApp process every ~30 s while the first was still importing torch,
six at once and none done after 8 minutes), 10 rounds, a target accuracy of 80 % for time-to-accuracy. The deadline
is calibrated by the rule `flexfl traces record` uses (trace_recorder.recording.recorder. calibrate_deadline with
the paper profile's DeadlineRule: factor x p90 of the unloaded devices' times from the model's sending to their
update's arrival, all E done, after the first skip_rounds warm-up rounds), in a calibration run before the
comparison ("calibrate": no deadline, nodes run all E); both variants' round timeout is that deadline +
TIMEOUT_SLACK_S. A Flower node's time includes its ClientApp's start-up: Flower 1.42 starts one ClientApp process
per message (imports, data), on the node's CPU share. Whatever it shows is the result.

    sudo .venv/bin/python -m benchmarks.flower_side_by_side [--seeds 0,1,2,3,4] [--rounds 30] \\
        [--out out/flower-side-by-side] [--markdown results/flower.md]

A smoke run without root: `--loopback --devices 2 --seeds 0 --rounds 1 --deadline-s 30` (SuperNodes as plain
processes on 127.0.0.1; it checks the machinery, not the rules' figures).

Resumable: a (variant, seed) whose curve holds every round is not run again; an interrupted one starts over.
Runs interleave (fedavg, flexfl, fedavg, ...) so that a machine's slow spell hits both.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.report import Output
from coordinator.rules.round_record import RoundRecord
from edge_agent.flower_client import SAFETY_MARGIN_S
from flexfl.config import write_toml
from flexfl.files import atomic_file
from flexfl.signals import sigterm_as_interrupt
from loadgen.fleet import DeviceSpec, EmulatedFleet, FleetSpec, require_root
from loadgen.flower_fleet import FlowerFleet, NodeSpec
from simulator.paper.regime import protocol_eta0
from trace_recorder.recording.profiles import DeadlineRule
from trace_recorder.recording.recorder import calibrate_deadline

log = logging.getLogger("flower_side_by_side")

APP = Path(__file__).with_name("flower_side_by_side")
VARIANTS = ("flower-fedavg", "flexfl-scheme-c")
LABELS = {"flower-fedavg": "Flower FedAvg, round timeout (late work dropped)",
          "flexfl-scheme-c": "FlexFL deadline client + Scheme C"}


# The recorder's deadline rule with the paper profile's statistic and factor; 5 warm-up rounds (2 skipped), not the
# profile's 20, for time: each round here lasts tens of seconds.
CALIBRATION = DeadlineRule(warmup_rounds=5, skip_rounds=2, statistic="p90", factor=1.1)
TIMEOUT_SLACK_S = 1.0  # round timeout = deadline + this: the grid's pull and the last reply's way (FlexFL needs none)


@dataclass(frozen=True)
class Protocol:
    """The operating point (see the module docstring): fixed before the runs; deadline_s from the calibration."""

    E: int = 20
    batch_size: int = 10
    deadline_s: float = 0.0
    cpu: tuple[float, ...] = (0.5, 0.5, 0.25, 0.5, 0.5)
    rounds: int = 10
    target_acc: float = 0.80

    @property
    def round_timeout_s(self) -> float:
        return self.deadline_s + TIMEOUT_SLACK_S if self.deadline_s else 600.0

    @property
    def eta0(self) -> float:
        return protocol_eta0("mnist", "step")


PROTOCOL = Protocol()


def run_config(p: Protocol, *, variant: str, seed: int, out_file: Path) -> dict:
    return {"variant": variant, "num-server-rounds": p.rounds, "num-partitions": len(p.cpu),
            "local-updates": p.E, "deadline-s": p.deadline_s, "round-timeout-s": p.round_timeout_s,
            "eta0": p.eta0, "batch-size": p.batch_size, "seed": seed, "out-file": str(out_file.absolute())}


def finished(path: Path, rounds: int) -> dict | None:
    """The curve of a finished run (every round tested), else None."""
    try:
        done = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return done if [c["round"] for c in done.get("curve", [])][-1:] == [rounds] else None


@dataclass(frozen=True)
class Where:
    """Where the SuperNodes run: each in an emulated device (root; `prefix` and `subnet` name the fleet), or, with
    `loopback`, as plain processes on 127.0.0.1 without CPU quotas (a smoke run: it checks the machinery, and its
    figures compare nothing)."""

    prefix: str
    subnet: str
    loopback: bool = False

    @contextmanager
    def devices(self, p: Protocol) -> Iterator[tuple[str, list[NodeSpec]]]:
        """The SuperLink's host and one NodeSpec per device of `p` (superlink address filled in later)."""
        config = [{"partition-id": k, "num-partitions": len(p.cpu)} for k in range(len(p.cpu))]
        if self.loopback:
            yield "127.0.0.1", [NodeSpec(node_config=c) for c in config]
            return
        spec = FleetSpec(devices=tuple(DeviceSpec(cpu_quota=c) for c in p.cpu), prefix=self.prefix,
                         subnet=self.subnet)
        with EmulatedFleet.up(spec) as fleet:
            yield fleet.coordinator_host, [NodeSpec(node_config=c, cgroup=Path(d.cgroup), netns=d.netns)
                                           for c, d in zip(config, fleet.devices, strict=True)]


def one_run(p: Protocol, *, variant: str, seed: int, work: Path, where: Where) -> dict:
    """One run on a fresh fleet (emulated or loopback) and a fresh SuperLink and SuperNodes; its curve."""
    curve_file = work / f"{variant}-seed{seed}.json"
    curve_file.unlink(missing_ok=True)
    folder = work / f"{variant}-seed{seed}"
    started = time.monotonic()
    with where.devices(p) as (host, specs), FlowerFleet(folder, host=host, task_poll_interval_s=0.2) as flower:
        address = flower.start_superlink()
        flower.wait_ready()
        for k, spec in enumerate(specs):
            flower.start_supernode(f"node-{k}", replace(spec, superlink=address))
        overrides = folder / "run_config.toml"
        write_toml(overrides, run_config(p, variant=variant, seed=seed, out_file=curve_file))
        result = flower.run(APP, run_config=overrides, timeout_s=120 + 3 * p.rounds * p.round_timeout_s)
        nodes = {k: node_id(flower.procs[f"node-{k}"].log_path) for k in range(len(specs))}
        flower.stop()
        left = flower.leftovers()  # what outlived the stop (their ClientApps too)
    if result.status != "finished:completed" or finished(curve_file, p.rounds) is None:
        raise RuntimeError(f"{variant} seed {seed}: run {result.run_id} ended {result.status}; "
                           f"logs in {folder}: {result.output[-1500:]}")
    if left:
        log.warning("%s seed %d left processes behind: %s", variant, seed, left)
    done = finished(curve_file, p.rounds)
    assert done is not None
    done["run_wall_s"] = round(time.monotonic() - started, 1)
    done["nodes"] = nodes  # partition index -> Flower node id (its device in the rows: node-<id>)
    with atomic_file(curve_file) as f:
        f.write(json.dumps(done))
    return done


def node_id(log_path: Path) -> int | None:
    """The node id a SuperNode printed ("SuperNode ID: N") in its log."""
    found = re.search(r"SuperNode ID: (\d+)", log_path.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def calibrate(p: Protocol, *, work: Path, where: Where) -> dict:
    """The deadline by the recorder's rule (CALIBRATION), from a run without one; kept in WORK/calibration.json."""
    path = work / "calibration.json"
    if path.exists():
        return json.loads(path.read_text())
    rule = CALIBRATION
    done = one_run(replace(p, deadline_s=0.0, rounds=rule.warmup_rounds), variant="calibrate", seed=0, work=work,
                   where=where)
    records = [RoundRecord.from_json(r, where=f"calibration row {i}") for i, r in enumerate(done["records"], 1)]
    unloaded = max(p.cpu)
    reference = [f"node-{done['nodes'][i]}" for i, c in enumerate(p.cpu) if c == unloaded]
    deadline, facts = calibrate_deadline(records, reference=reference, E=p.E, skip_rounds=rule.skip_rounds,
                                         statistic=rule.statistic, factor=rule.factor, margin_s=SAFETY_MARGIN_S)
    result = {"deadline_s": deadline, **facts, "warmup_rounds": rule.warmup_rounds,
              "per_node_s": {f"dev-{i}": [round(r.live.arrived_after_s.get(f"node-{n}", float("nan")), 2)
                                          for r in records if r.live] for i, n in done["nodes"].items()}}
    with atomic_file(path) as f:
        f.write(json.dumps(result, indent=1))
    return result


def time_to(curve: list[dict], target: float) -> float | None:
    """Seconds (since the first round opened) until the test accuracy first reached `target`; None: never."""
    return next((c["wall_s"] for c in curve if c["round"] and c["acc"] >= target), None)


def rounds_to(curve: list[dict], target: float) -> int | None:
    return next((c["round"] for c in curve if c["round"] and c["acc"] >= target), None)


def spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def acc_at(run: dict, k: int) -> float:
    return 100 * next(c["acc"] for c in run["curve"] if c["round"] == k)


def markdown(runs: dict[str, list[dict]], p: Protocol) -> str:
    """The comparison's table: per rules, accuracy by round, time per round, rounds and seconds to the target."""
    marks = sorted({min(10, p.rounds), min(20, p.rounds), p.rounds})
    target = f"{100 * p.target_acc:.0f} %"
    lines = [f"| rules | seeds | accuracy after round {' / '.join(map(str, marks))}, % | seconds per round | "
             f"rounds to {target} | seconds to {target} | updates used per round (of {len(p.cpu)}) |",
             "|---|---|---|---|---|---|---|"]
    for variant in VARIANTS:
        done = runs.get(variant, [])
        if not done:
            continue
        accs = " / ".join(spread([acc_at(r, k) for r in done]) for k in marks)
        secs = spread([r["curve"][-1]["wall_s"] / p.rounds for r in done])
        reached = [float(x) for x in (rounds_to(r["curve"], p.target_acc) for r in done) if x is not None]
        timed = [x for x in (time_to(r["curve"], p.target_acc) for r in done) if x is not None]
        used = spread([statistics.mean(c["updates_used"] for c in r["curve"] if c["round"]) for r in done])
        lines.append(f"| {LABELS[variant]} | {len(done)} | {accs} | {secs} | {spread(reached)} "
                     f"({len(reached)} of {len(done)} seeds) | {spread(timed)} | {used} |")
    return "\n".join(["median (min-max) over seeds; seconds count from round 1's opening", "", *lines])


def figure(runs: dict[str, list[dict]], path: Path, p: Protocol) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_round) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for variant, color in zip(VARIANTS, ("tab:orange", "tab:blue")):
        for i, r in enumerate(runs.get(variant, [])):
            xs = [c for c in r["curve"] if c["round"]]
            label = LABELS[variant] if i == 0 else None
            by_time.plot([c["wall_s"] for c in xs], [100 * c["acc"] for c in xs], color=color, alpha=0.7, label=label)
            by_round.plot([c["round"] for c in xs], [100 * c["acc"] for c in xs], color=color, alpha=0.7)
    for ax in (by_time, by_round):
        ax.axhline(100 * p.target_acc, color="grey", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    by_time.set_xlabel("seconds since round 1 opened")
    by_round.set_xlabel("round")
    by_time.set_ylabel("test accuracy, %")
    by_time.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"MNIST, {len(p.cpu)} emulated devices (CPU {', '.join(f'{c:g}' for c in p.cpu)}), E = {p.E}, "
                 f"deadline {p.deadline_s:g} s, timeout {p.round_timeout_s:g} s; one line per seed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--rounds", type=int, default=PROTOCOL.rounds)
    parser.add_argument("--out", type=Path, default=Path("out/flower-side-by-side"))
    parser.add_argument("--markdown", type=Path,
                        help="write the table as a section of this file, and the figure beside it")
    parser.add_argument("--deadline-s", type=float,
                        help="this deadline instead of calibrating one (a smoke run; the comparison calibrates)")
    parser.add_argument("--prefix", default="ffsbs")
    parser.add_argument("--subnet", default="10.79.0")
    parser.add_argument("--loopback", action="store_true",
                        help="SuperNodes as plain processes on 127.0.0.1, no CPU quotas, no root (a smoke run)")
    parser.add_argument("--devices", type=int, default=len(PROTOCOL.cpu),
                        help=f"the first N of the protocol's {len(PROTOCOL.cpu)} devices (a smoke run)")
    args = parser.parse_args(argv)
    args.out = args.out.absolute()  # Flower's processes run in their own folders
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not 1 <= args.devices <= len(PROTOCOL.cpu):
        parser.error(f"--devices {args.devices}: the protocol has devices 1 to {len(PROTOCOL.cpu)}")
    if args.loopback and args.markdown:
        parser.error("--loopback is a smoke run (no CPU quotas): its figures compare nothing, so it writes no page")
    if not args.loopback:
        require_root("the side-by-side (an emulated fleet; --loopback runs without one)")
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    with sigterm_as_interrupt():  # a stopped benchmark takes its fleet down (the `with`s below)
        return _compare(args, seeds)


def _compare(args: argparse.Namespace, seeds: list[int]) -> int:
    where = Where(prefix=args.prefix, subnet=args.subnet, loopback=args.loopback)
    cpu = PROTOCOL.cpu[:args.devices]
    if args.deadline_s is None:
        calibration = calibrate(Protocol(cpu=cpu), work=args.out, where=where)
        log.info("deadline %.2f s (calibrated: %s)", calibration["deadline_s"], calibration)
        deadline_s = float(calibration["deadline_s"])
    else:
        deadline_s = args.deadline_s
    p = Protocol(rounds=args.rounds, deadline_s=deadline_s, cpu=cpu)
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for seed in seeds:
        for variant in VARIANTS:
            path = args.out / f"{variant}-seed{seed}.json"
            done = finished(path, p.rounds)
            if done is None:
                log.info("running %s, seed %d", variant, seed)
                done = one_run(p, variant=variant, seed=seed, work=args.out, where=where)
                log.info("%s seed %d: %.1f %% after %d rounds, %.0f s", variant, seed,
                         100 * done["curve"][-1]["acc"], p.rounds, done["run_wall_s"])
            runs[variant].append(done)
    say = Output()
    for line in markdown(runs, p).splitlines():
        say(line)
    if args.markdown:
        say.write_section(args.markdown, "flower-side-by-side",
                          title="Flower FedAvg with its timeout beside FlexFL's deadline client and Scheme C")
        figure(runs, args.markdown.with_name("flower_side_by_side.png"), p)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak with churn: a long live run while agents and the coordinator are killed and come back.

    python -m benchmarks.soak --rounds 1000            # make soak
    python -m benchmarks.soak --rounds 1000 --emulate  # root: dev-0 in an emulated device, its link squeezed

A real coordinator and real agents (`flexfl coordinator` / `flexfl agent`, run by
loadgen.harness) train SYNTHETIC on loopback with a 1 s deadline while a seeded schedule:
- kills a random agent with SIGKILL and restarts it a few seconds later;
- stops a random agent with SIGTERM (an announced departure) and restarts it rounds later
  (a rejoin: an arrival under the exclude policy);
- starts devices that were held back (arrivals, with fast-reboot);
- kills the coordinator with SIGKILL several times; each time the checkpoint it left is
  loaded and checked, and the coordinator restarts with --resume;
- with --emulate (root): dev-0 runs in an emulated device (loadgen.fleet: netns + veth)
  and its upload is squeezed with a tc tbf for a stretch of rounds (loadgen.bandwidth).

At the end it checks and prints: one metrics row for every round 1..N, every checkpoint
loadable, the final model finite, no leaked file descriptors, threads or processes, and
the coordinator's resident memory over rounds (least-squares slope per 1000 rounds, within
each coordinator process's life, after a warm-up). Figures are printed and written to
OUT/soak.json; a failed check exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # forks for emulated devices (grpc/grpc#43055)

import numpy as np
import psutil
import torch

from coordinator.checkpoint import load_checkpoint
from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.metrics import read_metrics
from coordinator.rules.config import RulesConfig
from edge_agent.config import AgentConfig, ParticipationConfig
from flexfl.config import write_config
from flexfl.files import atomic_file
from loadgen.harness import Harness, free_port
from workloads.federated import initial_model
from workloads.partition_spec import PartitionSpec, Sizes, device_id

TOKEN = "soak-fleet-token"
REPO = Path(__file__).resolve().parent.parent
WARMUP_ROUNDS = 20  # RSS samples of a coordinator's first rounds (imports, pools) are not part of the slope


class SoakFailure(AssertionError):
    pass


@dataclass
class Plan:
    """The seeded schedule: {round: [event, ...]} with events ("kill" | "depart" | "coordinator" | "squeeze" ...)."""

    events: dict[int, list[str]]
    arrivals: dict[int, int]  # device index -> round it first starts in
    squeeze: tuple[int, int] | None  # rounds [from, to) with dev-0's upload squeezed


def make_plan(rounds: int, devices: int, *, seed: int, coordinator_kills: int, emulate: bool) -> Plan:
    rng = random.Random(seed)
    events: dict[int, list[str]] = {}
    # Coordinator kills spread over the run, away from its ends.
    for k in range(coordinator_kills):
        r = int(rounds * (k + 1) / (coordinator_kills + 1)) + rng.randint(-3, 3)
        events.setdefault(max(3, min(rounds - 3, r)), []).append("coordinator")
    for r in range(3, rounds - 2):
        if rng.random() < 1 / 15:
            events.setdefault(r, []).append("kill")
        if rng.random() < 1 / 40:
            events.setdefault(r, []).append("depart")
    if rounds > 12:  # at least one of each, whatever the seed
        if not any("kill" in e for e in events.values()):
            events.setdefault(rounds // 4, []).append("kill")
        if not any("depart" in e for e in events.values()):
            events.setdefault(rounds // 2 + 1, []).append("depart")
    held = max(1, devices // 4)  # the last `held` devices arrive during the run
    arrivals = {devices - held + i: max(2, rounds * (i + 1) // (2 * (held + 1))) for i in range(held)}
    squeeze = (rounds // 3, rounds // 3 + max(5, rounds // 20)) if emulate else None
    return Plan(events=events, arrivals=arrivals, squeeze=squeeze)


@dataclass
class Samples:
    """(round, rss MiB, fds, threads) per process life: {(name, pid): [...]}, sampled as rounds complete."""

    lives: dict[tuple[str, int], list[tuple[int, float, int, int]]] = field(default_factory=dict)

    def add(self, rnd: int, name: str, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                sample = (rnd, proc.memory_info().rss / 2**20, proc.num_fds(), proc.num_threads())
        except psutil.NoSuchProcess:
            return
        self.lives.setdefault((name, pid), []).append(sample)

    def settled(self, role: str) -> list[list[tuple[int, float, int, int]]]:
        """The lives of processes named `role`*, without their first WARMUP_ROUNDS rounds, at least 3 samples."""
        out = []
        for (name, _), life in self.lives.items():
            if name.startswith(role):
                kept = [x for x in life if x[0] >= life[0][0] + WARMUP_ROUNDS]
                if len(kept) >= 3:
                    out.append(kept)
        return out


def _configs(out: Path, *, rounds: int, devices: int, min_devices: int, deadline_s: float, listen: str,
             connect: str, emulated_connect: str | None) -> tuple[Path, list[Path]]:
    with atomic_file(out / "token", perms=0o600) as f:
        f.write(TOKEN)
    partition = PartitionSpec(n_devices=devices, total_samples=200 * devices, sizes=Sizes.EQUAL)
    cfg = CoordinatorConfig(
        server=ServerConfig(listen=listen, fleet_token_file=str(out / "token"), pull_wait_s=0.5),
        partition=partition, rules=RulesConfig(required_updates=5),
        run=RunConfig(rounds=rounds, deadline_s=deadline_s, min_devices=min_devices, resume_wait_s=5.0),
        output=OutputConfig(dir=str(out / "coordinator")))
    coordinator = write_config(out / "coordinator.toml", cfg, header="benchmarks.soak")
    from trace_recorder.format import read_trace_set
    from trace_recorder.sampler import assign_traces

    traces = read_trace_set(REPO / "traces" / "paper").first(5)
    chosen = assign_traces(devices, n_traces=len(traces), seed=0)
    agents = []
    for i in range(devices):
        agent = AgentConfig(
            coordinator=emulated_connect if (i == 0 and emulated_connect) else connect, device_id=device_id(i),
            shard_index=i, fleet_token_file=str(out / "token"), pull_wait_s=0.5, backoff_initial_s=0.2,
            backoff_max_s=1.0,
            # ~0.2 s a round: slow enough that restarts (seconds) span rounds, as on real devices.
            participation=ParticipationConfig(trace=f"{REPO / 'traces' / 'paper'}:{traces[chosen[i]].name}",
                                              min_update_s=0.03))
        agents.append(write_config(out / f"agent-{i}.toml", agent, header="benchmarks.soak"))
    return coordinator, agents


def _check_checkpoint(path: Path, expected: dict) -> int:
    ckpt = load_checkpoint(path, expected=expected)
    for name, value in ckpt.params.items():
        if not torch.isfinite(value).all():
            raise SoakFailure(f"checkpoint {path}: tensor {name} is not finite")
    return ckpt.completed_round


def slope_per_1000(points: list[tuple[int, float]]) -> float:
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return float("nan")
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    return float(np.polyfit(x, y, 1)[0] * 1000)


def run(rounds: int, devices: int, out: Path, *, seed: int = 0, deadline_s: float = 1.0,
        coordinator_kills: int | None = None, emulate: bool = False, log=print) -> dict:
    """The whole soak; returns its figures, raises SoakFailure when a check fails."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    kills = coordinator_kills if coordinator_kills is not None else max(2, rounds // 150)
    plan = make_plan(rounds, devices, seed=seed, coordinator_kills=kills, emulate=emulate)
    rng = random.Random(seed + 1)
    me = psutil.Process()
    # Children that were there before (e.g. multiprocessing's resource tracker when the soak
    # runs inside a test session that used a process pool) are not the soak's to leak.
    children_before = {p.pid for p in me.children(recursive=True)}
    fds_before, threads_before = me.num_fds(), me.num_threads()
    fleet = None
    started = time.monotonic()
    figures: dict = {"rounds": rounds, "devices": devices, "seed": seed, "deadline_s": deadline_s,
                     "agent_kills": 0, "departures": 0, "rejoins": 0, "arrivals": 0, "coordinator_kills": 0,
                     "unexpected_agent_exits": 0, "checkpoints_checked": 0, "squeezed_rounds": []}
    try:
        port = free_port()
        emulated_connect = None
        if emulate:
            from loadgen.fleet import DeviceSpec, EmulatedFleet, FleetSpec, require_root

            require_root("benchmarks.soak --emulate")
            fleet = EmulatedFleet.up(FleetSpec(devices=(DeviceSpec(cpu_quota=None),), prefix="ffsoak",
                                               subnet="10.77.9"))
            emulated_connect = f"{fleet.coordinator_host}:{port}"
        listen = f"0.0.0.0:{port}" if emulate else f"127.0.0.1:{port}"
        coord_cfg, agent_cfgs = _configs(out, rounds=rounds, devices=devices, min_devices=devices - len(plan.arrivals),
                                         deadline_s=deadline_s, listen=listen, connect=f"127.0.0.1:{port}",
                                         emulated_connect=emulated_connect)
        _, params = initial_model("synthetic", seed=0)
        expected = {n: (tuple(p.shape), None) for n, p in params.items()}
        ckpt_path = out / "coordinator" / "checkpoint.pt"
        samples = Samples()
        with Harness(out, fleet=fleet) as harness:
            coordinator = harness.start_coordinator(coord_cfg, address=f"127.0.0.1:{port}", token=TOKEN)
            harness.wait_ready()
            running: set[int] = set()
            pending: dict[int, float] = {}  # device -> monotonic time to (re)start it
            departed_until: dict[int, int] = {}  # announced departure: restart after this round

            def start(i: int) -> None:
                harness.start_agent(f"agent-{i}", agent_cfgs[i], device=0 if (i == 0 and fleet) else None)
                running.add(i)

            def gone(i: int) -> bool:
                """Its last process's exit has been reported (harness.exits): a new one may start."""
                return i not in running

            for i in range(devices):
                if i not in plan.arrivals:
                    start(i)
            done_events: set[int] = set()
            completed, last_sampled = 0, -1
            finished_agents: set[int] = set()
            while True:
                st = harness.status()
                if st is not None:
                    completed = st.completed_round
                if (st is not None and st.finished) or coordinator.proc.poll() == 0:
                    break  # trained all rounds (its exit code is checked below)
                if completed != last_sampled:
                    for name, m in harness.procs.items():
                        if m.proc.poll() is None:
                            samples.add(completed, name, m.proc.pid)
                    last_sampled = completed
                now = time.monotonic()
                for name, code in harness.exits().items():
                    if name.startswith("agent-"):
                        i = int(name.split("-")[1])
                        running.discard(i)
                        if code == 0 and i not in departed_until:
                            finished_agents.add(i)  # it was told training is over
                        elif i not in pending and i not in departed_until:
                            figures["unexpected_agent_exits"] += 1
                            log(f"  round {completed}: {name} exited on its own (code {code}); restarting it")
                            pending[i] = now + 1.0
                    elif name == "coordinator":  # a killed one is replaced in harness.procs, never reported
                        raise SoakFailure(f"the coordinator exited with {code} unasked; see {coordinator.log_path}")
                for i, at in list(pending.items()):
                    if now >= at and gone(i):
                        del pending[i]
                        start(i)
                for i, until in list(departed_until.items()):
                    # A departing agent tells the coordinator first; under load that can take rounds.
                    if completed >= until and gone(i):
                        del departed_until[i]
                        figures["rejoins"] += 1
                        start(i)
                for i, r in plan.arrivals.items():
                    if completed >= r and i not in running and i not in pending and i not in departed_until \
                            and f"agent-{i}" not in harness.procs:
                        figures["arrivals"] += 1
                        log(f"  round {completed}: {device_id(i)} arrives")
                        start(i)
                if plan.squeeze and fleet is not None:
                    lo, hi = plan.squeeze
                    if completed >= lo and "squeeze-on" not in figures:
                        fleet.set_upload(0, 16)  # kbit/s: a 2.4 KB update takes ~1.2 s, past the deadline
                        figures["squeeze-on"] = completed
                        log(f"  round {completed}: dev-0's upload squeezed to 16 kbit/s (tc tbf)")
                    elif completed >= hi and "squeeze-on" in figures and "squeeze-off" not in figures:
                        fleet.set_upload(0, None)
                        figures["squeeze-off"] = completed
                        log(f"  round {completed}: dev-0's upload unshaped")
                due = [r for r in sorted(plan.events) if r <= completed and r not in done_events]
                for r in due if st is not None else []:
                    done_events.add(r)
                    for event in plan.events[r]:
                        alive = sorted(running - set(pending))
                        if event == "coordinator":
                            harness.signal("coordinator", signal.SIGKILL)
                            coordinator.proc.wait(timeout=30)
                            at = _check_checkpoint(ckpt_path, expected)
                            figures["coordinator_kills"] += 1
                            figures["checkpoints_checked"] += 1
                            log(f"  round {completed}: coordinator killed (-9); its checkpoint (round {at}) loads "
                                "and is finite; resuming")
                            coordinator = harness.start_coordinator(coord_cfg, address=f"127.0.0.1:{port}",
                                                                    token=TOKEN, resume=True)
                            harness.wait_ready()
                        elif event == "kill" and alive:
                            i = rng.choice(alive)
                            harness.signal(f"agent-{i}", signal.SIGKILL)
                            pending[i] = now + rng.uniform(0.5, 4.0)
                            figures["agent_kills"] += 1
                        elif event == "depart" and len(alive) > 1:
                            i = rng.choice(alive)
                            harness.signal(f"agent-{i}", signal.SIGTERM)  # announces its departure
                            departed_until[i] = completed + rng.randint(3, 30)
                            figures["departures"] += 1
                if time.monotonic() - started > 60 + rounds * 20:
                    raise SoakFailure(f"no end after {time.monotonic() - started:.0f} s at round {completed}")
                time.sleep(0.05)
            code = coordinator.proc.wait(timeout=60)
            if code != 0:
                raise SoakFailure(f"the coordinator ended with {code}; see {coordinator.log_path}")
            agent_procs = {n: m.proc for n, m in harness.procs.items() if n.startswith("agent-")}
        # ---- checks --------------------------------------------------------------------
        rows = read_metrics(out / "coordinator" / "metrics.jsonl")
        got = [r.round for r in rows]
        if got != list(range(1, rounds + 1)):
            missing = sorted(set(range(1, rounds + 1)) - set(got))
            raise SoakFailure(f"metrics rows: {len(got)} for {rounds} rounds; missing {missing[:20]}, "
                              f"duplicates {sorted({r for r in got if got.count(r) > 1})[:20]}")
        final = _check_checkpoint(ckpt_path, expected)
        figures["checkpoints_checked"] += 1
        if final != rounds:
            raise SoakFailure(f"the final checkpoint is of round {final}, not {rounds}")
        figures["arrival_rounds"] = [r.round for r in rows if r.arrivals]
        figures["departure_rounds"] = [r.round for r in rows if r.departures]
        figures["inactive_device_rounds"] = sum(v == 0 for r in rows for v in r.s.values())
        if plan.squeeze and fleet is not None:
            lo, hi = figures.get("squeeze-on", 0), figures.get("squeeze-off", 0)
            figures["squeezed_rounds"] = [lo, hi]
            def zero_share(first: int, last: float) -> float | None:
                s0 = [r.s["dev-0"] for r in rows if first <= r.round <= last and "dev-0" in r.s]
                return float(np.mean([s == 0 for s in s0])) if s0 else None

            before, after = zero_share(1, lo), zero_share(hi + 3, np.inf)
            figures["dev0_zero_share_before"] = before
            figures["dev0_zero_share_squeezed"] = zero_share(lo + 1, hi)
            figures["dev0_zero_share_after"] = after
            if before is not None and after is not None and after > before + 0.5:
                raise SoakFailure(f"dev-0 stayed idle after its link was unshaped: s = 0 in {after:.0%} of its "
                                  f"rounds after round {hi + 2}, {before:.0%} before the squeeze")
    finally:
        if fleet is not None:
            fleet.down()
    # Leaks: processes (harness and fleet closed), the soak's own fds and threads, and the
    # coordinator's fds/threads within each life (no growth from its first to its last rounds).
    time.sleep(0.5)
    leftovers = [p for p in me.children(recursive=True)
                 if p.pid not in children_before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    ours = {str(out / "coordinator.toml"), *(str(out / f"agent-{i}.toml") for i in range(devices))}
    strays = [p.pid for p in psutil.process_iter(["cmdline"]) if ours & set(p.info["cmdline"] or [])]
    if leftovers or strays:
        raise SoakFailure(f"processes left running: children {[p.pid for p in leftovers]}, others "
                          f"{[(p, psutil.Process(p).cmdline()[-4:], psutil.Process(p).ppid()) for p in strays]}")
    if any(p.poll() is None for p in agent_procs.values()):
        raise SoakFailure("an agent process is still running")
    figures["soak_fds"] = [fds_before, me.num_fds()]
    figures["soak_threads"] = [threads_before, me.num_threads()]
    if me.num_fds() > fds_before + 8:
        raise SoakFailure(f"the soak process holds {me.num_fds()} fds, {fds_before} at its start")
    lives = samples.settled("coordinator")
    longest = max(lives, key=len, default=[])
    figures["coordinator_lives"] = sum(1 for name, _ in samples.lives if name == "coordinator")
    figures["rss_samples"] = sum(len(life) for life in lives)
    figures["rss_slope_mib_per_1000_rounds"] = [round(slope_per_1000([(r, m) for r, m, _, _ in life]), 2)
                                                for life in lives]
    if longest:
        figures["rss_mib_longest_life"] = {"rounds": [longest[0][0], longest[-1][0]],
                                           "first_last": [round(longest[0][1], 1), round(longest[-1][1], 1)],
                                           "min_max": [round(min(x[1] for x in longest), 1),
                                                       round(max(x[1] for x in longest), 1)]}
    # fds and threads of every process life that lasted: the last rounds hold no more than the first.
    for role in ("coordinator", "agent"):
        grown = []
        for life in samples.settled(role):
            fds = (life[0][2], max(x[2] for x in life[-5:]))
            threads = (life[0][3], max(x[3] for x in life[-5:]))
            grown.append((fds[1] - fds[0], threads[1] - threads[0]))
            if fds[1] > fds[0] + 8 or threads[1] > threads[0] + 8:
                raise SoakFailure(f"a {role} process grew from {fds[0]} to {fds[1]} fds and {threads[0]} to "
                                  f"{threads[1]} threads within one life ({life[0][0]}..{life[-1][0]})")
        figures[f"{role}_lives_checked"] = len(grown)
        figures[f"{role}_max_growth_fds_threads"] = [max((g[0] for g in grown), default=0),
                                                     max((g[1] for g in grown), default=0)]
    figures["wall_s"] = round(time.monotonic() - started, 1)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--devices", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline-s", type=float, default=1.0)
    p.add_argument("--coordinator-kills", type=int, help="default: rounds / 150, at least 2")
    p.add_argument("--rss-slope-bound", type=float, default=20.0,
                   help="largest allowed RSS slope within a coordinator's life, MiB per 1000 rounds (default 20)")
    p.add_argument("--emulate", action="store_true", help="root: dev-0 in an emulated device, its upload squeezed")
    p.add_argument("--out", type=Path, default=Path("out/soak"))
    args = p.parse_args(argv)
    try:
        figures = run(args.rounds, args.devices, args.out, seed=args.seed, deadline_s=args.deadline_s,
                      coordinator_kills=args.coordinator_kills, emulate=args.emulate)
        bad = [s for s in figures["rss_slope_mib_per_1000_rounds"] if s > args.rss_slope_bound]
        if bad:
            raise SoakFailure(f"coordinator RSS grows: slopes {bad} MiB per 1000 rounds (bound {args.rss_slope_bound})")
    except SoakFailure as exc:
        print(f"soak: FAILED: {exc}", file=sys.stderr)
        return 1
    with atomic_file(args.out / "soak.json") as f:
        json.dump(figures, f, indent=1)
    print("soak: passed: " + json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`flexfl traces fidelity` (`make trace-fidelity`): does a trace recorded on the emulated fleet predict live FL there?

The paper's method assumes that a device's trace, recorded under some load, stands for the
work that device gets done in a live run under the same load, so that simulations replaying
traces stand for live federated learning. This command measures that on the emulated fleet
(root), in phases saved in a work folder; a rerun skips the finished ones:

1. record: `flexfl traces record` itself (trace_recorder.recording.recorder) records R rounds per
   device under the profile's loads, with its calibrated deadline.
2. live: live FL on a fresh fleet of the same spec; the same loads are set through the same
   loadgen daemons (recorder.apply_loads: stress-ng competitor, tbf upload), the deadline
   and E are the recording's. The coordinator runs N rounds from a fresh model; the agents
   follow no trace (deadline mode), so their conditions decide s, as in the recording.
   An interrupted live phase starts over (a resumed one would change the conditions).
3. simulate: the simulator replays the recorded set, device k drawing s from its own
   recorded trace, at the live run's seed and K others (the band: if the traces are faithful,
   the live run is one more draw of the same process); and at the same seeds with the live
   run's own s (FixedParticipation). At the live seed that must reproduce the live curve (a
   check of the comparison); seed for seed, the two differ only in where s comes from, which
   separates the traces' effect from the seed's (initial model, minibatches). A third kind
   takes the live run's s in its first rounds (those the recorder drops as settling: no
   trace holds them) and the traces' after them.
4. page: per device the KS distance and mean difference of s/E, live vs recorded; the live
   curves against the simulated band (trace_recorder.fidelity.page).

The FL phase runs the profile's partition and E with the rules `flexfl live` uses for the
dataset (workloads.defaults; MNIST: IID, eta_0 = 0.1) under Scheme C; both phases use this
profile, which differs from the recording profile only in rules that do not change timing.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.metrics import MetricsTail, read_metrics
from coordinator.rules.round_record import RoundRecord
from flexfl.config import load_config, path_field, to_dict, write_config
from flexfl.errors import ConfigError
from flexfl.files import atomic_file
from flexfl.run_folder import secrets_dir
from flexfl.signals import sigterm_as_interrupt
from loadgen.harness import Harness, connect_address
from trace_recorder import DEFAULT_PROFILE
from trace_recorder.format import TraceSet, read_trace_set, utc_now_iso
from trace_recorder.recording.profiles import Profile, load_profile
from trace_recorder.recording.recorder import (
    CoordinatorProcess,
    EmulatedBackend,
    RecordOptions,
    apply_loads,
    clear_loads,
    fleet_token,
    read_fleet_token,
    record,
    sample_cpu,
    select_rounds,
    write_fleet_configs,
)
from workloads.defaults import live_defaults

log = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_NAME = "fidelity.json"
# Three CPU levels and two upload rates of the paper profile: five devices, a modest run.
DEFAULT_TRACES = ("T0", "T50", "T90", "Thi", "Tlo")
# --quick: a run of a few minutes that exercises every phase (the netns test runs it).
QUICK = {"traces": ("T0", "T90"), "record_rounds": 8, "live_rounds": 8, "sim_seeds": 3, "warmup_rounds": 4}


@dataclass(frozen=True)
class FidelityConfig:
    """What a fidelity run measures; a work folder holds one (its state.json says which)."""

    profile: str = path_field(str(DEFAULT_PROFILE))
    traces: tuple[str, ...] = DEFAULT_TRACES  # () = every trace of the profile
    record_rounds: int = 150  # R recorded rounds per device
    live_rounds: int = 150  # N live FL rounds (the simulations run as many)
    sim_seeds: int = 5  # K simulations replaying the recorded traces
    scheme: str = "C"
    eta0: float | None = None  # None: flexfl live's for the dataset
    warmup_rounds: int | None = None  # the calibration's warm-up rounds; None: the profile's

    def __post_init__(self) -> None:
        if self.record_rounds < 1 or self.live_rounds < 2:
            raise ConfigError(f"need --record-rounds >= 1 and --live-rounds >= 2, got {self.record_rounds} and "
                              f"{self.live_rounds}")
        if self.sim_seeds < 2:
            raise ConfigError(f"--seeds must be >= 2 (a band needs two simulations), got {self.sim_seeds}")


@dataclass(frozen=True)
class FleetPlace:
    """Where the emulated fleet lives (not part of what is measured: a rerun may move it)."""

    prefix: str = "fffid"
    subnet: str = "10.77.4"
    port: int = 50062


@dataclass(frozen=True)
class FidelityOptions:
    config: FidelityConfig = field(default_factory=FidelityConfig)
    work: Path = Path("out/trace-fidelity")
    page: Path = Path("results/trace_fidelity.md")
    fleet: FleetPlace = field(default_factory=FleetPlace)
    command: str = ""


def fidelity_profile(cfg: FidelityConfig) -> Profile:
    """The recording profile with the FL phase's rules (timing-neutral: scheme, eta_0, IID) and the chosen traces."""
    base = load_profile(Path(cfg.profile))
    own = live_defaults(base.partition.dataset, emulated=False)
    rules = {**own.get("rules", {}), "scheme": cfg.scheme}
    if cfg.eta0 is not None:
        rules["eta0"] = cfg.eta0
    overrides: dict[str, Any] = {**own, "rules": rules, "rounds": cfg.record_rounds}
    if cfg.warmup_rounds is not None:
        overrides["deadline"] = {"warmup_rounds": cfg.warmup_rounds}
    profile = replace(load_config(Profile, Path(cfg.profile), overrides=overrides), path=str(cfg.profile))
    return profile.select(cfg.traces) if cfg.traces else profile


# ---- the work folder -------------------------------------------------------------------------


class WorkFolder:
    """The phases' files and state.json; refuses a folder made for another config."""

    def __init__(self, path: Path, cfg: FidelityConfig, profile: Profile) -> None:
        self.path = Path(path).resolve()
        self.identity = {"config": to_dict(cfg), "profile": profile.to_dict()}
        self.state: dict[str, Any] = {}

    @property
    def state_path(self) -> Path:
        return self.path / STATE_NAME

    @property
    def traces(self) -> Path:
        """The recorded trace set."""
        return self.path / "traces"

    @property
    def live(self) -> Path:
        """The live run's work folder (configs, logs, the coordinator's metrics)."""
        return self.path / "live"

    @property
    def sims(self) -> Path:
        """One JSON file of per-round results per simulation."""
        return self.path / "sim"

    def open(self) -> None:
        if self.state_path.exists():
            try:
                self.state = json.loads(self.state_path.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{self.state_path}: unreadable ({exc}); remove {self.path} to start over") from None
            if self.state.get("version") != STATE_VERSION or self.state.get("identity") != self.identity:
                theirs = (self.state.get("identity") or {}).get("config", {})
                differ = sorted(k for k in {*theirs, *self.identity["config"]}
                                if theirs.get(k) != self.identity["config"].get(k)) or ["profile"]
                raise ConfigError(f"{self.path} holds a fidelity run of another config (differs in "
                                  f"{', '.join(differ)}); pass another --work or remove the folder")
            return
        if self.path.exists() and any(self.path.iterdir()):
            raise ConfigError(f"{self.path} is not empty and holds no {STATE_NAME}; pass another --work")
        self.state = {"version": STATE_VERSION, "identity": self.identity, "started": utc_now_iso(), "phases": {}}
        self.save()

    def save(self) -> None:
        with atomic_file(self.state_path) as f:
            json.dump(self.state, f, indent=1)

    def done(self, phase: str) -> bool:
        return bool(self.state["phases"].get(phase, {}).get("done"))

    def finish(self, phase: str, *, elapsed_s: float, **facts: Any) -> None:
        self.state["phases"][phase] = {"done": True, "elapsed_s": round(elapsed_s, 1), **facts}
        self.save()

    def sim_path(self, name: str) -> Path:
        return self.sims / f"{name}.json"

    def secrets(self, phase_folder: Path) -> Path:
        """The private folder for the secrets (the fleet token) of the phase working in `phase_folder`: beside
        this whole folder, never in it (flexfl.run_folder.secrets_dir)."""
        return secrets_dir(phase_folder, within=self.path)


def _loadavg() -> float:
    return round(os.getloadavg()[0], 2)


# ---- phases ----------------------------------------------------------------------------------


def _record(work: WorkFolder, opts: FidelityOptions) -> None:
    """Phase 1: the recorder, unchanged, on the fidelity profile; its own work folder makes it resumable."""
    started, load = time.monotonic(), [_loadavg()]
    rec_work = work.path / "record"
    profile_file = write_config(work.path / "profile.toml", fidelity_profile(opts.config),
                                header="the fidelity run's profile (written by flexfl traces fidelity)")
    f = opts.fleet
    result = record(RecordOptions(out=work.traces, profile=profile_file, work=rec_work, secrets=work.secrets(rec_work),
                                  resume=(rec_work / "state.json").exists(), overwrite=True, prefix=f.prefix,
                                  subnet=f.subnet, port=f.port, command=opts.command))
    load.append(_loadavg())
    work.finish("record", elapsed_s=time.monotonic() - started, recorder_elapsed_s=result["elapsed_s"],
                loadavg=load)


def _live(work: WorkFolder, opts: FidelityOptions, profile: Profile, deadline_s: float) -> None:
    """Phase 2: live FL for N rounds on the recorder's fleet, under the recorder's loads and deadline."""
    from loadgen.fleet import require_root

    require_root("flexfl traces fidelity (it builds an emulated fleet)")
    if work.live.exists():
        print(f"live: the interrupted live run in {work.live} starts over", flush=True)
        shutil.rmtree(work.live)
    work.live.mkdir(parents=True)
    N, E = opts.config.live_rounds, profile.rules.required_updates
    f = opts.fleet
    started, load = time.monotonic(), [_loadavg()]
    backend = EmulatedBackend(profile, RecordOptions(out=work.live, prefix=f.prefix, subnet=f.subnet, port=f.port),
                              work.live)
    harness = None
    cpu: dict[str, list[float]] = {}
    try:
        backend.start()
        token = fleet_token(work.secrets(work.live))
        coord_cfg, agent_cfgs = write_fleet_configs(profile, backend, work.live, token_file=token, rounds=N,
                                                    deadline_s=deadline_s, header="written by flexfl traces fidelity")
        harness = Harness(work.live, fleet=backend.fleet, env=dict(os.environ))
        coordinator = CoordinatorProcess(harness, coord_cfg, address=connect_address(backend.coordinator_listen),
                                         token=read_fleet_token(token))
        try:
            coordinator.start(resume=False)
            backend.start_agents(harness, agent_cfgs)
            apply_loads(profile, backend)
            print(f"live: {N} rounds of FL, deadline {deadline_s:g} s, E = {E}, {profile.rules.aggregation.label}",
                  flush=True)
            _watch_live(harness, backend, metrics=work.live / "coordinator" / "metrics.jsonl", rounds=N,
                        required_updates=E, cpu=cpu, load=load)
            coordinator.check()  # it ended by itself: with code 0 after N rounds, or the error is raised here
        finally:
            coordinator.stop()
            clear_loads(backend)
    finally:
        if harness is not None:
            harness.close()
        backend.close()  # agents, daemons, stress-ng, namespaces, links, cgroups
    _finish_live(work, backend, rounds=N, started=started, load=load, cpu=cpu)


def _watch_live(harness: Harness, backend: EmulatedBackend, *, metrics: Path, rounds: int, required_updates: int,
                cpu: dict[str, list[float]], load: list[float]) -> None:
    """Print each live round as it lands and sample the devices' CPU and the load into `cpu` and `load`
    until the coordinator ends."""
    N, E = rounds, required_updates
    tail, shown, last_sample = MetricsTail(metrics), 0, time.monotonic()
    t0 = time.monotonic()

    def progress() -> int:
        rows = tail.rows()
        for r in rows[shown:]:
            eta = (time.monotonic() - t0) / r.round * (N - r.round)
            print(f"live round {r.round:>4}/{N} (ETA {eta:.0f} s): acc {100 * r.test_acc:.1f}%  "
                  + " ".join(f"{d.trace} {r.s.get(d.device_id, 0) / E:.2f}" for d in backend.devices),
                  flush=True)
        return len(rows)

    def sample() -> None:
        for trace, pct in sample_cpu(backend)[0].items():
            cpu.setdefault(trace, []).append(pct)
        load.append(_loadavg())

    while harness.running("coordinator"):
        backend.check(harness)
        shown = progress()
        if time.monotonic() - last_sample > 10:  # the daemons measure over their last window
            sample()
            last_sample = time.monotonic()
        time.sleep(0.2)
    shown = progress()
    sample()  # the competitors still run (cleared by the caller): their last window is the run's end


def _finish_live(work: WorkFolder, backend: EmulatedBackend, *, rounds: int, started: float, load: list[float],
                 cpu: dict[str, list[float]]) -> None:
    """Check that the live run did all its rounds; record the phase as finished with what it measured."""
    N = rounds
    rows = read_metrics(work.live / "coordinator" / "metrics.jsonl")
    if len(rows) < N:
        raise ConfigError(f"the live run completed {len(rows)} of {N} rounds; see {work.live}")
    load.append(_loadavg())
    work.finish("live", elapsed_s=time.monotonic() - started, loadavg=load,
                cpu_achieved={t: round(float(np.mean(v)), 1) for t, v in cpu.items()},
                devices=[d.device_id for d in backend.devices])


def _simulate(work: WorkFolder, opts: FidelityOptions, profile: Profile, trace_set: TraceSet) -> None:
    """Phase 3: K simulations replaying the recorded traces (device k: trace k), and the live run's own s replayed."""
    from flexfl.run_spec import RunSpec
    from simulator.engine import (
        FixedParticipation,
        SimConfig,
        TraceParticipation,
        TracesConfig,
        load_data,
        run_simulation,
    )

    started, load = time.monotonic(), [_loadavg()]
    cfg = opts.config
    n = len(profile.traces)
    base = SimConfig(partition=replace(profile.partition, n_devices=n), rules=profile.rules,
                     run=RunSpec(rounds=cfg.live_rounds, seed=profile.seed),
                     traces=TracesConfig(set=str(work.traces), num_traces=n))
    live_rows = read_metrics(work.live / "coordinator" / "metrics.jsonl")[:cfg.live_rounds]
    ids = work.state["phases"]["live"]["devices"]
    live_s = FixedParticipation([[int(r.s.get(d, 0)) for d in ids] for r in live_rows],
                                E=profile.rules.required_updates)
    seeds = [profile.seed, *band_seeds(profile.seed, cfg.sim_seeds)]
    start = live_start_rounds(live_rows, ids)
    # Per seed, s from the traces and s as the live run had it: the pair differs in the source of s only; and the
    # traces after the live run's own start (the rounds the recorder's rule drops), which the traces cannot hold.
    runs: list[tuple[str, SimConfig, Any]] = [
        (sim_name(source, seed), base.with_run(seed=seed), source)
        for source in ("traces", "live-s", "traces-after-live-start") for seed in seeds]
    todo = [(name, c, p) for name, c, p in runs if not work.sim_path(name).exists()]
    data = load_data(base) if todo else None
    for i, (name, sim_cfg, participation) in enumerate(todo, 1):
        t0 = time.monotonic()

        def progress(rec, name=name, i=i, rounds=sim_cfg.rounds) -> None:
            if rec.round % 25 == 0 or rec.round == rounds:
                print(f"simulate {name} ({i}/{len(todo)}): round {rec.round}/{rounds}, "
                      f"acc {100 * rec.test_acc:.1f}%", flush=True)

        part: Any = live_s
        if participation != "live-s":
            part = TraceParticipation(trace_set, sim_cfg, assignment=range(n))
        if participation == "traces-after-live-start":
            part = AfterStart(part, start=live_s, rounds=start)
        res = run_simulation(sim_cfg, data=data, participation=part, on_round=progress)
        with atomic_file(work.sim_path(name)) as f:
            json.dump({"name": name, "seed": sim_cfg.seed, "wall_s": round(time.monotonic() - t0, 1),
                       "rounds": [asdict(SimRound(round=r.round, test_acc=r.test_acc, test_loss=r.test_loss,
                                                  mean_s=r.mean_s)) for r in res.records]}, f)
    load.append(_loadavg())
    work.finish("simulate", elapsed_s=time.monotonic() - started, loadavg=load, runs=[name for name, _, _ in runs],
                start_rounds=start)


@dataclass(frozen=True, kw_only=True)
class SimRound:
    """One round of a simulation, as the simulate phase's file keeps it (sim_path)."""

    round: int
    test_acc: float
    test_loss: float
    mean_s: float


class AfterStart:
    """s from `start` (the live run's) in rounds 1..`rounds`, from `then` (the traces) after them."""

    def __init__(self, then: Any, *, start: Any, rounds: int) -> None:
        self.then, self.start, self.rounds = then, start, rounds
        self.trace_names = then.trace_names

    def draw(self, shard: int, round_index: int) -> int:
        return (self.start if round_index <= self.rounds else self.then).draw(shard, round_index)


def sim_name(source: str, seed: int) -> str:
    """A simulation's name (and file): s from `source` ("traces" or "live-s", the live run's) at `seed`."""
    return f"{source}-seed-{seed}"


def band_seeds(live_seed: int, k: int) -> list[int]:
    """The simulations' seeds: the k after the live run's, so that none shares its initial model or minibatches."""
    return [live_seed + 1 + i for i in range(k)]


def live_start_rounds(rows: list[RoundRecord], ids: list[str]) -> int:
    """How many first live rounds the recorder's rule drops as settling (rounds up to the first all-delivered one)."""
    kept = live_kept_rounds(rows, ids)
    return kept[0] - 1 if kept else len(rows)


def live_kept_rounds(rows: list[RoundRecord], ids: list[str]) -> list[int]:
    """The live rounds whose s counts, by the recorder's own rule (select_rounds): after the first round every
    device received the model, and with a successor."""
    return select_rounds({r.round: r for r in rows}, segments=[0], ids=ids, rounds=len(rows))


# ---- the whole run ---------------------------------------------------------------------------


def run_fidelity(opts: FidelityOptions) -> dict[str, Any]:
    """Every phase not yet done, then the page; SIGTERM is handled like Ctrl-C (the fleet is removed)."""
    from trace_recorder.fidelity.page import write_page

    profile = fidelity_profile(opts.config)  # bad input (profile, traces) fails before anything is made
    work = WorkFolder(opts.work, opts.config, profile)
    work.open()
    phases = ("record", "live", "simulate")
    with sigterm_as_interrupt():
        for k, phase in enumerate(phases, 1):
            if work.done(phase):
                print(f"fidelity phase {k}/4 {phase}: done in an earlier run ({work.path}); skipped", flush=True)
                continue
            print(f"fidelity phase {k}/4 {phase}", flush=True)
            if phase == "record":
                _record(work, opts)
            elif phase == "live":
                deadline = read_trace_set(work.traces).manifest.deadline_s
                if deadline is None:  # a recorded set always has one; a set put there by hand may not
                    raise ConfigError(f"{work.traces}: the trace set has no deadline_s to run live FL with")
                _live(work, opts, profile, deadline)
            else:
                _simulate(work, opts, profile, read_trace_set(work.traces))
    print("fidelity phase 4/4 page", flush=True)
    return write_page(gather(work, opts, profile), opts.page)


def gather(work: WorkFolder, opts: FidelityOptions, profile: Profile) -> Any:
    """The phases' data as the page's FidelityInputs."""
    from trace_recorder.fidelity.page import FidelityInputs
    from trace_recorder.recording.recorder import condition_text

    cfg, phases = opts.config, work.state["phases"]
    trace_set = read_trace_set(work.traces)
    E = int(trace_set.manifest.required_updates)
    ids = phases["live"]["devices"]
    rows = read_metrics(work.live / "coordinator" / "metrics.jsonl")[:cfg.live_rounds]
    by_round = {r.round: r for r in rows}
    kept = live_kept_rounds(rows, ids)
    devices = tuple(t.name for t in profile.traces)
    of = _sim_curves(work, profile, sim_seeds=cfg.sim_seeds)
    band_of = {source: {seed: c for seed, c in curves.items() if seed != profile.seed} for source, curves in of.items()}
    start = int(phases["simulate"]["start_rounds"])
    facts = _facts(work, opts, profile, trace_set=trace_set, live_rounds=len(rows), devices=devices)
    return FidelityInputs(
        devices=devices, conditions={t.name: condition_text(t, profile) for t in profile.traces},
        recorded={t.name: np.asarray(t.fraction, dtype=np.float64) for t in trace_set.traces},
        live={d: np.array([by_round[k].s.get(i, 0) / E for k in kept]) for d, i in zip(devices, ids)},
        live_curve=_curve([(r.round, r.test_acc, r.test_loss) for r in rows]), band=band_of["traces"],
        live_s_band=band_of["live-s"], live_seed=profile.seed,
        traces_at_live_seed=of["traces"][profile.seed], live_s_replay=of["live-s"][profile.seed],
        traces_after_live_start=of["traces-after-live-start"], start_rounds=start,
        live_start={d: np.array([by_round[k].s.get(i, 0) / E for k in range(1, start + 1)])
                    for d, i in zip(devices, ids)}, facts=facts)


def _curve(points: list[tuple[float, float, float]]) -> dict[str, np.ndarray]:
    """(round, test_acc, test_loss) per round as the page's arrays."""
    columns = list(zip(*points)) or [(), (), ()]
    return dict(zip(("round", "test_acc", "test_loss"), (np.array(c, dtype=np.float64) for c in columns)))


def _sim_curves(work: WorkFolder, profile: Profile, *, sim_seeds: int) -> dict[str, dict[int, dict[str, np.ndarray]]]:
    """Each simulation's curve, by source ("traces", "live-s", "traces-after-live-start") and seed."""
    sims = {name: json.loads(work.sim_path(name).read_text()) for name in work.state["phases"]["simulate"]["runs"]}

    def sim_curve(name: str) -> dict[str, np.ndarray]:
        # the simulate phase's own summary file (written above from the simulator's records)
        rounds = [SimRound(**r) for r in sims[name]["rounds"]]
        return _curve([(r.round, r.test_acc, r.test_loss) for r in rounds])

    seeds = [profile.seed, *band_seeds(profile.seed, sim_seeds)]
    return {source: {seed: sim_curve(sim_name(source, seed)) for seed in seeds}
            for source in ("traces", "live-s", "traces-after-live-start")}


def _facts(work: WorkFolder, opts: FidelityOptions, profile: Profile, *, trace_set: TraceSet, live_rounds: int,
           devices: tuple[str, ...]) -> dict[str, Any]:
    """The page's facts: command, machine, loads, times, and the rules the phases ran under."""
    from loadgen.hostinfo import cpu_model

    phases, m = work.state["phases"], trace_set.manifest
    loads = {p: phases[p].get("loadavg", []) for p in ("record", "live", "simulate")}
    every = [x for v in loads.values() for x in v]
    cpus = os.cpu_count() or 1
    return {
        "command": opts.command or default_command([]), "date": utc_now_iso(), "work": _shown(work.path),
        "wall_s": sum(phases[p]["elapsed_s"] for p in loads),
        "phase_times": ", ".join(f"{p} {phases[p]['elapsed_s'] / 60:.1f} min" for p in loads),
        "cpu_model": cpu_model() or "unknown", "cpus": cpus,
        "load_text": ", ".join(f"{p} {min(v):.1f}-{max(v):.1f}" for p, v in loads.items() if v),
        "load_max": max(every, default=0.0), "shared_machine": max(every, default=0.0) > cpus,
        "cpu_quota": profile.emulation.cpu_quota, "profile": f"`{_shown(Path(profile.path))}` ({profile.name})",
        "recorded_rounds": len(trace_set.traces[0]), "deadline_s": float(m.deadline_s or 0),
        "E": int(m.required_updates), "unit": str(profile.rules.unit), "live_rounds": live_rounds,
        "rules": f"{profile.rules.aggregation.description}, eta_0 = "
                 f"{profile.rules.eta0_for(profile.partition.dataset):g}, "
                 f"{replace(profile.partition, n_devices=len(devices)).describe()}",
        "cpu_recorded": {t: m.conditions.get(t, {}).get("cpu_load_achieved_pct") for t in devices},
        "cpu_live": {t.name: phases["live"].get("cpu_achieved", {}).get(t.name) for t in profile.traces
                     if t.cpu_load_pct},  # as the recorder keeps them: for a competitor only
    }

def _shown(path: Path) -> str:
    """`path` relative to the working folder when inside it (a page should not name this machine's folders)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def default_command(argv: list[str]) -> str:
    return shlex.join(["flexfl", "traces", "fidelity", *argv])

"""`flexfl live`: a real coordinator and N real agent processes on this machine.

Loopback by default. The last device arrives late (fast-reboot) and the first one announces
its departure, so a run shows both policies at work. Both events are scripted by round
(the agents' participation.join_in_round / leave_after_round, and the coordinator's
run.expected_arrivals / expected_departures, which hold that round open until the event
happened), so they happen in the rounds asked for, however fast the rounds run, and a
simulation with the same schedule is comparable. An event that does not happen within
run.expected_wait_s fails the run. On loopback each agent follows a
participation trace (the simulator's assignment and sampler, trace_recorder.sampler) that
caps its s per round, so Scheme C has incomplete work to rescale even on a fast machine.

With `emulate` (root) every agent runs inside an emulated device of loadgen.fleet: its own
network namespace reaching the coordinator over a veth link, a tbf limit on its upload and
a cgroup CPU quota (per device: EmulationConfig). Agents start at full speed and get their
quota once they have joined (start-up is not what the run is about). By default they follow
no trace there (deadline mode, workloads.defaults.EMULATED_DEFAULTS): each trains until its
own deadline budget runs out, so the quota and the upload rate decide s, and each device's
row says why it stopped (edge_agent.deadline.StopReason). With a device timeline
([emulate] timeline, --timeline) the fleet's quotas, link rates and link states follow it round
by round and RUN/conditions.jsonl records them (flexfl.app.live_conditions). The fleet is removed on
exit, Ctrl-C, SIGTERM and errors. Processes are run by loadgen.harness.

The run's config is saved as RUN/live.toml when it starts. `flexfl live --resume --out RUN`
continues an interrupted run (Ctrl-C, SIGTERM, a killed process, a reboot) from its coordinator's
checkpoint with that config: the coordinator resumes, the agents start again, except a device whose
scripted departure is behind the checkpoint. A run that ends short of its rounds, or without a
scripted arrival or departure, is an error that says how far it got (summarize's problems).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from coordinator.checkpoint import checkpointed_round
from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.metrics import MetricsTail, write_run_info
from coordinator.resume import CHECKPOINT_NAME
from coordinator.rules.config import RulesConfig
from coordinator.rules.round_record import RoundRecord
from edge_agent.config import AgentConfig, ParticipationConfig
from flexfl.config import Moved, load_config, path_field, plugin_path_field, to_dict, write_config
from flexfl.errors import ConfigError, FlexFLError
from flexfl.files import atomic_file
from flexfl.run_folder import claim_run_folder, entries_besides_lock, secrets_dir
from flexfl.run_spec import DeadlineRunSpec
from flexfl.signals import sigterm_as_interrupt
from flexfl.vocabulary import StopReason
from loadgen.fleet_timeline import POLL_S
from loadgen.harness import Harness, HarnessError, free_port
from trace_recorder.traces_table import TracesConfig
from workloads.defaults import live_defaults
from workloads.partition_spec import PartitionSpec, Sizes, device_id

if TYPE_CHECKING:
    from flexfl.app.fleet_file import FleetFile
    from flexfl.app.live_conditions import LiveTimeline
    from loadgen.fleet import EmulatedFleet, FleetSpec
    from loadgen.fleet_timeline import FleetTimeline

log = logging.getLogger(__name__)

# How long a scripted round is held for the late agent's start-up (process, imports, shard)
# or dev-0's announcement; past it the run fails naming the device.
EXPECTED_WAIT_S = 90.0


# The run's LiveConfig, written when it starts; `flexfl live --resume` reads it back.
CONFIG_NAME = "live.toml"


class LiveRunError(FlexFLError):
    """The run ended, but not as scripted (short of its rounds, or an arrival/departure missing or late)."""


@dataclass(frozen=True)
class EmulationConfig:
    """[emulate]: agents in an emulated fleet (root): a netns, tbf upload limit and cgroup quota each.

    cpu and up_kbit are per device, cycled over the devices (one value: every device's).
    A timeline (traces/README.md, "Device timelines") sets each device's quota as cpu_share of
    its `cpu` (its full compute), and its rates and link state (loadgen.fleet_timeline).
    """

    enabled: bool = False
    cpu: float | tuple[float, ...] = 0.25  # CPUs per device; 0 = no quota
    up_kbit: tuple[int, ...] = ()  # upload limit per device in kbit/s; 0 = unshaped
    prefix: str = "fflive"
    subnet: str = "10.77.1"
    timeline: str = path_field("")  # a device timeline the fleet follows ("": none)

    @property
    def cpus(self) -> tuple[float, ...]:
        return self.cpu if isinstance(self.cpu, tuple) else (self.cpu,)

    def device_cpu(self, i: int) -> float:
        """Device i's CPUs (0: no quota)."""
        return self.cpus[i % len(self.cpus)] if self.cpus else 0.0

    def device_up_kbit(self, i: int) -> int:
        """Device i's upload limit in kbit/s (0: unshaped)."""
        return self.up_kbit[i % len(self.up_kbit)] if self.up_kbit else 0


@dataclass(frozen=True)
class LiveConfig:
    """A live run: the data split, the rules, the run's length, the traces, and the script of who joins and leaves when.

    [partition], [rules], [run] and [traces] are the tables every program's config shares (docs/config.md);
    rounds, deadline_s, seed, trace_set and num_traces at the top level (the form before them) are refused
    with the new form shown (MOVED_KEYS)."""

    MOVED_KEYS: ClassVar[dict[str, Moved]] = {
        **{key: Moved(f"run.{key}", read=False) for key in ("rounds", "deadline_s", "seed")},
        "trace_set": Moved("traces.set", read=False), "num_traces": Moved("traces.num_traces", read=False)}

    partition: PartitionSpec = field(default_factory=lambda: PartitionSpec(n_devices=5, sizes=Sizes.EQUAL))
    rules: RulesConfig = field(default_factory=RulesConfig)
    run: DeadlineRunSpec = field(default_factory=lambda: DeadlineRunSpec(rounds=30, deadline_s=2.0))
    # Agents follow traces of traces.set ("" = none), assigned as the simulator assigns them
    traces: TracesConfig = field(default_factory=lambda: TracesConfig(num_traces=5))
    # The last device is absent until it arrives during this round (it trains from the next);
    # dev-0 trains in depart_round and leaves at its close (the coordinator holds the round for
    # both, see the module docstring). None: a third / two thirds of the rounds; 0: no such event.
    arrive_round: int | None = None
    depart_round: int | None = None
    update_s: float = 0.05  # each local update takes at least this long (edge-device speed); 0: this machine's
    out: str = path_field("out/live")
    host: str = "127.0.0.1"
    emulate: EmulationConfig = field(default_factory=EmulationConfig)
    plugin_path: str | None = plugin_path_field()  # given to the coordinator's and agents' configs too
    # A fleet file (flexfl/app/fleet_file.py): devices whose agents run elsewhere as services (Pis) and dial
    # this machine; only the coordinator runs here. "" = flexfl live starts the agents itself.
    fleet: str = path_field("")

    @property
    def devices(self) -> int:
        return self.partition.n_devices

    @property
    def rounds(self) -> int:
        return self.run.rounds

    @property
    def deadline_s(self) -> float:
        return self.run.deadline_s

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def trace_set(self) -> str:
        """The trace set the agents follow ("": none)."""
        return self.traces.set

    @property
    def num_traces(self) -> int:
        return self.traces.num_traces

    @property
    def arrival(self) -> int:
        return self.rounds // 3 if self.arrive_round is None else self.arrive_round

    @property
    def departure(self) -> int:
        return 2 * self.rounds // 3 if self.depart_round is None else self.depart_round

    def __post_init__(self) -> None:
        events = (self.arrival > 0) + (self.departure > 0)
        if self.devices < 1 + events:
            raise ConfigError(f"--devices must be >= {1 + events} for {events} arrival/departure event(s) "
                              "(one device must stay from start to end); --arrive-round 0 / --depart-round 0 "
                              "drop an event")
        for name, value in (("--arrive-round", self.arrival), ("--depart-round", self.departure)):
            if not 0 <= value < self.rounds:
                raise ConfigError(f"{name} must be in 1..rounds-1 = 1..{self.rounds - 1} (0: none), got {value}")
        if any(c < 0 for c in self.emulate.cpus) or any(k < 0 for k in self.emulate.up_kbit):
            raise ConfigError(f"--emulate-cpu and --emulate-up-kbit must be >= 0, got {self.emulate.cpu} and "
                              f"{self.emulate.up_kbit}")
        if self.fleet and (self.emulate.enabled or self.arrival or self.departure):
            raise ConfigError(f"--fleet {self.fleet}: the fleet's agents are its devices' own services, so flexfl live "
                              "neither emulates devices nor scripts an arrival or departure: drop --emulate, add "
                              "--arrive-round 0 --depart-round 0")
        if self.rules.sample_k is not None and self.departure:
            # dev-0 announces its departure after training in that round: not drawn in it, it would train later
            # (or never) and the departure would land in another round.
            raise ConfigError(f"--depart-round {self.departure} scripts dev-0's departure after it trains in that "
                              f"round, which client sampling (--sample-k {self.rules.sample_k}) may not draw it for; "
                              "add --depart-round 0")
        if self.emulate.timeline and not self.emulate.enabled:
            raise ConfigError(f"--timeline {self.emulate.timeline}: a timeline is applied to an emulated fleet; "
                              "add --emulate ([emulate] enabled = true)")
        if self.emulate.timeline and self.emulate.up_kbit:
            raise ConfigError(f"--timeline {self.emulate.timeline} sets every device's upload rate: drop "
                              f"--emulate-up-kbit {','.join(map(str, self.emulate.up_kbit))} ([emulate] up_kbit)")
        self.rules.check_for(self.partition.dataset)

    def fleet_file(self) -> FleetFile | None:
        """The fleet file, read and checked against the partition (None without one)."""
        if not self.fleet:
            return None
        from flexfl.app.fleet_file import load_fleet_file

        fleet = load_fleet_file(Path(self.fleet))
        if len(fleet.devices) != self.devices:
            raise ConfigError(f"--fleet {self.fleet} lists {len(fleet.devices)} devices but the partition has "
                              f"{self.devices} (partition.n_devices): one shard per device")
        return fleet

    def device_spec(self, i: int):
        """Device i's emulated budget."""
        from loadgen.fleet import DeviceSpec

        return DeviceSpec(cpu_quota=self.emulate.device_cpu(i) or None, up_kbit=self.emulate.device_up_kbit(i) or None)

    def fleet_spec(self) -> FleetSpec:
        """The emulated fleet this run brings up."""
        from loadgen.fleet import FleetSpec

        return FleetSpec(devices=tuple(self.device_spec(i) for i in range(self.devices)), prefix=self.emulate.prefix,
                         subnet=self.emulate.subnet)

    def fleet_timeline(self) -> FleetTimeline | None:
        """The timeline the fleet follows, read and checked against the fleet (None without one)."""
        if not self.emulate.timeline:
            return None
        from flexfl.app.live_conditions import fleet_timeline
        from loadgen.fleet import least_quota_cpus

        return fleet_timeline(Path(self.emulate.timeline), [self.emulate.device_cpu(i) or None
                                                            for i in range(self.devices)],
                              least_cpus=least_quota_cpus(self.fleet_spec().cfs_period_us))


def load_live_config(path: Path | None, *, overrides: dict | None = None) -> LiveConfig:
    """LiveConfig from defaults < `flexfl live`'s own (workloads.defaults: per dataset, and with
    emulate) < the TOML file < `overrides` (flags)."""
    cfg = load_config(LiveConfig, path, overrides=overrides)
    own = live_defaults(cfg.partition.dataset, emulated=cfg.emulate.enabled)
    return load_config(LiveConfig, path, overrides=overrides, defaults=own) if own else cfg


def device_traces(cfg: LiveConfig) -> list[str]:
    """Each agent's FOLDER:NAME trace, assigned exactly as the simulator assigns them ([] = none)."""
    if not cfg.trace_set:
        return []
    from trace_recorder.format import read_trace_set
    from trace_recorder.sampler import assign_traces

    chosen = read_trace_set(Path(cfg.trace_set)).first(cfg.num_traces)
    assignment = assign_traces(cfg.devices, n_traces=len(chosen), seed=cfg.seed)
    return [f"{Path(cfg.trace_set).resolve()}:{chosen[j].name}" for j in assignment]


def write_configs(cfg: LiveConfig, out: Path, address: str, fleet: FleetFile | None = None, *,
                  secrets_folder: Path | None = None) -> tuple[Path, list[Path], str]:
    """Coordinator and agent TOML files for this run (also a record of what ran); returns them and the token.

    The token goes to `secrets_folder` (default: flexfl.run_folder.secrets_dir(out)). With a `fleet` the
    coordinator takes the fleet file's [server] and no agent file is written (the devices' agents are their
    own services)."""
    if fleet is not None:
        server, token_path = fleet.server, Path(fleet.server.fleet_token_file)
        token = server.token()
    else:
        token = secrets.token_hex(16)
        token_path = (secrets_folder or secrets_dir(out)) / "fleet_token"  # not in `out`: results folders are shared
        with atomic_file(token_path, perms=0o600) as f:
            f.write(token)
        server = ServerConfig(listen=address, fleet_token_file=str(token_path), pull_wait_s=1.0)
    late = cfg.devices - 1 if cfg.arrival else None
    coordinator = CoordinatorConfig(
        server=server, partition=cfg.partition, rules=cfg.rules,
        run=RunConfig(rounds=cfg.rounds, deadline_s=cfg.deadline_s, min_devices=cfg.devices - (late is not None),
                      start_grace_s=0.5, seed=cfg.seed,
                      expected_arrivals={device_id(late): cfg.arrival} if late is not None else {},
                      expected_departures={"dev-0": cfg.departure} if cfg.departure else {},
                      expected_wait_s=EXPECTED_WAIT_S),
        output=OutputConfig(dir=str(out / "coordinator")), plugin_path=cfg.plugin_path,
    )
    coord_path = write_config(out / "coordinator.toml", coordinator, header="written by flexfl live")
    traces = device_traces(cfg)
    agents: list[Path] = []
    for i in range(cfg.devices if fleet is None else 0):
        agent = AgentConfig(
            coordinator=address, device_id=device_id(i), shard_index=i, fleet_token_file=str(token_path),
            pull_wait_s=1.0, partition=cfg.partition,
            participation=ParticipationConfig(
                trace=traces[i] if traces else "", min_update_s=cfg.update_s,
                join_in_round=cfg.arrival if i == late else 0,
                leave_after_round=cfg.departure if i == 0 and cfg.departure else 0),
            plugin_path=cfg.plugin_path,
        )
        agents.append(write_config(out / f"agent-{i}.toml", agent, header="written by flexfl live"))
    return coord_path, agents, token


class LiveRun:
    """Starts and supervises the processes; always stops them (and the emulated fleet) on exit."""

    def __init__(self, cfg: LiveConfig, *, fresh: bool = False, resume: bool = False,
                 secrets_folder: Path | None = None) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.secrets_folder = secrets_folder  # the run's token goes there (default: beside self.out)
        self.fresh = fresh
        self.resume = resume
        self.resumed_after = 0  # the round the coordinator's checkpoint held when this run resumed it
        self.fleet: EmulatedFleet | None = None  # when emulating
        self.timeline: FleetTimeline | None = None  # when the fleet follows one
        self.playing: LiveTimeline | None = None  # ... once the fleet is up
        self.service_fleet: FleetFile | None = None  # devices whose agents are their own services (cfg.fleet)

    def run(self) -> dict:
        """Run the whole live experiment; SIGTERM is handled like Ctrl-C so everything is stopped."""
        with sigterm_as_interrupt():
            return self._run()

    def _start_fleet(self) -> str:
        """Bring up the emulated fleet; return the coordinator's address on it."""
        from loadgen.fleet import EmulatedFleet, require_root

        cfg = self.cfg
        require_root("flexfl live --emulate")
        self.fleet = EmulatedFleet.up(cfg.fleet_spec())
        for d in self.fleet.devices:
            print(f"  device {d.index}: netns {d.netns}, {d.address}, upload "
                  f"{f'{d.spec.up_kbit} kbit/s' if d.spec.up_kbit else 'unshaped'}, "
                  f"{f'{d.spec.cpu_quota:g} CPU' if d.spec.cpu_quota else 'no CPU quota'}", flush=True)
        print(f"  agents follow {f'the traces of {cfg.trace_set}' if cfg.trace_set else 'no trace'}: "
              + ("each caps its s per round" if cfg.trace_set else
                 "each trains until its deadline budget runs out (deadline mode; --trace-set to follow traces)"),
              flush=True)
        if self.timeline is not None:
            from flexfl.app.live_conditions import LiveTimeline
            from loadgen.fleet_timeline import CONDITIONS_FILE

            self.playing = LiveTimeline(self.timeline, self.fleet, out=self.out)
            print(f"  from round 1 each device follows its rows of {cfg.emulate.timeline} "
                  f"({'round by round' if self.timeline.timeline.unit == 'round' else 'by seconds from round 1'}; "
                  f"cpu_share 1 = the CPU above); applied conditions go to {self.out / CONDITIONS_FILE}", flush=True)
        return self.fleet.coordinator_host

    def _run(self) -> dict:
        cfg = self.cfg
        self.timeline = cfg.fleet_timeline()  # a bad timeline fails here, before the folder is touched
        self.service_fleet = cfg.fleet_file()  # ... and so does a bad fleet file
        # The whole folder is this run's: an earlier run in it (its agents' files, its metrics)
        # is continued (--resume), moved aside (--fresh) or refused, never mixed into this one.
        folder = claim_run_folder(self.out, what="flexfl live", holds_run=entries_besides_lock, fresh=self.fresh,
                                  resume=self.resume)
        if folder.moved_aside is not None:
            print(f"--fresh: moved the earlier run in {self.out} to {folder.moved_aside}", flush=True)
        started = time.monotonic()
        harness = None
        interrupted = False
        try:
            self._begin()
            if self.service_fleet is not None:
                address = self.service_fleet.watch_address
            else:
                host = self._start_fleet() if cfg.emulate.enabled else cfg.host
                address = f"{host}:{free_port(host)}"
            coord_path, agent_paths, token = write_configs(cfg, self.out, address, self.service_fleet,
                                                           secrets_folder=self.secrets_folder)
            harness = Harness(self.out, fleet=self.fleet)
            self._start_processes(harness, coord_path, agent_paths, address=address, token=token)
            rows, dead = self._supervise(harness)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            self._stop(harness)  # the coordinator writes its checkpoint as it stops
            folder.release()
        if interrupted:
            raise KeyboardInterrupt(self._how_far())
        return self._finish(rows, dead_agents=dead, started=started)

    def _begin(self) -> None:
        """A new run saves its config (CONFIG_NAME); a resumed one finds the round its checkpoint holds."""
        if not self.resume:
            write_config(self.out / CONFIG_NAME, self.cfg, header="written by flexfl live: this run's config "
                         "(flexfl live --resume reads it)")
            return
        checkpoint = self.out / "coordinator" / CHECKPOINT_NAME
        done = checkpointed_round(checkpoint) if checkpoint.exists() else None
        if done is None:
            raise ConfigError(f"flexfl live --resume: {self.out} holds no readable coordinator checkpoint "
                              f"({checkpoint}); nothing to continue (drop --resume, or --fresh to start over)")
        self.resumed_after = done
        print(f"resuming {self.out} after round {done} of {self.cfg.rounds}", flush=True)

    def _how_far(self) -> str:
        """What an interrupted run says: the rounds its checkpoint holds and the command that continues it."""
        checkpoint = self.out / "coordinator" / CHECKPOINT_NAME
        done = checkpointed_round(checkpoint) if checkpoint.exists() else None
        if not done:
            return f"flexfl live stopped before round 1 completed (results folder {self.out})"
        return (f"flexfl live stopped after round {done} of {self.cfg.rounds}; "
                f"`flexfl live --resume --out {self.out}` continues it")

    def _start_processes(self, harness: Harness, coord_path: Path, agent_paths: list[Path], *,
                         address: str, token: str) -> None:
        """The coordinator, once it answers, then every agent (on its device when emulating)."""
        fleet = self.service_fleet
        harness.start_coordinator(coord_path, address=address, token=token, resume=self.resume,
                                  tls=fleet.watch.tls() if fleet is not None else None)
        harness.wait_ready()
        print(f"  watch the fleet: {watch_command(agent_paths, fleet)}", flush=True)
        if fleet is not None:
            print(f"  the fleet's agents ({', '.join(fleet.devices)}) join from their devices", flush=True)
        for i, path in enumerate(agent_paths):
            if self.resumed_after and i == 0 and self.cfg.departure and self.resumed_after >= self.cfg.departure:
                continue  # dev-0 left after round `departure` (the coordinator's journal holds it): it stays away
            if self.fleet is not None:
                self.fleet.set_cpu_quota(i, None)  # full speed until it has joined (see _quotas)
            harness.start_agent(f"agent-{i}", path, device=i if self.fleet is not None else None)

    def _supervise(self, harness: Harness) -> tuple[list[RoundRecord], dict[str, int]]:
        """Print each round as it lands until the coordinator ends; returns the rows and the agents that died."""
        cfg = self.cfg
        # Without a timeline each device gets its quota once joined; with one, LiveTimeline holds back.
        unquoted: set[int] = set(range(cfg.devices)) if self.fleet is not None and not self.playing else set()
        printed = 0
        dead: dict[str, int] = {}  # agent name -> its exit code
        metrics = self.out / "coordinator" / "metrics.jsonl"
        tail = MetricsTail(metrics)  # each poll reads only the bytes written since the last one
        while harness.running("coordinator"):
            rows = tail.rows()
            for row in rows[printed:]:
                if row.round > self.resumed_after:
                    print(round_line(row, cfg), flush=True)
            printed = len(rows)
            self._check_agents(harness, dead, rounds_done=len(rows))
            if unquoted:
                unquoted = self._quotas(harness, unquoted)
            if self.playing is not None:
                self.playing.follow(harness.status())
            time.sleep(0.1 if self.playing is None else POLL_S)
        harness.check("coordinator")
        rows = tail.rows()
        for row in rows[printed:]:
            if row.round > self.resumed_after:
                print(round_line(row, cfg), flush=True)
        return rows, dead

    def _check_agents(self, harness: Harness, dead: dict[str, int], *, rounds_done: int) -> None:
        """Record in `dead` each agent that exited with an error; one that never started training ends the run."""
        for name, code in harness.exits().items():
            if name != "coordinator" and code != 0:
                st = harness.status()
                if st is not None and not st.started:
                    # Without it the coordinator would wait for run.min_devices forever.
                    raise HarnessError(f"{harness.exited(name)} before training started; "
                                       f"see {self.out / (name + '.log')}")
                # The coordinator copes (the device counts as silent); the run goes on.
                dead[name] = code
                print(f"{name} exited with code {code} after round {rounds_done}; the coordinator treats it "
                      f"as silent from now on (see {self.out / (name + '.log')})", flush=True)

    def _stop(self, harness: Harness | None) -> None:
        """Stop whatever was started: the timeline, the processes, the emulated fleet."""
        if self.playing is not None:
            self.playing.close()
            self.playing = None
        if harness is not None:
            # The coordinator first: it checkpoints the rounds done, and agents stopped after it announce
            # no departure into the run (stopping a run is not a device leaving: --resume brings them back).
            harness.stop([name for name in harness.procs if name == "coordinator"])
            harness.close()
        if self.fleet is not None:
            self.fleet.down()  # also whatever the agents left in their devices
            self.fleet = None

    def _finish(self, rows: list[RoundRecord], *, dead_agents: dict[str, int], started: float) -> dict:
        """Write run_info.json, summary.json and the accuracy plot of a finished run; returns the summary."""
        cfg = self.cfg
        traces = device_traces(cfg)
        names = list(self.service_fleet.devices) if self.service_fleet is not None else [
            device_id(i) for i in range(cfg.devices)]
        write_run_info(self.out, kind="live", config=to_dict(cfg), deadline_s=cfg.deadline_s,
                       required_updates=cfg.rules.required_updates,
                       devices={name: {"trace": traces[i].rpartition(":")[2] if traces and not self.service_fleet
                                       else None, "shard": i} for i, name in enumerate(names)})
        summary = summarize(rows, cfg, wall_s=time.monotonic() - started, dead_agents=dead_agents)
        summary["resumed_after_round"] = self.resumed_after or None
        if cfg.emulate.timeline:
            summary["timeline"] = self._timeline_summary(rows)
        with atomic_file(self.out / "summary.json") as f:
            json.dump(summary, f, indent=1)
        plot_live(rows, self.out / "accuracy.png", cfg)
        return summary

    def _timeline_summary(self, rows: list[RoundRecord]) -> dict:
        """What the fleet timeline did: its file and unit, where the applied conditions are, what they cost."""
        from flexfl.app.live_conditions import update_s_at_full_share
        from loadgen.fleet_timeline import CONDITIONS_FILE, read_conditions, seconds_per_round

        recorded = self.out / CONDITIONS_FILE
        assert self.timeline is not None  # read before the run (fleet_timeline)
        return {"file": self.cfg.emulate.timeline, "unit": self.timeline.timeline.unit.value,
                "conditions": CONDITIONS_FILE,
                "at_share_1": update_s_at_full_share(rows, read_conditions(recorded)),
                "round_s": seconds_per_round(recorded)}

    def _quotas(self, harness: Harness, unquoted: set[int]) -> set[int]:
        if self.fleet is None:  # not emulating: nothing is held back
            return unquoted
        st = harness.status()
        joined = {d.device_id for d in st.devices if d.connected} if st is not None else set()
        for i in sorted(unquoted):
            if device_id(i) in joined:
                self.fleet.set_cpu_quota(i, self.fleet.devices[i].spec.cpu_quota)
                unquoted.discard(i)
        return unquoted


def watch_command(agent_paths: list[Path], fleet: FleetFile | None) -> str:
    """The `flexfl status` command that watches this run: an agent's config holds the address and the token
    file; a service fleet's file names them and the TLS files."""
    if fleet is None:
        return f"flexfl status --config {agent_paths[-1]}"
    w = fleet.watch
    flags = [fleet.watch_address, "--token-file", fleet.server.fleet_token_file]
    for flag, value in (("--tls-ca", w.tls_ca), ("--tls-client-cert", w.tls_client_cert),
                        ("--tls-client-key", w.tls_client_key), ("--tls-server-name", w.tls_server_name)):
        flags += [flag, value] if value else []
    return "flexfl status " + " ".join(flags)


# Reasons a round line leaves out: s = E says "complete"; "trace" is every round of an agent that follows a
# trace (loopback's default), where only a budget that cut it short is news.
_SAID_ELSEWHERE = (StopReason.COMPLETE, StopReason.TRACE)


def round_line(row: RoundRecord, cfg: LiveConfig) -> str:
    """The round's printed line: accuracy, loss, lr, each device's s with why it stopped short, events."""
    why = row.stop_reason or {}  # rows written before the field have none
    s = " ".join(f"{d}:{v}" + (f" ({why[d]})" if why.get(d, StopReason.COMPLETE) not in _SAID_ELSEWHERE else "")
                 for d, v in sorted(row.s.items()))
    extra = []
    if row.arrivals:
        extra.append("arrival: " + ",".join(row.arrivals) + " (fast-reboot from next round)")
    if row.departures:
        extra.append("departure: " + ",".join(f"{d} ({p})" for d, p in row.departure_policies.items()))
    late = device_id(cfg.devices - 1)
    if cfg.arrival and row.round > cfg.arrival and late in row.p:
        extra.append(f"p({late})={row.p[late]:.3f}")
    return (f"round {row.round:>3}  acc {100 * row.test_acc:6.2f}%  loss {row.test_loss:.3f}  "
            f"lr {row.lr:.4g}  s (E={cfg.rules.required_updates}) {s}  {'  '.join(extra)}")


def summarize(rows: list[RoundRecord], cfg: LiveConfig, *, wall_s: float, dead_agents: dict[str, int]) -> dict:
    if not rows:
        raise ConfigError("the coordinator completed no round")
    arrival = next((r.round for r in rows if r.arrivals), None)
    departure = next((r.round for r in rows if r.departures), None)
    problems = []
    if rows[-1].round < cfg.rounds:
        problems.append(f"the run stopped after round {rows[-1].round} of {cfg.rounds} (the coordinator ended "
                        f"early: see {Path(cfg.out) / 'coordinator.log'}); `flexfl live --resume --out {cfg.out}` "
                        "continues it")
    if cfg.arrival and arrival != cfg.arrival:
        late = device_id(cfg.devices - 1)
        when = "never arrived" if arrival is None else f"arrived in round {arrival}"
        problems.append(f"the late device {late} {when}"
                        f", not in round {cfg.arrival} as asked (see {Path(cfg.out) / f'agent-{cfg.devices - 1}.log'})")
    if cfg.departure and departure != cfg.departure and rows[-1].round >= cfg.departure:
        when = "never departed" if departure is None else f"departed in round {departure}"
        problems.append(f"dev-0 {when}, not after round {cfg.departure} as asked (see {Path(cfg.out) / 'agent-0.log'})")
    return {
        "problems": problems,
        "rounds": len(rows), "final_acc": rows[-1].test_acc, "final_loss": rows[-1].test_loss,
        "best_acc": max(r.test_acc for r in rows),
        "arrival_asked": cfg.arrival or None, "arrival_round": arrival,
        "departure_asked": cfg.departure or None, "departure_round": departure,
        "inactive_device_rounds": sum(v == 0 for r in rows for d, v in r.s.items() if d in r.participants),
        "stop_reasons": stop_reason_counts(rows),
        "dead_agents": dead_agents, "wall_s": wall_s, "scheme": cfg.rules.aggregation.label,
        "strategy": cfg.rules.aggregation.name, "strategy_parameters": cfg.rules.aggregation.parameters,
        "departure_policy": str(cfg.rules.departure_policy), "fast_reboot": cfg.rules.fast_reboot,
    }


def stop_reason_counts(rows: list[RoundRecord]) -> dict[str, dict[str, int]]:
    """Per device, how many rounds ended for each reason (edge_agent.deadline.StopReason); rows without one: none."""
    counts: dict[str, Counter[str]] = {}
    for row in rows:
        for d, why in (row.stop_reason or {}).items():
            counts.setdefault(d, Counter())[why] += 1
    return {d: dict(c.most_common()) for d, c in counts.items()}


def plot_live(rows: list[RoundRecord], path: Path, cfg: LiveConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([r.round for r in rows], [100 * r.test_acc for r in rows], color="tab:green",
            label=cfg.rules.aggregation.description)
    for r in rows:
        if r.arrivals:
            # Evaluated from this round on with the newcomer's holdout; it trains from the next.
            ax.axvline(r.round, color="tab:blue", ls="--", lw=1, label="arrival")
        if r.departures:
            ax.axvline(r.round, color="tab:red", ls=":", lw=1.2, label=f"departure ({cfg.rules.departure_policy})")
    ax.set_ylim(0, 100)  # a fixed axis: a run at chance must look like one
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    where = "an emulated fleet" if cfg.emulate.enabled else cfg.host
    ax.set_title(f"Live run: {str(cfg.partition.dataset).upper()}, {cfg.devices} devices on {where}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""`flexfl traces record`: record a trace set by running the paper's protocol on a fleet.

The fleet is emulated on this machine (loadgen.fleet, root) or real hosts from an
inventory, whose agents and loadgen daemons already run as services. Either way:

1. Every device's load is set through its loadgen daemon over ZeroMQ: a stress-ng
   competitor at the profile's CPU percent, a tbf limit on its upload.
2. Calibration: the real coordinator runs warm-up rounds with a generous deadline; the
   deadline is derived from the unloaded devices' times (profile [deadline]; the rule is in
   `calibrate_deadline`). The coordinator is then stopped (SIGTERM: a clean checkpoint).
3. Recording: the coordinator resumes from that checkpoint with the calibrated deadline;
   the agents, which never stopped, reconnect. Each (re)start's rounds up to and including
   the first one in which every device received the model are dropped as settling rounds;
   the next R rounds are recorded, plus one more whose update headers carry the devices'
   measured upload time of the last recorded round.
4. The trace set is built from the coordinator's metrics.jsonl and written atomically,
   once, at the end.

Everything in between lives in a work folder (configs, logs, the coordinator's metrics and
checkpoint, state.json); `--resume` continues an interrupted recording from it. An emulated
fleet's token is kept beside it, not in it (flexfl.run_folder.secrets_dir).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import secrets
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from flexfl.proto.channel import TlsFiles

from coordinator.checkpoint import read_registry
from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.metrics import MetricsTail
from coordinator.registry import Registry
from coordinator.rules.round_record import LiveRound, RoundRecord
from edge_agent.config import AgentConfig
from edge_agent.transport import wire_stop_reason
from flexfl import __version__
from flexfl.config import write_config
from flexfl.errors import ConfigError, FlexFLError
from flexfl.files import atomic_file, read_secret
from flexfl.run_folder import secrets_dir
from flexfl.signals import sigterm_as_interrupt
from flexfl.vocabulary import AGENT_REASONS, StopReason
from loadgen.harness import Harness, HarnessError, connect_address
from trace_recorder.format import MANIFEST_NAME, Trace, TraceManifest, utc_now_iso, write_trace_set
from trace_recorder.manifest import SCHEMA_VERSION
from trace_recorder.recording.profiles import DEFAULT_PROFILE, Inventory, Profile, load_inventory, load_profile

if TYPE_CHECKING:
    from loadgen.fleet import EmulatedFleet

log = logging.getLogger(__name__)

STATE_VERSION = 1
COLUMNS = {
    "train_s": "seconds the agent spent on local updates (0 when its update did not arrive, or did not say)",
    "upload_s": "seconds the agent's upload took, as it measured and reported in its next update header "
                "(0 when unknown: that next update did not arrive either)",
    "upload_bytes": "bytes of the update that arrived (0 when none did)",
    "arrived": "1 if the device's update (possibly with s = 0) arrived before the deadline, else 0",
    "stop_reason": "why s is what it is, as fleet.proto's StopReason number (1 complete, 2 compute, 3 upload, "
                   "4 trace, 5 stopped); 0 when the device gave none: no update arrived, or it did not say",
}


class RecordError(FlexFLError):
    """A recording cannot start or go on (the message says why and where to look)."""


@dataclass(frozen=True)
class RecordOptions:
    out: Path
    profile: Path = DEFAULT_PROFILE
    rounds: int | None = None  # overrides the profile's R
    traces: tuple[str, ...] = ()  # record only these traces of the profile
    work: Path | None = None  # default: out/traces-record/<set name>
    secrets: Path | None = None  # an emulated fleet's token goes there; default: beside the work folder
    resume: bool = False
    overwrite: bool = False
    deadline_s: float | None = None  # skip calibration
    inventory: Path | None = None
    prefix: str = "ffrec"
    subnet: str = "10.77.0"
    port: int = 50061
    command: str = ""


@dataclass(frozen=True)
class DeviceRun:
    device_id: str
    trace: str
    shard_index: int
    loadgen: str
    iface: str | None


# ---- fleets --------------------------------------------------------------------------------


class EmulatedBackend:
    """Devices of a fresh emulated fleet; agents started and stopped here."""

    mode = "emulated"

    def __init__(self, profile: Profile, opts: RecordOptions, work: Path) -> None:
        from loadgen.fleet import DeviceSpec, FleetSpec

        e = profile.emulation
        down = [profile.rate_kbit(t) if e.shape_download else None for t in profile.traces]
        self.spec = FleetSpec(devices=tuple(DeviceSpec(cpu_quota=e.cpu_quota, down_kbit=d) for d in down),
                              prefix=opts.prefix, subnet=opts.subnet, cfs_period_us=e.cfs_period_us,
                              stress_ng_method=e.stress_ng_method or None)
        self.profile = profile
        self.work = work
        self.port = opts.port
        self.fleet: EmulatedFleet | None = None
        self.agents: dict[int, str] = {}  # device index -> harness process name
        self.devices: list[DeviceRun] = []
        self.loadgen_auth: Any = None  # CURVE keys the fleet makes for this run

    def start(self) -> None:
        from loadgen.fleet import EmulatedFleet

        self.fleet = fleet = EmulatedFleet.up(self.spec)
        self.loadgen_auth = fleet.loadgen_auth()
        for d in fleet.devices:
            fleet.start_loadgen(d.index, nice=self.profile.emulation.competitor_nice)
        self.devices = [DeviceRun(device_id=t.name, trace=t.name, shard_index=i, loadgen=d.loadgen_endpoint,
                                  iface=d.iface)
                        for i, (t, d) in enumerate(zip(self.profile.traces, fleet.devices))]

    def _up(self) -> EmulatedFleet:
        """The fleet start() brought up (a RecordError before: the backend is used out of order)."""
        if self.fleet is None:
            raise RecordError("the emulated fleet is not up: start() first")
        return self.fleet

    @property
    def coordinator_listen(self) -> str:
        return f"{self._up().coordinator_host}:{self.port}"

    @property
    def server_tls(self) -> dict[str, str]:
        return {}  # the emulated fleet's agents dial in plaintext

    watch_tls: TlsFiles | None = None

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    def start_agents(self, harness: Harness, configs: list[Path], *, timeout_s: float = 300.0) -> None:
        """Start every agent at full speed; as each one joins (Status), cap its device at its quota."""
        for i, path in enumerate(configs):
            self._up().set_cpu_quota(i, None)  # start-up (imports, MNIST shard) is not what we measure
            self.agents[i] = f"agent-{self.devices[i].device_id}"
            harness.start_agent(self.agents[i], path, device=i)
        deadline = time.monotonic() + timeout_s
        waiting = set(self.agents)
        while waiting:
            self.check(harness)
            st = harness.status()
            joined = {d.device_id for d in st.devices if d.connected} if st is not None else set()
            for i in [i for i in waiting if self.devices[i].device_id in joined]:
                waiting.discard(i)
                self._up().set_cpu_quota(i, self.profile.emulation.cpu_quota)
            if time.monotonic() > deadline:
                raise RecordError(f"agents {sorted(waiting)} did not join within {timeout_s:g} s; see {self.work}")
            time.sleep(0.1)

    def check(self, harness: Harness) -> None:
        try:
            for name in self.agents.values():
                harness.check(name)
        except HarnessError as exc:
            raise RecordError(str(exc)) from None

    def facts(self) -> dict[str, Any]:
        f = self._up()
        return {"mode": "emulated", "prefix": f.prefix, "subnet": f"{f.subnet}.0/24",
                "coordinator_address": f.coordinator_host, "cfs_period_us": f.cfs_period_us,
                "cpu_quota": self.profile.emulation.cpu_quota,
                "fleet_cpu_shares": self.spec.cpu_shares or 1024 * len(f.devices),
                "stress_ng_method": self.profile.emulation.stress_ng_method or "default",
                "competitor_nice": self.profile.emulation.competitor_nice,
                "upload_shaping": "tc tbf on each device's veth egress, set by its loadgen daemon",
                "download_shaping": ("tc tbf on the coordinator-side veth egress"
                                     if self.profile.emulation.shape_download else "none"),
                "devices": {d.device_id: {"netns": x.netns, "address": x.address, "iface": x.iface}
                            for d, x in zip(self.devices, f.devices)}}

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.down()  # stops agents, daemons, stress-ng; removes namespaces, links, cgroups
            self.fleet = None


class InventoryBackend:
    """Real hosts: agents and loadgen daemons run as services there; nothing is started here."""

    mode = "inventory"

    def __init__(self, profile: Profile, inventory: Inventory) -> None:
        traces = {t.name for t in profile.traces}
        unknown = [d.trace for d in inventory.devices if d.trace not in traces]
        if unknown:
            raise ConfigError(f"{inventory.path}: traces {unknown} are not in profile {profile.path}")
        self.inventory = inventory
        self.devices = [DeviceRun(device_id=d.device_id, trace=d.trace, shard_index=i, loadgen=d.loadgen,
                                  iface=d.iface or None) for i, d in enumerate(inventory.devices)]
        self.loadgen_auth = None
        if inventory.loadgen_client_key:
            from loadgen.keys import client_auth

            self.loadgen_auth = client_auth(Path(inventory.loadgen_client_key), inventory.loadgen_server_keys())

    def start(self) -> None:
        from loadgen.client import FleetClient

        with FleetClient([d.loadgen for d in self.devices], timeout_s=self.inventory.loadgen_timeout_s,
                         auth=self.loadgen_auth) as c:
            c.ping()

    @property
    def coordinator_listen(self) -> str:
        return self.inventory.coordinator_listen

    @property
    def server_tls(self) -> dict[str, str]:
        return self.inventory.server_tls()

    @property
    def watch_tls(self) -> TlsFiles | None:
        return self.inventory.watch_tls()

    @property
    def n_devices(self) -> int:
        return self.inventory.n_devices or len(self.devices)

    def start_agents(self, harness: Harness, configs: list[Path], *, timeout_s: float = 0.0) -> None:
        pass  # services; the coordinator waits until all of them joined (min_devices)

    def check(self, harness: Harness) -> None:
        pass

    def facts(self) -> dict[str, Any]:
        return {"mode": "inventory", "inventory": self.inventory.path, "download_shaping": "none",
                "upload_shaping": "tc tbf on each host's interface, set by its loadgen daemon"}

    def close(self) -> None:
        pass


# ---- the coordinator process ----------------------------------------------------------------


class CoordinatorProcess:
    """The recording's coordinator, run (and restarted with --resume) through the harness."""

    def __init__(self, harness: Harness, config: Path, *, address: str, token: str,
                 tls: TlsFiles | None = None) -> None:
        self.harness, self.config, self.address, self.token, self.tls = harness, config, address, token, tls

    def start(self, *, resume: bool, deadline_s: float | None = None, timeout_s: float = 180.0) -> None:
        args = ["--deadline-s", repr(deadline_s)] if deadline_s is not None else []
        self.harness.start_coordinator(self.config, address=self.address, token=self.token, resume=resume, args=args,
                                       tls=self.tls)
        try:
            self.harness.wait_ready(timeout_s=timeout_s)
        except HarnessError as exc:
            raise RecordError(str(exc)) from None

    def check(self) -> None:
        try:
            self.harness.check("coordinator")
        except HarnessError as exc:
            raise RecordError(str(exc)) from None

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """SIGTERM (the coordinator then writes its checkpoint) and wait."""
        if "coordinator" in self.harness.procs:
            self.harness.stop(["coordinator"], timeout_s=timeout_s)


# ---- rules ---------------------------------------------------------------------------------------


def calibrate_deadline(rows: list[RoundRecord], *, reference: list[str], E: int, skip_rounds: int,
                       statistic: str, factor: float, margin_s: float) -> tuple[float, dict[str, Any]]:
    """deadline = factor x statistic of the reference (unloaded) devices' delivery-to-arrival
    times + the agents' safety margin.

    Only rounds after `skip_rounds` and updates with all E updates done count. An agent starts
    an update only while the update, its upload and `margin_s` still fit before the deadline
    (edge_agent.deadline), so without the margin a deadline of factor 1 would stop the unloaded
    device short of E whenever the margin is a noticeable part of its time (a fast device:
    50 ms of a 50 ms round left it at s = 0).
    """
    samples = [float(_measured(r).arrived_after_s[d]) for r in rows if r.round > skip_rounds
               for d in reference if d in _measured(r).arrived_after_s and r.s.get(d) == E]
    if not samples:
        raise RecordError(f"no unloaded device ({', '.join(reference)}) completed all {E} updates in the "
                          f"warm-up rounds after round {skip_rounds}; nothing to calibrate the deadline on")
    statistics: dict[str, Callable[[list[float]], float]] = {
        "max": max, "median": lambda x: float(np.median(x)), "p90": lambda x: float(np.percentile(x, 90)),
        "p95": lambda x: float(np.percentile(x, 95))}
    value = statistics[statistic](samples)
    deadline = round(factor * value + margin_s, 3)
    return deadline, {"reference_traces": reference, "samples": len(samples), "statistic": statistic,
                      "statistic_s": round(value, 4), "factor": factor, "agent_margin_s": margin_s,
                      "deadline_s": deadline,
                      "samples_min_s": round(min(samples), 4), "samples_median_s": round(float(np.median(samples)), 4),
                      "samples_max_s": round(max(samples), 4)}


def _measured(r: RoundRecord) -> LiveRound:
    """A recording's row's live part (transfers and times), which every row a coordinator writes has."""
    if r.live is None:
        raise RecordError(f"round {r.round}'s row holds no live measurements: not a row of a live coordinator")
    return r.live


def select_rounds(rows_by_round: dict[int, RoundRecord], *, segments: list[int], ids: list[str],
                  rounds: int) -> list[int]:
    """The recorded round ids: per (re)start segment, the rounds after its first all-delivered one
    that have a successor in the same segment; the first `rounds` of those."""
    kept: list[int] = []
    bounds = [*segments[1:], None]
    for start, end in zip(segments, bounds):
        ids_in = sorted(k for k in rows_by_round if k > start and (end is None or k <= end))
        settled = False
        for k in ids_in:
            if not settled:
                settled = all(d in _measured(rows_by_round[k]).bytes_out for d in ids)
                continue
            if k + 1 in rows_by_round and (end is None or k + 1 <= end):
                kept.append(k)
    return kept[:rounds]


class TracedDevice(Protocol):
    """A device whose rounds become a trace: its id in the rows, and its trace's name (DeviceRun is one)."""

    @property
    def device_id(self) -> str: ...

    @property
    def trace(self) -> str: ...


def build_traces(rows_by_round: dict[int, RoundRecord], kept: list[int], devices: Sequence[TracedDevice],
                 E: int) -> list[Trace]:
    """Per device, its trace over the `kept` rounds of live rows (the columns of COLUMNS, s / E as the fraction).

    A device's upload time of round k is in round k + 1's row (its next update header reports it);
    a kept round without a next row has it unknown (0)."""
    traces = []
    for d in devices:
        frac, train, upload, nbytes, arrived, why = [], [], [], [], [], []
        for k in kept:
            r, live = rows_by_round[k], _measured(rows_by_round[k])
            nxt = _measured(rows_by_round[k + 1]) if k + 1 in rows_by_round else None
            came = d.device_id in live.bytes_in
            frac.append(int(r.s.get(d.device_id, 0)) / E)
            train.append(round(float(live.train_s.get(d.device_id, 0.0)), 4) if came else 0.0)
            nbytes.append(int(live.bytes_in.get(d.device_id, 0)))
            arrived.append(1 if came else 0)
            # The next header reports the upload of the round before it, if the device took part in k.
            up = nxt.previous_upload_s.get(d.device_id) if nxt is not None else None
            upload.append(round(float(up), 4) if up is not None and d.device_id in live.bytes_out else 0.0)
            reason = (r.stop_reason or {}).get(d.device_id)
            why.append(wire_stop_reason(StopReason(reason)) if reason in AGENT_REASONS else 0)
        traces.append(Trace(name=d.trace, round=np.array(kept, dtype=np.int64), fraction=np.array(frac),
                            extra={"train_s": np.array(train), "upload_s": np.array(upload),
                                   "upload_bytes": np.array(nbytes, dtype=np.int64),
                                   "arrived": np.array(arrived, dtype=np.int64),
                                   "stop_reason": np.array(why, dtype=np.int64)}))
    return traces


# ---- a fleet's configs and loads (the recording's, and any run on its fleet: trace_recorder.fidelity.experiment) ----


def fleet_token(private: Path) -> Path:
    """The fleet token file of an emulated fleet's run, in the run's private folder `private` (made once, kept
    for --resume): never in the work folder, whose files are copied and shared."""
    token = private / "fleet_token"
    if not token.exists():
        with atomic_file(token, perms=0o600) as f:
            f.write(secrets.token_hex(16))
    return token


def read_fleet_token(path: Path) -> str:
    """The token in `path`; a missing file says how to get one."""
    return read_secret(path, what="fleet token", if_missing=f"`flexfl token --out {path}` makes one (a fleet whose "
                       "agents already run needs the token they were given: copy it here)")


def write_fleet_configs(profile: Profile, backend: Any, work: Path, *, token_file: Path, rounds: int,
                        deadline_s: float, header: str) -> tuple[Path, list[Path]]:
    """The coordinator's and each device's agent config for a run of `profile` (partition, rules, seed) on
    `backend`'s devices; agents follow no trace (deadline mode: their conditions decide s)."""
    partition = replace(profile.partition, n_devices=backend.n_devices)
    coordinator = CoordinatorConfig(
        server=ServerConfig(listen=backend.coordinator_listen, fleet_token_file=str(token_file), pull_wait_s=1.0,
                            **backend.server_tls),
        partition=partition, rules=profile.rules,
        run=RunConfig(rounds=rounds, deadline_s=deadline_s, min_devices=len(backend.devices), start_grace_s=3.0,
                      seed=profile.seed),
        output=OutputConfig(dir=str(work / "coordinator")))
    coord = write_config(work / "coordinator.toml", coordinator, header=header)
    agents = []
    for d in backend.devices:
        agent = AgentConfig(coordinator=backend.coordinator_listen, device_id=d.device_id, shard_index=d.shard_index,
                            fleet_token_file=str(token_file), announce_departure=False, pull_wait_s=1.0,
                            backoff_max_s=4.0, partition=partition)
        agents.append(write_config(work / f"agent-{d.device_id}.toml", agent, header=header))
    return coord, agents


def apply_loads(profile: Profile, backend: Any) -> None:
    """Set every device's load through its loadgen daemon: the stress-ng competitor at its trace's CPU percent,
    a tbf upload limit where its trace names a bandwidth."""
    from loadgen.client import FleetClient, bandwidth_message

    conditions = {t.name: t for t in profile.traces}
    messages = {}
    for d in backend.devices:
        messages[d.loadgen] = {"cmd": "set_cpu", "percent": conditions[d.trace].cpu_load_pct}
    with FleetClient([d.loadgen for d in backend.devices], timeout_s=10, auth=backend.loadgen_auth) as fleet:
        fleet.call_each(messages)
        rates = {d.loadgen: (profile.rate_kbit(conditions[d.trace]), d.iface) for d in backend.devices}
        shaped = {loadgen: bandwidth_message(rate, iface=iface) for loadgen, (rate, iface) in rates.items()
                  if rate is not None}
        if shaped:
            fleet.call_each(shaped)
    log.info("loads set: %s", ", ".join(f"{d.trace}: cpu {conditions[d.trace].cpu_load_pct:g}%"
                                         + (f", up {profile.rate_kbit(conditions[d.trace])} kbit/s"
                                            if conditions[d.trace].bandwidth else "") for d in backend.devices))


def sample_cpu(backend: Any) -> tuple[dict[str, float], dict[str, dict]]:
    """Each trace's competitor CPU percent as its daemon measured it now (where it did), and the daemons' replies."""
    from loadgen.client import FleetClient

    with FleetClient([d.loadgen for d in backend.devices], timeout_s=5, auth=backend.loadgen_auth) as fleet:
        replies = fleet.broadcast({"cmd": "status"})
    achieved = {}
    for d in backend.devices:
        measured = (replies.get(d.loadgen, {}).get("cpu") or {}).get("measured")
        if measured and measured.get("achieved_percent") is not None:
            achieved[d.trace] = float(measured["achieved_percent"])
    return achieved, replies


def clear_loads(backend: Any) -> None:
    """Stop every competitor and remove every limit the daemons set (a failure is logged: cleanup goes on)."""
    from loadgen.client import FleetClient

    try:
        with FleetClient([d.loadgen for d in backend.devices], timeout_s=5, auth=backend.loadgen_auth) as fleet:
            fleet.broadcast({"cmd": "clear"})
    except FlexFLError as exc:
        log.warning("clearing the loads failed: %s", exc)


# ---- the recording -------------------------------------------------------------------------------


class Recording:
    def __init__(self, opts: RecordOptions) -> None:
        profile = load_profile(opts.profile)
        if opts.traces:
            profile = profile.select(opts.traces)
        if opts.rounds is not None:
            if opts.rounds < 1:
                raise ConfigError(f"--rounds must be >= 1, got {opts.rounds}")
            profile = replace(profile, rounds=opts.rounds)
        self.opts = opts
        self.inventory = load_inventory(opts.inventory) if opts.inventory else None
        if self.inventory is not None:
            profile = profile.select([d.trace for d in self.inventory.devices])
        self.profile = profile
        self.name = opts.out.name
        self.work = Path(opts.work or Path("out") / "traces-record" / self.name).resolve()
        self.state_path = self.work / "state.json"
        self.metrics_path = self.work / "coordinator" / "metrics.jsonl"
        self.state: dict[str, Any] = {}
        self._metrics = MetricsTail(self.metrics_path)
        self.cpu_readings: dict[str, list[float]] = {}
        self.E = profile.rules.required_updates

    # ---- state ---------------------------------------------------------------------------

    def _load_state(self) -> None:
        if (self.opts.out / MANIFEST_NAME).exists() and not self.opts.overwrite:
            raise ConfigError(f"{self.opts.out} already holds a trace set; pick another --out or pass --overwrite")
        if self.state_path.exists() and not self.opts.resume:
            if json.loads(self.state_path.read_text()).get("phase") != "done":
                raise ConfigError(f"{self.work} holds an unfinished recording; --resume continues it, "
                                  "or remove the folder to start over")
            log.info("%s holds a finished recording; starting a new one there", self.work)
            shutil.rmtree(self.work)
        if self.opts.resume:
            if not self.state_path.exists():
                raise ConfigError(f"--resume: no recording to continue in {self.work}")
            self.state = json.loads(self.state_path.read_text())
            if self.state.get("version") != STATE_VERSION or self.state.get("profile") != self.profile.to_dict():
                raise ConfigError(f"--resume: {self.work} was recorded with another profile or recorder version")
            return
        self.work.mkdir(parents=True, exist_ok=True)
        self.state = {"version": STATE_VERSION, "profile": self.profile.to_dict(), "phase": "calibrating",
                      "started": utc_now_iso(), "elapsed_s": 0.0, "segments": []}
        self._save_state()

    def _save_state(self) -> None:
        with atomic_file(self.state_path) as f:
            json.dump(self.state, f, indent=1)

    def _rows(self) -> dict[int, RoundRecord]:
        """The coordinator's rows by round (the last one of a round wins); reads only what is new."""
        return {row.round: row for row in self._metrics.rows()}

    def _forget_metrics(self) -> None:
        for stale in (self.metrics_path, self.metrics_path.parent / "checkpoint.pt"):
            stale.unlink(missing_ok=True)
        self._metrics = MetricsTail(self.metrics_path)

    # ---- configs -------------------------------------------------------------------------

    def _write_configs(self, backend: Any) -> tuple[Path, list[Path], str]:
        """Coordinator and agent configs (dumped from the dataclasses); returns them and the fleet token."""
        token = Path(self.inventory.fleet_token_file) if self.inventory is not None else \
            fleet_token(self.opts.secrets or secrets_dir(self.work))
        coord, agents = write_fleet_configs(self.profile, backend, self.work, token_file=token, rounds=1_000_000,
                                            deadline_s=self.profile.deadline.warmup_deadline_s,
                                            header="written by flexfl traces record")
        return coord, agents, read_fleet_token(token)

    # ---- loads ---------------------------------------------------------------------------

    def _apply_loads(self, backend: Any) -> None:
        apply_loads(self.profile, backend)

    def _sample_cpu(self, backend: Any) -> dict[str, dict]:
        achieved, replies = sample_cpu(backend)
        for trace, pct in achieved.items():
            self.cpu_readings.setdefault(trace, []).append(pct)
        return replies

    def _clear_loads(self, backend: Any) -> None:
        clear_loads(backend)

    # ---- phases --------------------------------------------------------------------------

    def _calibrate(self, backend: Any, coordinator: CoordinatorProcess, agents: list[Path], harness: Harness) -> None:
        rule = self.profile.deadline
        self._forget_metrics()  # an interrupted calibration starts over
        print(f"calibration: {rule.warmup_rounds} warm-up rounds with a {rule.warmup_deadline_s:g} s deadline",
              flush=True)
        coordinator.start(resume=False)
        if self.inventory is not None:
            self._apply_loads(backend)
        backend.start_agents(harness, agents)
        if self.inventory is None:
            self._apply_loads(backend)
        while len(self._rows()) < rule.warmup_rounds:
            coordinator.check()
            backend.check(harness)
            time.sleep(0.2)
        coordinator.stop()
        rows = sorted(self._rows().values(), key=lambda r: r.round)
        reference = [t.name for t in self.profile.traces if t.unloaded]
        ids = {d.trace: d.device_id for d in backend.devices}
        if self.opts.deadline_s is not None:
            deadline, details = self.opts.deadline_s, {"deadline_s": self.opts.deadline_s, "given": "--deadline-s"}
        else:
            if not reference:
                raise RecordError("the profile has no unloaded trace (cpu 0 %, unshaped) to calibrate the "
                                  "deadline on; add one or pass --deadline-s")
            # The emulated fleet's agents are written with the default margin (_write_configs);
            # an inventory's agents are assumed to keep it.
            deadline, details = calibrate_deadline(rows, reference=[ids[t] for t in reference], E=self.E,
                                                   skip_rounds=rule.skip_rounds, statistic=rule.statistic,
                                                   factor=rule.factor, margin_s=AgentConfig.safety_margin_s)
        details["warmup_rounds"] = len(rows)
        self.state.update(phase="recording", deadline_s=deadline, calibration=details)
        self._save_state()
        print(f"calibration: deadline {deadline:g} s ({json.dumps(details)})", flush=True)

    def _record(self, backend: Any, coordinator: CoordinatorProcess, agents: list[Path], harness: Harness, *,
                fresh_agents: bool) -> None:
        R = self.profile.rounds
        deadline = self.state["deadline_s"]
        self.state["segments"].append(max(self._rows(), default=0))
        self._save_state()
        coordinator.start(resume=True, deadline_s=deadline)
        if fresh_agents:
            backend.start_agents(harness, agents)
            self._apply_loads(backend)
        ids = [d.device_id for d in backend.devices]
        started, shown, last_sample = time.monotonic(), 0, 0.0
        print(f"recording: {R} rounds, deadline {deadline:g} s, E = {self.E}", flush=True)
        while True:
            coordinator.check()
            backend.check(harness)
            rows = self._rows()
            kept = select_rounds(rows, segments=self.state["segments"], ids=ids, rounds=R)
            for k in kept[shown:]:
                r = rows[k]
                rate = (time.monotonic() - started) / max(1, len(kept))
                print(f"round {k:>4} ({len(kept):>3}/{R}, ETA {int(rate * (R - len(kept)))} s): "
                      + " ".join(f"{d.trace} {r.s.get(d.device_id, 0) / self.E:.2f}" for d in backend.devices),
                      flush=True)
            shown = len(kept)
            if len(kept) >= R:
                break
            if time.monotonic() - last_sample > 10:
                self._sample_cpu(backend)
                last_sample = time.monotonic()
            time.sleep(0.2)
        coordinator.stop()
        self.state.update(phase="done", cpu_achieved=self.cpu_readings)
        self._save_state()

    # ---- the whole run -------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        if self.inventory is None:
            from loadgen.fleet import require_root

            require_root("flexfl traces record without --inventory (it builds an emulated fleet)")
        self._load_state()
        t0 = time.monotonic()
        backend: Any = None
        host_replies: dict[str, dict] = {}
        if self.state["phase"] != "done":
            backend = (InventoryBackend(self.profile, self.inventory) if self.inventory is not None
                       else EmulatedBackend(self.profile, self.opts, self.work))
            harness = None
            try:
                backend.start()
                coord_cfg, agent_cfgs, token = self._write_configs(backend)
                harness = Harness(self.work, fleet=getattr(backend, "fleet", None), env=dict(os.environ))
                coordinator = CoordinatorProcess(harness, coord_cfg,
                                                 address=connect_address(backend.coordinator_listen), token=token,
                                                 tls=backend.watch_tls)
                try:
                    fresh = True
                    if self.state["phase"] == "calibrating":
                        self._calibrate(backend, coordinator, agent_cfgs, harness)
                        fresh = False
                    else:
                        self.cpu_readings = self.state.get("cpu_achieved", {})
                    self._record(backend, coordinator, agent_cfgs, harness, fresh_agents=fresh)
                    host_replies = self._sample_cpu(backend)
                finally:
                    coordinator.stop()
                    self._clear_loads(backend)
                self.state["facts"] = {"fleet": backend.facts(), "loadgen_hosts": {
                    d.device_id: (host_replies.get(d.loadgen) or {}).get("host") for d in backend.devices}}
                self.state["devices"] = [d.__dict__ for d in backend.devices]
            finally:
                self.state["elapsed_s"] = self.state.get("elapsed_s", 0.0) + time.monotonic() - t0
                self._save_state()
                if harness is not None:
                    harness.close()
                backend.close()
        return self._write_set()

    def _write_set(self) -> dict[str, Any]:
        devices = [DeviceRun(**d) for d in self.state["devices"]]
        rows = self._rows()
        kept = select_rounds(rows, segments=self.state["segments"], ids=[d.device_id for d in devices],
                             rounds=self.profile.rounds)
        if len(kept) < self.profile.rounds:
            raise RecordError(f"only {len(kept)} of {self.profile.rounds} rounds are recorded in {self.metrics_path}")
        traces = build_traces(rows, kept, devices, self.E)
        manifest = self._manifest(traces, devices, kept)
        write_trace_set(self.opts.out, manifest, traces)
        return {"traces": traces, "manifest": manifest, "elapsed_s": self.state["elapsed_s"]}

    def _manifest(self, traces: list[Trace], devices: list[DeviceRun], kept: list[int]) -> TraceManifest:
        from loadgen.hostinfo import host_facts

        p = self.profile
        conditions = {}
        for t in p.traces:
            cond = p.condition(t)
            if self.state["facts"]["fleet"]["mode"] == "emulated":
                cond["cpu_quota"] = p.emulation.cpu_quota
            readings = self.state.get("cpu_achieved", {}).get(t.name)
            if t.cpu_load_pct and readings:
                cond["cpu_load_achieved_pct"] = round(float(np.mean(readings)), 1)
            conditions[t.name] = cond
        try:
            registry = read_registry(self.work / "coordinator" / "checkpoint.pt")
        except FlexFLError as exc:  # a missing or unreadable checkpoint only costs the hardware facts
            log.warning("cannot read device facts: %s", exc)
            registry = Registry()
        hosts: list[dict] = [{"role": "coordinator", **host_facts()}]
        for d in devices:
            rec = registry.get(d.device_id)
            hosts.append({"role": "device", "device_id": d.device_id, "trace": d.trace,
                          "hardware": rec.hardware if rec else {}, "agent_version": rec.agent_version if rec else None,
                          "loadgen_host": self.state["facts"]["loadgen_hosts"].get(d.device_id)})
        fleet = self.state["facts"]["fleet"]
        where = ("an emulated fleet on one x86 machine (a network namespace, tc tbf upload limit and cgroup "
                 "CPU quota per device), NOT on Raspberry Pis") if fleet["mode"] == "emulated" \
            else "real hosts from an inventory"
        description = (f"Recorded with `flexfl traces record` on {where}. Per round, the fraction of the E = {self.E} "
                       f"required local updates that arrived before a {self.state['deadline_s']:g} s deadline, "
                       f"running {str(p.partition.dataset).upper()} FedAvg through the real coordinator and agents. "
                       f"Conditions: {', '.join(f'{t.name} ' + condition_text(t, p) for t in p.traces)}.")
        source = {
            "recorder": "trace_recorder.recording.recorder", "command": self.opts.command, "profile": p.to_dict(),
            "fleet": fleet, "calibration": self.state.get("calibration"),
            "rounds": {"recorded": len(kept), "first": kept[0], "last": kept[-1],
                       "segments_after_round": self.state["segments"],
                       "rule": "per coordinator (re)start, rounds up to and including the first in which every "
                               "device received the model are settling rounds and dropped"},
            "model": {"dataset": str(p.partition.dataset), "architecture": "mlp 784-200-200-10"
                      if p.partition.dataset == "mnist" else str(p.partition.dataset),
                      "batch_size": p.rules.batch_size_for(p.partition.dataset), "unit": str(p.rules.unit),
                      "update_bytes": int(max(int(t.extra["upload_bytes"].max()) for t in traces))},
            "columns": COLUMNS, "software": _software(), "started": self.state["started"],
            "duration_s": round(self.state["elapsed_s"], 1),
        }
        return TraceManifest(schema_version=SCHEMA_VERSION, name=self.name, kind="recorded", description=description,
                             source=source, required_updates=self.E, deadline_s=float(self.state["deadline_s"]),
                             traces=tuple(t.name for t in traces), conditions=conditions, hosts=tuple(hosts),
                             created=utc_now_iso())


def condition_text(t: Any, p: Profile) -> str:
    if t.bandwidth:
        return f"upload {t.bandwidth} ({p.rate_kbit(t)} kbit/s)"
    return f"CPU competitor {t.cpu_load_pct:g} %"


def _software() -> dict[str, str]:
    import grpc
    import torch

    from loadgen.fleet import tool_versions

    return {"flexfl": __version__, "python": platform.python_version(), "numpy": np.__version__,
            "torch": torch.__version__, "grpcio": grpc.__version__, "kernel": platform.release(), **tool_versions()}


def record(opts: RecordOptions) -> dict[str, Any]:
    """Record a trace set (see the module docstring); SIGTERM is handled like Ctrl-C, so the fleet is removed."""
    with sigterm_as_interrupt():
        return Recording(opts).run()


def default_command(argv: list[str]) -> str:
    return shlex.join(["flexfl", "traces", "record", *argv])

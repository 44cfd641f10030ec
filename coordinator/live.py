"""`flexfl live`: a real coordinator and N real agent processes on this machine.

Loopback by default. One device arrives late (fast-reboot) and one announces its
departure, so a run shows both policies at work. Each agent may follow a participation
trace that caps its s per round (the paper's traces by default), so Scheme C has
incomplete work to rescale even on a fast machine.

With `emulate` (root) every agent runs inside an emulated device of loadgen.fleet: its own
network namespace reaching the coordinator over a veth link, a tbf limit on its upload and
a cgroup CPU quota. Agents start at full speed and get their quota once they have joined
(start-up is not what the run is about). The fleet is removed on exit, Ctrl-C, SIGTERM and
errors.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from coordinator.metrics import read_metrics
from flexfl.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveConfig:
    devices: int = 5
    dataset: str = "synthetic"
    iid: bool = False
    rounds: int = 30
    required_updates: int = 20
    deadline_s: float = 2.0
    scheme: str = "C"
    departure_policy: str = "exclude"
    arrive_after: int = 10  # the late device starts once this many rounds completed (0: none)
    depart_after: int = 20  # one device announces departure after this many rounds (0: none)
    trace_set: str = ""  # folder; agents cycle through its first `num_traces` traces ("" = none)
    num_traces: int = 5
    eta0: float = 0.0
    update_s: float = 0.05  # each local update takes at least this long (edge-device speed); 0: this machine's
    total_samples: int = 0
    sizes: str = "equal"  # equal shards, as in the paper's arrival experiments
    seed: int = 0
    out: str = "out/live"
    host: str = "127.0.0.1"
    emulate: bool = False  # agents in an emulated fleet (root): netns + tbf + cgroup quota each
    emulate_cpu: float = 0.25  # CPUs per emulated device; 0 = no quota
    emulate_up_kbit: tuple[int, ...] = ()  # upload limit per device, cycled; 0 = unshaped
    emulate_prefix: str = "fflive"
    emulate_subnet: str = "10.77.1"

    def validate(self) -> LiveConfig:
        if self.devices < 2:
            raise ConfigError("--devices must be >= 2 (one arrives late)")
        if self.depart_after and self.arrive_after and self.devices < 3:
            raise ConfigError("--devices must be >= 3 to have both an arrival and a departure")
        for name in ("arrive_after", "depart_after"):
            v = getattr(self, name)
            if not 0 <= v < self.rounds:
                raise ConfigError(f"--{name.replace('_', '-')} must be in 0..rounds-1, got {v}")
        if self.emulate_cpu < 0 or any(k < 0 for k in self.emulate_up_kbit):
            raise ConfigError("--emulate-cpu and --emulate-up-kbit must be >= 0")
        return self

    def device_spec(self, i: int):
        """Device i's emulated budget."""
        from loadgen.fleet import DeviceSpec

        up = self.emulate_up_kbit[i % len(self.emulate_up_kbit)] if self.emulate_up_kbit else 0
        return DeviceSpec(cpu_quota=self.emulate_cpu or None, up_kbit=up or None)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def write_configs(cfg: LiveConfig, out: Path, port: int, *, host: str | None = None) -> tuple[Path, list[Path]]:
    """Coordinator and agent TOML files for this run (also a record of what ran)."""
    host = host or cfg.host
    out.mkdir(parents=True, exist_ok=True)
    token = out / "fleet_token"
    token.write_text(secrets.token_hex(16))
    token.chmod(0o600)
    n_initial = cfg.devices - (1 if cfg.arrive_after else 0)
    coord = out / "coordinator.toml"
    # The seeded partition: coordinator and agents must describe it identically.
    partition = (f'dataset = "{cfg.dataset}"\niid = {str(cfg.iid).lower()}\nn_devices = {cfg.devices}\n'
                 f'data_seed = {cfg.seed}\ntotal_samples = {cfg.total_samples}\nsizes = "{cfg.sizes}"\n')
    coord.write_text(f"""# written by flexfl live
[server]
listen = "{host}:{port}"
fleet_token_file = "fleet_token"
pull_wait_s = 1.0

[training]
{partition}rounds = {cfg.rounds}
required_updates = {cfg.required_updates}
deadline_s = {cfg.deadline_s}
scheme = "{cfg.scheme}"
departure_policy = "{cfg.departure_policy}"
min_devices = {n_initial}
start_grace_s = 0.5
eta0 = {cfg.eta0}
seed = {cfg.seed}

[output]
dir = "coordinator"
""")
    traces = []
    if cfg.trace_set:
        from trace_recorder.format import read_trace_set

        traces = [t.name for t in read_trace_set(Path(cfg.trace_set)).first(cfg.num_traces)]
    agents = []
    for i in range(cfg.devices):
        trace = f'{Path(cfg.trace_set).resolve()}:{traces[i % len(traces)]}' if traces else ""
        path = out / f"agent-{i}.toml"
        path.write_text(f"""# written by flexfl live
coordinator = "{host}:{port}"
device_id = "dev-{i}"
fleet_token_file = "fleet_token"
announce_departure = true
pull_wait_s = 1.0

[data]
{partition}shard_index = {i}

[participation]
trace = "{trace}"
min_update_s = {cfg.update_s}
""")
        agents.append(path)
    return coord, agents


class LiveRun:
    """Starts and supervises the processes; always stops them on exit."""

    def __init__(self, cfg: LiveConfig) -> None:
        self.cfg = cfg.validate()
        self.out = Path(cfg.out)
        self.procs: dict[str, subprocess.Popen] = {}
        self.fleet = None  # loadgen.fleet.EmulatedFleet when emulating
        self._unquoted: dict[int, int] = {}  # emulated device -> agent log offset, until it has joined
        env = dict(os.environ)
        # Many processes share a few cores: one compute thread each avoids oversubscription.
        env.setdefault("OMP_NUM_THREADS", "1")
        self.env = env

    def _spawn(self, name: str, args: list[str], *, device: int | None = None) -> subprocess.Popen:
        argv = [sys.executable, "-m", "flexfl.cli", *args]
        log_path = self.out / f"{name}.log"
        if device is not None and self.fleet is not None:
            # Full speed until it has joined (see _apply_quotas); then its quota.
            self.fleet.set_cpu_quota(device, None)
            self._unquoted[device] = log_path.stat().st_size if log_path.exists() else 0
            proc = self.fleet.spawn(device, argv, role="agent", log_path=log_path, env=self.env)
        else:
            with open(log_path, "w") as log_file:
                proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=self.env)
        self.procs[name] = proc
        return proc

    def _apply_quotas(self) -> None:
        for i, offset in list(self._unquoted.items()):
            if b"joined as index" in (self.out / f"agent-{i}.log").read_bytes()[offset:]:
                self.fleet.set_cpu_quota(i, self.fleet.devices[i].spec.cpu_quota)
                del self._unquoted[i]

    def _start_fleet(self) -> str:
        """Bring up the emulated fleet; return the coordinator's address on it."""
        from loadgen.fleet import EmulatedFleet, FleetSpec, require_root

        cfg = self.cfg
        require_root("flexfl live --emulate")
        spec = FleetSpec(devices=tuple(cfg.device_spec(i) for i in range(cfg.devices)), prefix=cfg.emulate_prefix,
                         subnet=cfg.emulate_subnet)
        self.fleet = EmulatedFleet.up(spec)
        for d in self.fleet.devices:
            print(f"  device {d.index}: netns {d.netns}, {d.address}, upload "
                  f"{f'{d.spec.up_kbit} kbit/s' if d.spec.up_kbit else 'unshaped'}, "
                  f"{f'{d.spec.cpu_quota:g} CPU' if d.spec.cpu_quota else 'no CPU quota'}", flush=True)
        return self.fleet.coordinator_host

    def run(self) -> dict:
        """Run the whole live experiment; SIGTERM is handled like Ctrl-C so everything is stopped."""
        def on_sigterm(signum: int, _frame: object) -> None:
            raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            return self._run()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _run(self) -> dict:
        cfg = self.cfg
        metrics = self.out / "coordinator" / "metrics.jsonl"
        started = time.monotonic()
        try:
            host = self._start_fleet() if cfg.emulate else cfg.host
            port = _free_port(host)
            coord_cfg, agent_cfgs = write_configs(cfg, self.out, port, host=host)
            metrics.unlink(missing_ok=True)
            self._spawn("coordinator", ["coordinator", "--config", str(coord_cfg)])
            late = cfg.devices - 1 if cfg.arrive_after else None
            leaver = 0 if cfg.depart_after else None
            for i, path in enumerate(agent_cfgs):
                if i != late:
                    self._spawn(f"agent-{i}", ["agent", "--config", str(path)], device=i)
            printed = 0
            events = {"arrival": None, "departure": None}
            while self.procs["coordinator"].poll() is None:
                rows = read_metrics(metrics) if metrics.exists() else []
                for row in rows[printed:]:
                    print(_round_line(row, cfg), flush=True)
                printed = len(rows)
                done = rows[-1]["round"] if rows else 0
                if late is not None and events["arrival"] is None and done >= cfg.arrive_after:
                    self._spawn(f"agent-{late}", ["agent", "--config", str(agent_cfgs[late])], device=late)
                    events["arrival"] = done
                if leaver is not None and events["departure"] is None and done >= cfg.depart_after:
                    self.procs[f"agent-{leaver}"].send_signal(signal.SIGTERM)
                    events["departure"] = done
                for name, p in self.procs.items():
                    if name != "coordinator" and p.poll() not in (None, 0):
                        raise ConfigError(f"{name} exited with code {p.returncode}; see {self.out / (name + '.log')}")
                if self._unquoted:
                    self._apply_quotas()
                time.sleep(0.1)
            if self.procs["coordinator"].returncode != 0:
                raise ConfigError(f"coordinator exited with code {self.procs['coordinator'].returncode}; "
                                  f"see {self.out / 'coordinator.log'}")
            rows = read_metrics(metrics)
            for row in rows[printed:]:
                print(_round_line(row, cfg), flush=True)
        finally:
            self._stop_all()
        summary = summarize(rows, cfg, wall_s=time.monotonic() - started)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1))
        plot_live(rows, self.out / "accuracy.png", cfg)
        return summary

    def _stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.fleet is not None:
            self.fleet.down()  # also whatever the agents left in their devices
            self.fleet = None


def _round_line(row: dict, cfg: LiveConfig) -> str:
    s = " ".join(f"{d}:{v}" for d, v in sorted(row["s"].items()))
    extra = []
    if row["arrivals"]:
        extra.append("arrival: " + ",".join(row["arrivals"]))
    if row["departures"]:
        extra.append(f"departure ({cfg.departure_policy}): " + ",".join(row["departures"]))
    boosted = [d for d, p in row["p"].items() if d in row["s"] and row["p"][d] > 0 and d == f"dev-{cfg.devices - 1}"]
    if boosted and cfg.arrive_after and row["round"] > cfg.arrive_after:
        extra.append(f"p(dev-{cfg.devices - 1})={row['p'][boosted[0]]:.3f}")
    return (f"round {row['round']:>3}  acc {100 * row['test_acc']:6.2f}%  loss {row['test_loss']:.3f}  "
            f"lr {row['lr']:.4g}  s (E={cfg.required_updates}) {s}  {'  '.join(extra)}")


def summarize(rows: list[dict], cfg: LiveConfig, *, wall_s: float) -> dict:
    if not rows:
        raise ConfigError("the coordinator completed no round")
    arrival = next((r["round"] for r in rows if r["arrivals"]), None)
    departure = next((r["round"] for r in rows if r["departures"]), None)
    return {
        "rounds": len(rows), "final_acc": rows[-1]["test_acc"], "final_loss": rows[-1]["test_loss"],
        "best_acc": max(r["test_acc"] for r in rows), "arrival_round": arrival, "departure_round": departure,
        "inactive_device_rounds": sum(v == 0 for r in rows for d, v in r["s"].items() if d in r["participants"]),
        "wall_s": wall_s, "scheme": cfg.scheme, "departure_policy": cfg.departure_policy,
    }


def plot_live(rows: list[dict], path: Path, cfg: LiveConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([r["round"] for r in rows], [100 * r["test_acc"] for r in rows], color="tab:green", label=f"Scheme {cfg.scheme}")
    for r in rows:
        if r["arrivals"]:
            # Evaluated from this round on with the newcomer's holdout; it trains from the next.
            ax.axvline(r["round"], color="tab:blue", ls="--", lw=1, label="arrival (fast-reboot from next round)")
        if r["departures"]:
            ax.axvline(r["round"], color="tab:red", ls=":", lw=1.2, label=f"departure ({cfg.departure_policy})")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    where = "an emulated fleet" if cfg.emulate else cfg.host
    ax.set_title(f"Live run: {cfg.dataset.upper()}, {cfg.devices} devices on {where}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

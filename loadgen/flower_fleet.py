"""Flower's Deployment Engine as processes: a SuperLink and SuperNodes started, awaited, run against and stopped.

The Flower counterpart of loadgen.harness (which runs FlexFL's coordinator and agents), for tests and
benchmarks that compare the two on one fleet:

- the SuperLink: `flower-superlink --insecure --host H --port P`, its one HTTP API (Fleet, Control
  and Runtime); ready when its /health answers 200. It runs its ServerApps in this environment
  (`--disable-runtime-dependency-installation`: no per-run `uv sync`, no network).
- each SuperNode: `flower-supernode --insecure --superlink ADDRESS --node-config '...' --port Q`
  (Q: its own Runtime API, a free port). A node may run inside a cgroup (NodeSpec.cgroup, e.g. a
  loadgen.cgroup.CpuQuotaGroup or an emulated device's) and a network namespace (NodeSpec.netns:
  an emulated device's, entered as loadgen.fleet enters it, without remounting /sys), and behind a
  command prefix (NodeSpec.prefix, e.g. `ip netns exec NS` or `nice -n 5`); everything it starts,
  its ClientApp processes too, is in its cgroup.
- `run(app)`: `flwr run APP local-deployment --stream` with a Flower configuration of the fleet's own
  (FLWR_HOME in the fleet's folder names the connection), so nothing in ~/.flwr is read or changed;
  each process has its FLWR_HOME there too (its installed apps), as separate machines would.

Every process is started through loadgen.device_exec, which enters the cgroup and namespace and
arms PR_SET_PDEATHSIG (SIGTERM when this process dies) before it execs Flower's command, in a
process group of its own. close() stops the SuperNodes, then the SuperLink: SIGTERM to each group,
SIGKILL after a grace period, then whatever they started that is still alive (Flower starts its
SuperExec and app processes in sessions of their own); `leftovers()` says what would still be there.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from flexfl.config import write_toml
from flexfl.errors import FlexFLError
from loadgen.cgroup import terminate
from loadgen.harness import free_port, stop_in_waves

log = logging.getLogger(__name__)

CONNECTION = "local-deployment"  # the name `flwr run APP CONNECTION` finds in the fleet's Flower configuration
# Flower's CLI checks PyPI for a newer flwr at each call and its processes send telemetry: neither is wanted
# in a test or a benchmark (and both wait on the network where there is none).
QUIET_ENV = {"FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0"}
_KEY = re.compile(r"[A-Za-z0-9_.-]+")

NodeValue = str | int | float | bool


class FlowerFleetError(FlexFLError):
    """A Flower process failed to start, exited, or did not become ready in time (the message names it and its log)."""


@dataclass(frozen=True)
class NodeSpec:
    """One SuperNode: its node config (context.node_config of its ClientApps) and where it runs."""

    node_config: Mapping[str, NodeValue] = field(default_factory=dict)
    cgroup: Path | None = None  # a cgroup (v1 cpu) folder it runs in: loadgen.cgroup.CpuQuotaGroup.path, a device's
    netns: str | None = None  # a network namespace it runs in (/run/netns/NAME: an emulated device's)
    prefix: tuple[str, ...] = ()  # a command its command runs under, e.g. ("ip", "netns", "exec", "NS")
    superlink: str | None = None  # the SuperLink's address as this node reaches it (None: the fleet's own address)


@dataclass
class FlowerProcess:
    name: str
    proc: subprocess.Popen
    log_path: Path
    descendants: set[int] = field(default_factory=set)  # pids it started, as last seen


@dataclass(frozen=True)
class FlowerRun:
    """What `flwr run --stream` printed (the run's log) and the run's id and status as the SuperLink lists them."""

    run_id: int
    status: str  # e.g. "finished:completed", "finished:failed"
    output: str


def node_config_arg(config: Mapping[str, NodeValue]) -> str:
    """The --node-config argument for `config`: space-separated KEY=VALUE with TOML values ('a=1 b="x"').

    Flower splits the argument at spaces outside quotes and reads each value as TOML, so a string may
    hold neither a quote nor a backslash; a key is letters, digits and `_.-`."""
    parts = []
    for key, value in config.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"node config key {key!r}: use letters, digits and _.- only")
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = repr(value)
        elif isinstance(value, str) and not set(value) & {'"', "'", "\\", "\n"}:
            text = json.dumps(value)
        else:
            raise ValueError(f"node config {key}: {value!r} is not an int, float, bool or a string without quotes")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def launch_argv(command: Sequence[str], *, spec: NodeSpec | None = None, die_with: int) -> list[str]:
    """The argv that starts `command` where `spec` says (cgroup, netns, prefix), dying with process `die_with`."""
    spec = spec or NodeSpec()
    enter = [*(["--cgroup", str(spec.cgroup)] if spec.cgroup else []), *(["--netns", spec.netns] if spec.netns else [])]
    return [sys.executable, "-m", "loadgen.device_exec", *enter, "--die-with", str(die_with), "--",
            *spec.prefix, *command]


class FlowerFleet:
    """A SuperLink and its SuperNodes, run from folder `out` (logs, the processes' FLWR_HOMEs); close() stops all."""

    def __init__(self, out: Path, *, host: str = "127.0.0.1", env: Mapping[str, str] | None = None,
                 bin_dir: Path | None = None, task_poll_interval_s: float | None = None) -> None:
        """`task_poll_interval_s`: how often each SuperExec asks for a new task (an app process to start): Flower's
        default is 1 s, which each round's start waits for on average half of, on every node."""
        self.out = Path(out).absolute()  # the processes run in it (cwd) and name files under it
        self.out.mkdir(parents=True, exist_ok=True)
        self.host = host
        # Flower's commands beside this interpreter (a venv's bin/), where Flower installs them.
        self.bin_dir = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        self.env = {**(os.environ if env is None else env), **QUIET_ENV}
        self.env.setdefault("OMP_NUM_THREADS", "1")  # many processes share a few cores (as loadgen.harness)
        self.env["PATH"] = f"{self.bin_dir}{os.pathsep}{self.env.get('PATH', '')}"  # SuperExec by name
        if task_poll_interval_s is not None:
            self.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(task_poll_interval_s)
        self.procs: dict[str, FlowerProcess] = {}
        self.address: str | None = None  # the SuperLink's, once started
        self._seen: set[int] = set()  # the runs it listed after run(): its SuperLink keeps its runs in memory

    # ---- starting ----------------------------------------------------------------------

    def _spawn(self, name: str, command: Sequence[str], *, spec: NodeSpec | None = None) -> FlowerProcess:
        if name in self.procs and self.procs[name].proc.poll() is None:
            raise FlowerFleetError(f"{name} is already running (pid {self.procs[name].proc.pid})")
        home = self.out / f"{name}.flwr"
        home.mkdir(exist_ok=True)
        log_path = self.out / f"{name}.log"
        argv = launch_argv(command, spec=spec, die_with=os.getpid())
        with open(log_path, "ab") as out:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env={**self.env, "FLWR_HOME": str(home)}, cwd=self.out, process_group=0)
            except OSError as exc:
                raise FlowerFleetError(f"cannot start {name} ({shlex.join(argv)}): {exc}") from exc
        self.procs[name] = FlowerProcess(name=name, proc=proc, log_path=log_path)
        log.debug("started %s (pid %d): %s", name, proc.pid, shlex.join(argv))
        return self.procs[name]

    def start_superlink(self, *, port: int | None = None, args: Sequence[str] = ()) -> str:
        """Start the SuperLink on HOST:PORT (a free port by default); returns its address."""
        port = port or free_port(self.host)
        self.address = f"{self.host}:{port}"
        self._spawn("superlink", [str(self.bin_dir / "flower-superlink"), "--insecure", "--host", self.host,
                                  "--port", str(port), "--disable-runtime-dependency-installation", *args])
        return self.address

    def start_supernode(self, name: str, spec: NodeSpec, *, args: Sequence[str] = ()) -> FlowerProcess:
        """Start SuperNode `name` as `spec` says; its Runtime API on a free loopback port of its own."""
        superlink = spec.superlink or self.address
        if superlink is None:
            raise FlowerFleetError(f"{name}: start the SuperLink first, or give NodeSpec.superlink")
        command = [str(self.bin_dir / "flower-supernode"), "--insecure", "--superlink", superlink,
                   "--port", str(free_port("127.0.0.1"))]
        if spec.node_config:
            command += ["--node-config", node_config_arg(spec.node_config)]
        return self._spawn(name, [*command, *args], spec=spec)

    # ---- waiting and running -----------------------------------------------------------

    def wait_ready(self, *, timeout_s: float = 60.0) -> None:
        """Wait until the SuperLink's HTTP API answers /health with 200 (the SuperNodes connect by themselves)."""
        if self.address is None:
            raise FlowerFleetError("no SuperLink started")
        host, _, port = self.address.rpartition(":")
        limit = time.monotonic() + timeout_s
        while not _healthy(host, int(port)):
            self.check()
            if time.monotonic() > limit:
                raise FlowerFleetError(f"the SuperLink at {self.address} did not answer /health within "
                                       f"{timeout_s:g} s; see {self.procs['superlink'].log_path}")
            time.sleep(0.1)

    def flwr_home(self) -> Path:
        """The Flower CLI's FLWR_HOME: a config.toml whose connection CONNECTION is this fleet's SuperLink."""
        if self.address is None:
            raise FlowerFleetError("no SuperLink started")
        home = self.out / "cli.flwr"
        write_toml(home / "config.toml", {"superlink": {"default": CONNECTION,
                                                        CONNECTION: {"address": self.address, "insecure": True}}})
        return home

    def flwr(self, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        """`flwr ARGS` with the fleet's Flower configuration; a FlowerFleetError if it fails or outlasts `timeout_s`."""
        argv = [str(self.bin_dir / "flwr"), *args]
        env = {**self.env, "FLWR_HOME": str(self.flwr_home())}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.out, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise FlowerFleetError(f"`{shlex.join(argv)}` did not end within {timeout_s:g} s; logs in {self.out}") \
                from exc
        if done.returncode != 0:
            raise FlowerFleetError(f"`{shlex.join(argv)}` failed (exit {done.returncode}): "
                                   f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done

    def run(self, app: Path, *, run_config: Path | None = None, timeout_s: float = 600.0) -> FlowerRun:
        """`flwr run APP CONNECTION --stream` (with `run_config`, a TOML file of run-config overrides), until the
        run ends; its id and final status from `flwr ls` (the one run it lists that an earlier run() did not)."""
        before = set(self._seen)
        done = self.flwr("run", str(app), CONNECTION, "--stream",
                         *(["--run-config", str(run_config)] if run_config else []), timeout_s=timeout_s)
        runs = {r["run-id"]: r for r in self._runs(timeout_s=timeout_s) if r["run-id"] not in before}
        self._seen |= set(runs)
        if len(runs) != 1:
            raise FlowerFleetError(f"expected one new run on {self.address}, found {sorted(runs)}")
        (run_id, row), = runs.items()
        return FlowerRun(run_id=int(run_id), status=str(row.get("status")), output=done.stdout + done.stderr)

    def run_ids(self, *, timeout_s: float = 60.0) -> list[int]:
        """The ids of the runs the SuperLink knows."""
        return [int(r["run-id"]) for r in self._runs(timeout_s=timeout_s)]

    def _runs(self, *, timeout_s: float) -> list[dict]:
        out = self.flwr("ls", CONNECTION, "--format", "json", timeout_s=timeout_s).stdout
        try:
            listing = json.loads(out)
            return [{**r, "run-id": int(r["run-id"])} for r in listing.get("runs", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FlowerFleetError(f"`flwr ls --format json` printed what is not its run list ({exc}): {out[:500]}") \
                from None

    # ---- watching and stopping -----------------------------------------------------------

    def check(self) -> None:
        """Raise if a started process has exited (naming it, its exit code and its log)."""
        for p in self.procs.values():
            if p.proc.poll() is not None:
                raise FlowerFleetError(f"{p.name} exited with code {p.proc.returncode}; see {p.log_path}: "
                                       f"{_tail(p.log_path)}")

    def _note_descendants(self) -> None:
        for p in self.procs.values():
            try:
                p.descendants |= {c.pid for c in psutil.Process(p.proc.pid).children(recursive=True)}
            except psutil.Error:
                pass

    def stop(self, names: Sequence[str] | None = None, *, grace_s: float = 5.0) -> None:
        """SIGTERM to each process group, SIGKILL after `grace_s`, then to what they started; SuperNodes first."""
        chosen = [self.procs[n] for n in names] if names is not None else list(self.procs.values())
        self._note_descendants()
        stop_in_waves([[p for p in chosen if p.name != "superlink"], [p for p in chosen if p.name == "superlink"]],
                      grace_s=grace_s, term=lambda p: _signal_group(p.proc, signal.SIGTERM),
                      kill=lambda p: _signal_group(p.proc, signal.SIGKILL),
                      after=lambda p: _signal_group(p.proc, signal.SIGKILL),  # its group's stragglers
                      after_wave=lambda wave: terminate(sorted({pid for p in wave for pid in p.descendants}),
                                                        grace_s=grace_s))

    def leftovers(self) -> list[str]:
        """The processes this fleet started (and theirs, as last seen) that are still alive: "pid name"."""
        pids = {pid for p in self.procs.values() for pid in (p.proc.pid, *p.descendants)}
        alive = []
        for pid in sorted(pids):
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {' '.join(proc.cmdline()[:3])}")
            except psutil.Error:
                continue
        return alive

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> FlowerFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _healthy(host: str, port: int) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=1.0)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    # Also after the leader is reaped: the kernel gives no new process a pid that is still a group's id,
    # so what this reaches is the group's own stragglers, or nothing (ESRCH).
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"

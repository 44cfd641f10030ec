"""The process harness: start, await, watch and stop a coordinator and its agents.

The one way `flexfl live`, the coordinator benchmark and the trace recorder run FlexFL
processes: as local processes on this machine, or (agents) inside emulated devices of
loadgen.fleet. Readiness comes from the coordinator's own API (the Status RPC): it is
listening when Status answers, a device has joined when Status lists it. Never from log
lines. Every process gets SIGTERM if this one dies (PR_SET_PDEATHSIG, armed by the child
itself: flexfl.app.cli, loadgen.device_exec) and is stopped by close(), agents first.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from flexfl.errors import ERROR_PREFIX, FlexFLError
from flexfl.signals import DIE_WITH_PARENT_ENV

if TYPE_CHECKING:
    from flexfl.proto.channel import TlsFiles

log = logging.getLogger(__name__)

HARNESS_ID = "flexfl-harness"  # the device id Status calls present (Status needs no joined device)


class HarnessError(FlexFLError):
    """A managed process failed to start, exited, or the coordinator did not become ready."""


@dataclass
class Managed:
    name: str
    proc: subprocess.Popen
    log_path: Path
    device: int | None = None  # emulated device index, if it runs in one
    reported: bool = False  # its exit has been returned by exits()
    own_group: bool = False  # its process group (its pid is the group id) is signalled and killed with it



class _Stoppable(Protocol):
    name: str
    proc: subprocess.Popen


S = TypeVar("S", bound=_Stoppable)


def stop_in_waves(waves: Sequence[Sequence[S]], *, grace_s: float, term: Callable[[S], None],
                  kill: Callable[[S], None], after: Callable[[S], None] | None = None,
                  after_wave: Callable[[Sequence[S]], None] | None = None) -> None:
    """Stop processes wave by wave (a fleet's clients before its server): term(p) for every process of a wave, a
    wait of up to `grace_s` for the wave as a whole, kill(p) (and a wait) for any still running; after(p) once
    each has exited, after_wave(wave) once the wave is over. The next wave starts only then."""
    for wave in waves:
        for p in wave:
            term(p)
        limit = time.monotonic() + grace_s
        for p in wave:
            try:
                p.proc.wait(timeout=max(0.1, limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s had not exited %.0f s after SIGTERM; killing it", p.name, grace_s)
                kill(p)
                p.proc.wait()
            if after is not None:
                after(p)
        if after_wave is not None:
            after_wave(wave)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the coordinator binds it exclusively right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def connect_address(listen: str) -> str:
    """Where to reach a coordinator that listens on `listen` (a wildcard bind is reached on loopback)."""
    host, _, port = listen.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]", "") else listen


class CoordinatorClient:
    """Status calls to a coordinator: plaintext to the harness's own processes; over TLS (`tls`) to a coordinator
    that serves a fleet of devices elsewhere, claiming the device its client certificate names under mutual TLS."""

    def __init__(self, address: str, token: str, *, timeout_s: float = 5.0, tls: TlsFiles | None = None) -> None:
        import grpc
        from flexfl.proto import fleet_pb2 as pb
        from flexfl.proto import fleet_pb2_grpc as pb_grpc
        from flexfl.proto.channel import certificate_common_name, open_channel
        from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER

        self._grpc, self._pb = grpc, pb
        self.address = address
        self._channel = open_channel(address, tls)
        self._stub = pb_grpc.FleetStub(self._channel)
        claimed = (certificate_common_name(tls.client_cert) if tls is not None and tls.client_cert else None)
        self._metadata = [(AUTH_HEADER, f"Bearer {token}"), (DEVICE_HEADER, claimed or HARNESS_ID)]
        self._timeout_s = timeout_s

    def status(self):
        """The coordinator's StatusReply, or None while it does not answer (starting, restarting)."""
        try:
            return self._stub.Status(self._pb.StatusRequest(), metadata=self._metadata, timeout=self._timeout_s)
        except self._grpc.RpcError as exc:
            # CANCELLED: a coordinator shutting down cancels the calls in flight.
            if exc.code() in (self._grpc.StatusCode.UNAVAILABLE, self._grpc.StatusCode.DEADLINE_EXCEEDED,
                              self._grpc.StatusCode.CANCELLED):
                return None
            raise HarnessError(f"coordinator {self.address} refused Status: {exc.code().name}: "
                               f"{exc.details()}") from None

    def close(self) -> None:
        self._channel.close()


class Harness:
    """A coordinator and agents started from config files; `fleet` runs agents in emulated devices."""

    def __init__(self, out: Path, *, fleet=None, env: dict[str, str] | None = None) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.fleet = fleet
        # Many processes share a few cores: one compute thread each avoids oversubscription.
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.procs: dict[str, Managed] = {}
        self.client: CoordinatorClient | None = None

    # ---- starting ----------------------------------------------------------------------

    def _spawn(self, name: str, args: Sequence[str], *, device: int | None = None, own_group: bool = False) -> Managed:
        if name in self.procs and self.procs[name].proc.poll() is None:
            raise HarnessError(f"{name} is already running (pid {self.procs[name].proc.pid})")
        argv = [sys.executable, "-m", "flexfl.app.cli", *args]
        log_path = self.out / f"{name}.log"
        if device is not None and self.fleet is not None:
            proc = self.fleet.spawn(device, argv, role=name, log_path=log_path, env=self.env)
        else:
            # No preexec_fn: forking a process whose gRPC threads run and then running Python in
            # the child can abort it; the child arms its parent-death signal itself (flexfl.app.cli).
            # A process group of its own: a terminal's Ctrl-C reaches this process only, which stops
            # the others in its order (stop()), as loadgen.fleet's devices are started too.
            env = {**self.env, DIE_WITH_PARENT_ENV: str(os.getpid())}
            with open(log_path, "ab") as out:
                try:
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            env=env, process_group=0)
                except OSError as exc:
                    raise HarnessError(f"cannot start {name}: {exc}") from exc
        self.procs[name] = Managed(name=name, proc=proc, log_path=log_path, device=device,
                                   own_group=own_group and device is None)
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(args))
        return self.procs[name]

    def start_coordinator(self, config: Path, *, address: str, token: str, resume: bool = False,
                          args: Sequence[str] = (), name: str = "coordinator", tls: TlsFiles | None = None) -> Managed:
        """Start `flexfl coordinator --config CONFIG`; Status calls go to `address` with `token` (over `tls`)."""
        managed = self._spawn(name, ["coordinator", "--config", str(config), *(["--resume"] if resume else []), *args])
        if self.client is None or self.client.address != address:
            if self.client is not None:
                self.client.close()
            self.client = CoordinatorClient(address, token, tls=tls)
        return managed

    def start_agent(self, name: str, config: Path, *, device: int | None = None, args: Sequence[str] = ()) -> Managed:
        """Start `flexfl agent --config CONFIG` (inside emulated device `device` when there is a fleet)."""
        return self._spawn(name, ["agent", "--config", str(config), *args], device=device)

    def start_command(self, name: str, args: Sequence[str]) -> Managed:
        """Start `flexfl ARGS` (e.g. a sweep) in a process group of its own, as a shell starts a job,
        so that signal(..., group=True) reaches it and its workers the way a terminal's Ctrl-C does."""
        return self._spawn(name, list(args), own_group=True)

    # ---- waiting -----------------------------------------------------------------------

    def status(self):
        if self.client is None:
            raise HarnessError("no coordinator started")
        return self.client.status()

    def wait_ready(self, *, timeout_s: float = 180.0, coordinator: str = "coordinator"):
        """Wait until the coordinator answers Status; returns the reply."""
        return self._wait(lambda st: st is not None, what="the coordinator to listen", timeout_s=timeout_s,
                          coordinator=coordinator)

    def wait_joined(self, device_ids: Iterable[str], *, timeout_s: float = 300.0, coordinator: str = "coordinator"):
        """Wait until every device in `device_ids` has joined and called in; returns the reply."""
        want = set(device_ids)

        def joined(st) -> bool:
            return st is not None and want <= {d.device_id for d in st.devices if d.connected and not d.departed}

        return self._wait(joined, what=f"devices {sorted(want)} to join", timeout_s=timeout_s, coordinator=coordinator)

    def wait_round(self, round_index: int, *, timeout_s: float = 600.0, coordinator: str = "coordinator"):
        """Wait until round `round_index` is completed (or the run finished)."""
        return self._wait(lambda st: st is not None and (st.completed_round >= round_index or st.finished),
                          what=f"round {round_index}", timeout_s=timeout_s, coordinator=coordinator)

    def _wait(self, done, *, what: str, timeout_s: float, coordinator: str):
        limit = time.monotonic() + timeout_s
        while True:
            st = self.status()
            if done(st):
                return st
            m = self.procs.get(coordinator)
            if m is not None and m.proc.poll() is not None:
                raise HarnessError(f"{self.exited(coordinator)} while waiting for {what}; see {m.log_path}")
            if time.monotonic() > limit:
                raise HarnessError(f"timed out after {timeout_s:g} s waiting for {what}; logs in {self.out}")
            time.sleep(0.05)

    # ---- watching and stopping -----------------------------------------------------------

    def check(self, name: str) -> None:
        """Raise if process `name` has exited with an error."""
        m = self.procs.get(name)
        if m is not None and m.proc.poll() not in (None, 0):
            raise HarnessError(f"{self.exited(name)}; see {m.log_path}")

    def exited(self, name: str) -> str:
        """'NAME exited with code N', with the process's own error line from its log when it printed one.

        A FlexFL command's bad input is one `flexfl: error: ...` line (e.g. EMNIST not found
        and where to get it): the user should read it here, not dig it out of a log file.
        """
        m = self.procs[name]
        text = f"{name} exited with code {m.proc.returncode}"
        try:
            with open(m.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 8192))
                tail = f.read().decode("utf-8", errors="replace")
        except OSError:
            return text
        errors = [line for line in tail.splitlines() if line.startswith(ERROR_PREFIX)]
        return f"{text}: {errors[-1][len(ERROR_PREFIX):].strip()}" if errors else text

    def running(self, name: str) -> bool:
        m = self.procs.get(name)
        return m is not None and m.proc.poll() is None

    def exits(self) -> dict[str, int]:
        """Processes that ended since the last call: {name: exit code} (each reported once)."""
        out = {}
        for m in self.procs.values():
            if not m.reported and m.proc.poll() is not None:
                m.reported = True
                out[m.name] = m.proc.returncode
        return out

    def signal(self, name: str, signum: int = signal.SIGTERM, *, group: bool = False) -> None:
        """`signum` to process `name`; with `group`, to its whole process group (start_command only)."""
        m = self.procs[name]
        if group and not m.own_group:
            raise HarnessError(f"{name} has no process group of its own (start it with start_command)")
        if m.proc.poll() is None:
            if group:
                os.killpg(m.proc.pid, signum)
            else:
                m.proc.send_signal(signum)

    def stop(self, names: Iterable[str] | None = None, *, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`; agents before the coordinator(s)."""
        chosen = [self.procs[n] for n in names] if names is not None else list(self.procs.values())

        def term(m: Managed) -> None:
            if m.proc.poll() is None:
                m.proc.send_signal(signal.SIGTERM)

        def reap(m: Managed) -> None:
            if m.own_group:  # its children (a sweep's workers) never outlive it
                try:
                    os.killpg(m.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        stop_in_waves([[m for m in chosen if not m.name.startswith("coordinator")],
                       [m for m in chosen if m.name.startswith("coordinator")]],
                      grace_s=timeout_s, term=term, kill=lambda m: m.proc.kill(), after=reap)

    def close(self) -> None:
        self.stop()
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

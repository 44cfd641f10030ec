"""The loadgen daemon: a ZeroMQ REP socket taking JSON commands (README.md has the schema).

Every request gets exactly one reply, `{"ok": true, ...}` or `{"ok": false, "error": ...}`,
whatever it contained, and the daemon keeps serving.

Clients authenticate with ZeroMQ CURVE when the daemon has keys (`keys_dir`, see
loadgen/keys.py): a client whose key is not in the allowed list, or that does not speak
CURVE, never gets a request through (no reply at all), and each refusal is logged. Without
keys the daemon only binds local endpoints (ipc://, tcp on loopback): anyone who reaches a
TCP port could otherwise load the CPU and shape the link. On exit (return, SIGTERM, SIGINT) it
stops stress-ng and removes the qdiscs it installed. A SIGKILLed daemon cannot clean up:
stress-ng still dies (PDEATHSIG, see loadgen.cpu) but its qdiscs stay until
`flexfl loadgen clean --iface DEV`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from flexfl import __version__
from flexfl.errors import ConfigError
from loadgen import bandwidth
from loadgen import keys as curve
from loadgen.cpu import CpuLoad, CpuLoadReading, CpuSnapshot
from loadgen.errors import DaemonError, LoadgenError, ProtocolError
from loadgen.hostinfo import host_facts
from loadgen.netns import is_valid_ifname
from loadgen.protocol import (
    PROTOCOL_VERSION,
    Clear,
    Command,
    Ping,
    SetBandwidth,
    SetCpu,
    Status,
    command_name,
    error_reply,
    ok_reply,
    parse_request,
)

log = logging.getLogger(__name__)

# Below this, a reading mostly shows stress-ng starting up; status reports null instead.
_MIN_PARTIAL_S = 1.0
# A client with a wrong server key reconnects every ~100 ms: one log line per kind and minute.
_REFUSAL_LOG_INTERVAL_S = 60.0
_REFUSAL_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


@dataclass(frozen=True)
class DaemonConfig:
    bind: str = "tcp://127.0.0.1:5601"  # "tcp://127.0.0.1:*" picks a free port
    iface: str | None = None  # default interface for set_bandwidth without "iface"
    measure_interval_s: float = 5.0  # status reports the load over the last such interval
    nice: int = 0  # stress-ng's nice (see loadgen.cpu.CpuLoad)
    cpus: float | None = None  # CPUs to load; None: cgroup quota, else affinity
    cpu_method: str | None = None  # stress-ng --cpu-method; None: stress-ng's default mix
    poll_interval_s: float = 0.2  # how quickly a stop request is noticed
    keys_dir: str | None = None  # CURVE: server.key_secret + clients/*.key (loadgen/keys.py)

    def __post_init__(self) -> None:
        if self.keys_dir is None and not curve.is_local_endpoint(self.bind):
            raise ConfigError(
                f"refusing to listen on {self.bind} without authentication: give a keys folder "
                "(--keys DIR; `flexfl loadgen keys` makes the keys), or bind ipc:// or a loopback address")
        if not self.measure_interval_s > 0 or not self.poll_interval_s > 0:
            raise ConfigError("measure_interval_s and poll_interval_s must be positive, got "
                              f"{self.measure_interval_s!r} and {self.poll_interval_s!r}")
        if not -20 <= self.nice <= 19:
            raise ConfigError(f"nice must be in [-20, 19], got {self.nice!r}")
        if self.cpus is not None and not self.cpus > 0:
            raise ConfigError(f"cpus must be positive, got {self.cpus!r}")
        if self.iface is not None and not is_valid_ifname(self.iface):
            raise ConfigError(f"bad interface name {self.iface!r} (1-15 characters, no '/', ':' or spaces)")


class Shaper(Protocol):
    """What the daemon needs from loadgen.bandwidth (tests pass a fake)."""

    def set_rate(self, dev: str, *, rate_kbit: int, burst_bytes: int | None = None,
                 latency_ms: float = 50, netns: str | None = None) -> bandwidth.TbfSettings: ...

    def clear(self, dev: str, *, netns: str | None = None) -> bool: ...


class LoadgenDaemon:
    """Command handling and the serve loop; `handle` is usable without a socket."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        cpu: CpuLoad | None = None,
        shaper: Shaper = bandwidth,
        context: zmq.Context | None = None,
    ) -> None:
        self.config = config
        self._cpu = cpu if cpu is not None else CpuLoad(cpus=config.cpus, nice=config.nice,
                                                        cpu_method=config.cpu_method)
        self._shaper = shaper
        # A context of its own: ZeroMQ allows one ZAP handler per context.
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._socket: zmq.Socket | None = None
        self._auth: ThreadAuthenticator | None = None
        self._monitor: zmq.Socket | None = None
        self.refusals: dict[str, int] = {}  # refused handshakes by reason
        self._refusal_logged: dict[str, float] = {}
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._shaped: dict[str, bandwidth.TbfSettings] = {}
        self._host = host_facts()
        self._mark: CpuSnapshot = self._cpu.snapshot()
        self._last_reading: CpuLoadReading | None = None
        self.endpoint: str | None = None

    # -- socket ------------------------------------------------------------------------
    def bind(self) -> str:
        """Bind the REP socket (CURVE with keys); return the bound endpoint (with the real port)."""
        keys = curve.load_server_keys(Path(self.config.keys_dir)) if self.config.keys_dir else None
        sock = self._context.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            if keys is not None:
                self._start_authenticator(keys)
                curve.apply_server(sock, keys)
                self._monitor = sock.get_monitor_socket(_REFUSAL_EVENTS)
            sock.bind(self.config.bind)
        except zmq.ZMQError as exc:
            self._socket = sock
            self.close()
            raise DaemonError(f"cannot bind {self.config.bind}: {exc}") from exc
        self._socket = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("loadgen daemon listening on %s (%s)", self.endpoint,
                 f"CURVE, {len(keys.clients)} client key(s) from {keys.clients_dir}" if keys else
                 "no authentication: local endpoint")
        return self.endpoint

    def _start_authenticator(self, keys: curve.ServerKeys) -> None:
        allowed = set(keys.clients)

        class AllowList:
            def callback(self, domain: str, key: bytes) -> bool:
                return key in allowed

        self._auth = ThreadAuthenticator(self._context, log=logging.getLogger(f"{__name__}.zap"))
        self._auth.start()
        self._auth.configure_curve_callback("*", credentials_provider=AllowList())

    def serve(self) -> None:
        """Answer requests until `stop()`; always leaves the device clean."""
        if self._socket is None:
            self.bind()
        sock = self._socket
        assert sock is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        timeout_ms = int(self.config.poll_interval_s * 1000)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(timeout_ms))
                if self._monitor is not None and self._monitor in ready:
                    self._note_refusal(recv_monitor_message(self._monitor))
                if sock in ready:
                    frames = sock.recv_multipart()
                    if len(frames) != 1:
                        reply = error_reply(f"request must be one message frame, got {len(frames)}")
                    else:
                        reply = self.handle(frames[0])
                    sock.send(reply)
                self._tick()
        finally:
            self.cleanup()
            self.close()

    def close(self) -> None:
        """Close the socket, stop the ZAP handler, end the context if it is ours (idempotent)."""
        if self._monitor is not None and self._socket is not None:
            self._socket.disable_monitor()
        for s in (self._monitor, self._socket):
            if s is not None:
                s.close(linger=0)
        self._monitor = self._socket = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._own_context and not self._context.closed:
            self._context.term()

    def stop(self) -> None:
        """Ask `serve` to return (thread- and signal-safe)."""
        self._stop.set()

    def _note_refusal(self, event: Mapping[str, Any]) -> None:
        """Count a failed handshake; log the first of each kind, then at most once a minute."""
        reason = _refusal_reason(event)
        if reason is None:
            return
        count = self.refusals[reason] = self.refusals.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._refusal_logged.get(reason, -math.inf) >= _REFUSAL_LOG_INTERVAL_S:
            self._refusal_logged[reason] = now
            log.warning("refused a client on %s: %s (%d such refusal(s) so far)", self.endpoint, reason, count)

    # -- commands ----------------------------------------------------------------------
    def handle(self, raw: bytes) -> bytes:
        """One request in, one reply out; never raises."""
        try:
            command = parse_request(raw)
        except ProtocolError as exc:
            log.warning("bad request: %s", exc)
            return error_reply(str(exc))
        name = command_name(command)
        try:
            return ok_reply(**self.dispatch(command))
        except LoadgenError as exc:
            log.warning("%s failed: %s", name, exc)
            return error_reply(f"{name}: {exc}")
        except Exception as exc:  # a bug must not take the daemon down
            log.exception("%s crashed", name)
            return error_reply(f"{name}: internal error: {type(exc).__name__}: {exc}")

    def dispatch(self, command: Command) -> dict[str, Any]:
        """Carry out a validated command; return the reply's fields besides "ok"."""
        match command:
            case Ping():
                return {"pong": True, "version": __version__, "protocol": PROTOCOL_VERSION}
            case Status():
                return self.status()
            case SetCpu(percent=percent):
                self._cpu.set(percent)
                self._reset_measurement()
                return {"cpu": self._cpu_state()}
            case SetBandwidth() as cmd:
                return {"bandwidth": self._set_bandwidth(cmd)}
            case Clear():
                return self._clear()
        raise ProtocolError(f"unhandled command {command!r}")

    def status(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "protocol": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "default_iface": self.config.iface,
            "cpu": self._cpu_state(measured=True),
            "bandwidth": {dev: _tbf_dict(s) for dev, s in self._shaped.items()},
            "host": self._host,
            "auth": {"mechanism": "curve" if self.config.keys_dir else "none", "refused": dict(self.refusals)},
        }

    def cleanup(self) -> None:
        """Stop stress-ng and remove every qdisc this daemon installed; log, never raise."""
        try:
            self._cpu.stop()
        except Exception:
            log.exception("stopping stress-ng failed")
        for dev in list(self._shaped):
            try:
                self._shaper.clear(dev)
            except Exception:
                log.exception("removing the qdisc of %s failed", dev)
            self._shaped.pop(dev, None)

    # -- internals ---------------------------------------------------------------------
    def _set_bandwidth(self, cmd: SetBandwidth) -> dict[str, Any]:
        dev = cmd.iface or self.config.iface
        if dev is None:
            raise ProtocolError("field 'iface' is required: the daemon was started without --iface")
        settings = self._shaper.set_rate(dev, rate_kbit=cmd.rate_kbit, burst_bytes=cmd.burst_bytes,
                                         latency_ms=cmd.latency_ms)
        self._shaped[dev] = settings
        return {dev: _tbf_dict(settings)}

    def _clear(self) -> dict[str, Any]:
        errors: list[str] = []
        try:
            self._cpu.set(0)
        except LoadgenError as exc:
            errors.append(str(exc))
        self._reset_measurement()
        cleared = []
        for dev in list(self._shaped):
            try:
                self._shaper.clear(dev)
            except LoadgenError as exc:
                errors.append(str(exc))
                continue
            del self._shaped[dev]
            cleared.append(dev)
        if errors:
            raise DaemonError("; ".join(errors))
        return {"cleared_ifaces": cleared, "cpu": self._cpu_state()}

    def _cpu_state(self, *, measured: bool = False) -> dict[str, Any]:
        state: dict[str, Any] = {
            "target_percent": self._cpu.target_percent,
            "cpus": self._cpu.cpus,
            "workers": self._cpu.workers,
        }
        if measured:
            state["stress_ng_pid"] = self._cpu.pid
            reading = self._last_reading
            if reading is None and time.monotonic() - self._mark.at_s >= _MIN_PARTIAL_S:
                reading = self._cpu.reading_since(self._mark)  # no full interval since a change
            state["measured"] = asdict(reading) if reading is not None else None
        return state

    def _reset_measurement(self) -> None:
        # A reading across a level change would mix two levels.
        self._mark = self._cpu.snapshot()
        self._last_reading = None

    def _tick(self) -> None:
        if time.monotonic() - self._mark.at_s >= self.config.measure_interval_s:
            self._last_reading = self._cpu.reading_since(self._mark)
            self._mark = self._cpu.snapshot()


def _refusal_reason(event: Mapping[str, Any]) -> str | None:
    """Why a handshake failed, from a socket monitor event (None: not a refusal)."""
    kind, value = event["event"], event["value"]
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "its CURVE key is not among the allowed client keys"
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "it does not use CURVE"
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "CURVE handshake failed (the client has a wrong server key for this daemon)"
    if kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
        return f"handshake failed (ZeroMQ protocol error {value:#x})"
    return None


def _tbf_dict(s: bandwidth.TbfSettings) -> dict[str, Any]:
    return {"rate_kbit": s.rate_kbit, "burst_bytes": s.burst_bytes, "latency_ms": s.latency_ms}


def run_daemon(config: DaemonConfig, *, ready: Any = sys.stdout) -> int:
    """Serve until SIGTERM/SIGINT, then clean up; print "listening ENDPOINT" when ready."""
    daemon = LoadgenDaemon(config)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        daemon.stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        endpoint = daemon.bind()
        print(f"listening {endpoint}", file=ready, flush=True)
        daemon.serve()
    finally:
        daemon.cleanup()  # also when bind failed, or serve never ran
        daemon.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0

"""Clients for loadgen daemons: one (`LoadgenClient`) or a fleet at once (`FleetClient`).

A REQ socket that misses a reply is stuck (it may not send again), so on a timeout the
socket is closed and a fresh one connected (ZeroMQ's "lazy pirate" pattern) before the
DaemonError is raised; the next call works as soon as the daemon is back.

With a `ClientAuth` (loadgen/keys.py) the client speaks CURVE. A daemon that refuses a
client never answers it, so on a timeout the client reads its socket's monitor events to
say why: unreachable (no connection), authentication failed (and which way), or connected
but silent.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from loadgen.errors import DaemonError, ProtocolError
from loadgen.keys import ClientAuth, apply_client
from loadgen.protocol import decode_reply

_NO_KEYS = "this client has none (give --client-key and --server-key)"
_WATCHED_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

log = logging.getLogger(__name__)


class LoadgenClient:
    """Talks to one daemon; every call waits at most `timeout_s` for the reply."""

    def __init__(self, endpoint: str, *, timeout_s: float = 5.0, context: zmq.Context | None = None,
                 auth: ClientAuth | None = None) -> None:
        if timeout_s <= 0:
            raise DaemonError(f"timeout_s must be positive, got {timeout_s!r}")
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.auth = auth
        if auth is not None:
            auth.server_key(endpoint)  # fail now, naming the endpoint, if its key is unknown
        self._context = context or zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._connect()

    # -- commands (raise DaemonError when the daemon answers ok=false) ------------------
    def ping(self) -> dict[str, Any]:
        return self.call({"cmd": "ping"})

    def status(self) -> dict[str, Any]:
        return self.call({"cmd": "status"})

    def set_cpu(self, percent: float) -> dict[str, Any]:
        return self.call({"cmd": "set_cpu", "percent": percent})

    def set_bandwidth(self, rate_kbit: int, *, burst_bytes: int | None = None,
                      latency_ms: float = 50, iface: str | None = None) -> dict[str, Any]:
        return self.call(bandwidth_message(rate_kbit, burst_bytes=burst_bytes,
                                           latency_ms=latency_ms, iface=iface))

    def clear(self) -> dict[str, Any]:
        return self.call({"cmd": "clear"})

    # -- generic -----------------------------------------------------------------------
    def call(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Send a request; return the reply, or raise DaemonError if it says ok=false."""
        reply = self.request(message)
        if not reply["ok"]:
            raise DaemonError(f"loadgen daemon at {self.endpoint}: {reply.get('error')}")
        return reply

    def request(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """Send a request; return the reply as it came (ok or not)."""
        return self.request_raw(json.dumps(message).encode())

    def request_raw(self, raw: bytes) -> dict[str, Any]:
        """Send raw bytes as the request (for tests of malformed input); return the reply."""
        deadline = time.monotonic() + self.timeout_s
        self.send_raw(raw, deadline=deadline)
        return self.receive(deadline=deadline)

    def send_raw(self, raw: bytes, *, deadline: float | None = None) -> None:
        """Queue a request, waiting until `deadline` (default: timeout_s from now) for the socket
        to take it. A REQ socket refuses to queue while it has no usable connection, e.g. once a
        refused handshake has dropped it, so a send that never goes out is diagnosed like a
        reply that never comes."""
        assert self._socket is not None
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self._socket.send(raw, zmq.NOBLOCK)
                return
            except zmq.Again:
                timeout_ms = max(0, int((deadline - time.monotonic()) * 1000))
                if timeout_ms > 0 and self._socket.poll(timeout_ms, zmq.POLLOUT):
                    continue
                why = self._diagnose()
                self._reconnect()
                raise DaemonError(f"cannot send to loadgen daemon at {self.endpoint} within "
                                  f"{self.timeout_s:g} s: {why}") from None
            except zmq.ZMQError as exc:
                self._reconnect()
                raise DaemonError(f"cannot send to loadgen daemon at {self.endpoint}: {exc}") from exc

    def receive(self, *, deadline: float) -> dict[str, Any]:
        """Wait for the reply to the last request until `deadline` (time.monotonic())."""
        assert self._socket is not None
        timeout_ms = max(0, int((deadline - time.monotonic()) * 1000))
        if not self._socket.poll(timeout_ms, zmq.POLLIN):
            why = self._diagnose()
            self._reconnect()
            raise DaemonError(f"no reply from loadgen daemon at {self.endpoint} within {self.timeout_s:g} s: {why}")
        raw = self._socket.recv()
        try:
            return decode_reply(raw)
        except ProtocolError as exc:
            raise DaemonError(f"loadgen daemon at {self.endpoint}: {exc}") from exc

    def close(self) -> None:
        if self._socket is not None:
            if self._monitor is not None:
                self._socket.disable_monitor()
                self._monitor.close(linger=0)
                self._monitor = None
            self._socket.close(linger=0)
            self._socket = None

    def _diagnose(self) -> str:
        """Why no reply came, from the monitor events of this socket so far."""
        connected = handshake_ok = False
        failure: str | None = None
        while self._monitor is not None and self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_CONNECTED:
                connected = True
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                handshake_ok, failure = True, None
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                failure = ("the daemon refused this client's CURVE key (its public key is not in the "
                           "daemon's clients/ folder)")
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                failure = ("the daemon runs without CURVE keys but this client uses them" if self.auth else
                           f"the daemon requires CURVE keys and {_NO_KEYS}")
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                # Whichever side sees a mismatch first hangs up; the other then only sees the
                # connection drop, so without details the likely cause follows this client's keys.
                failure = ("the CURVE handshake failed (is the server key right for this endpoint, and does "
                           "the daemon use CURVE?)" if self.auth else
                           f"the handshake failed: the daemon likely requires CURVE keys and {_NO_KEYS}")
        if failure is not None:
            return f"authentication failed: {failure}"
        if handshake_ok:
            return "connected, but the daemon did not answer (busy or stuck?)"
        if connected:
            return "connected, but the handshake did not complete"
        return "unreachable: no connection (is `flexfl loadgen serve` running there?)"

    def __enter__(self) -> LoadgenClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> None:
        sock = self._context.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        # Queue a request only on a finished connection (handshake included): a refused or
        # absent daemon then shows as a send that cannot go out, diagnosed the same way every
        # time, instead of depending on whether ZeroMQ dropped the pipe before the send.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        if self.auth is not None:
            apply_client(sock, self.auth, self.endpoint)
        monitor = sock.get_monitor_socket(_WATCHED_EVENTS)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close()
            raise DaemonError(f"bad loadgen endpoint {self.endpoint!r}: {exc}") from exc
        self._socket, self._monitor = sock, monitor

    def _reconnect(self) -> None:
        self.close()
        self._connect()


class FleetClient:
    """Drives many daemons: requests go out to all at once, replies are awaited together.

    Methods return {endpoint: reply}; a daemon that does not answer in time gets
    {"ok": false, "error": ...} in its place. The `call`-style methods raise one
    DaemonError naming every endpoint that failed, after all were tried.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 5.0,
                 context: zmq.Context | None = None, auth: ClientAuth | None = None) -> None:
        if not endpoints:
            raise DaemonError("FleetClient needs at least one endpoint")
        if len(set(endpoints)) != len(endpoints):
            raise DaemonError(f"duplicate endpoints in {list(endpoints)}")
        self.clients: dict[str, LoadgenClient] = {}
        try:
            for e in endpoints:
                self.clients[e] = LoadgenClient(e, timeout_s=timeout_s, context=context, auth=auth)
        except BaseException:
            self.close()
            raise
        self.timeout_s = timeout_s

    def request_each(self, messages: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """Send each endpoint its own message; return every reply (errors included)."""
        return self._exchange({e: json.dumps(m).encode() for e, m in messages.items()})

    def broadcast_raw(self, raw: bytes) -> dict[str, dict[str, Any]]:
        """Send the same raw bytes to every daemon; return every reply (errors included)."""
        return self._exchange({e: raw for e in self.clients})

    def _exchange(self, raws: Mapping[str, bytes]) -> dict[str, dict[str, Any]]:
        unknown = set(raws) - set(self.clients)
        if unknown:
            raise DaemonError(f"not in this fleet: {sorted(unknown)}")
        replies: dict[str, dict[str, Any]] = {}
        sent = []
        # One shared deadline: a fleet call takes at most timeout_s, not N x timeout_s.
        deadline = time.monotonic() + self.timeout_s
        for endpoint, raw in raws.items():
            try:
                self.clients[endpoint].send_raw(raw, deadline=deadline)
                sent.append(endpoint)
            except DaemonError as exc:
                replies[endpoint] = {"ok": False, "error": str(exc)}
        for endpoint in sent:
            try:
                replies[endpoint] = self.clients[endpoint].receive(deadline=deadline)
            except DaemonError as exc:
                replies[endpoint] = {"ok": False, "error": str(exc)}
        return {e: replies[e] for e in raws}

    def broadcast(self, message: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Send the same message to every daemon; return every reply (errors included)."""
        return self.request_each({e: message for e in self.clients})

    def call(self, message: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Broadcast; raise DaemonError naming each daemon that failed."""
        return _check(self.broadcast(message))

    def call_each(self, messages: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """Per-endpoint messages; raise DaemonError naming each daemon that failed."""
        return _check(self.request_each(messages))

    def ping(self) -> dict[str, dict[str, Any]]:
        return self.call({"cmd": "ping"})

    def status(self) -> dict[str, dict[str, Any]]:
        return self.call({"cmd": "status"})

    def set_cpu(self, percent: float) -> dict[str, dict[str, Any]]:
        return self.call({"cmd": "set_cpu", "percent": percent})

    def set_bandwidth(self, rate_kbit: int, *, burst_bytes: int | None = None,
                      latency_ms: float = 50, iface: str | None = None) -> dict[str, dict[str, Any]]:
        return self.call(bandwidth_message(rate_kbit, burst_bytes=burst_bytes,
                                           latency_ms=latency_ms, iface=iface))

    def clear(self) -> dict[str, dict[str, Any]]:
        return self.call({"cmd": "clear"})

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def __enter__(self) -> FleetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bandwidth_message(rate_kbit: int, *, burst_bytes: int | None = None,
                      latency_ms: float = 50, iface: str | None = None) -> dict[str, Any]:
    """A set_bandwidth request; iface None lets the daemon use its --iface."""
    msg: dict[str, Any] = {"cmd": "set_bandwidth", "rate_kbit": rate_kbit,
                           "burst_bytes": burst_bytes, "latency_ms": latency_ms}
    if iface is not None:
        msg["iface"] = iface
    return msg


def _check(replies: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    failed = {e: r.get("error") for e, r in replies.items() if not r.get("ok")}
    if failed:
        detail = "; ".join(f"{e}: {err}" for e, err in failed.items())
        raise DaemonError(f"{len(failed)} of {len(replies)} loadgen daemon(s) failed: {detail}")
    return replies

"""Addresses: HOST:PORT parsing, and why a bind or a connection fails, in words a user can act on.

The reasons come from the operating system's own answers (a DNS lookup, a bind, a TCP
connect), never from parsing gRPC's error text: gRPC says UNAVAILABLE for a refused
connection, an unknown host name and a host that does not answer alike.
"""

from __future__ import annotations

import errno
import socket

from flexfl.errors import ConfigError


def split_host_port(text: str, *, what: str, allow_port_zero: bool = False) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"; a ConfigError naming `what` otherwise."""
    lowest = 0 if allow_port_zero else 1
    usage = f"{what}: expected HOST:PORT with a port in {lowest}..65535"
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"{usage}, got {text!r}")
    if not lowest <= int(port) <= 65535:
        raise ConfigError(f"{usage}, got port {port} in {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"{usage} (an IPv6 host goes in brackets: [::1]:50051), got {text!r}")
    return host, int(port)


def _resolve(host: str, port: int, *, passive: bool) -> list[tuple] | str:
    try:
        return socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_PASSIVE if passive else 0)
    except socket.gaierror as exc:
        return f"cannot resolve host name {host!r} (DNS: {exc.strerror})"


def bind_problem(listen: str) -> str | None:
    """Why binding `listen` would fail now (None: it would not), from a test bind of our own."""
    host, port = split_host_port(listen, what="server.listen", allow_port_zero=True)
    found = _resolve(host, port, passive=True)
    if isinstance(found, str):
        return found
    family, kind, proto, _, sockaddr = found[0]
    with socket.socket(family, kind, proto) as s:
        # As gRPC does: a port left in TIME_WAIT by a previous run is free; one held by a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} is already in use by another program (another coordinator?)"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"address {host} is not an address of this machine"
            if exc.errno == errno.EACCES:
                return f"no permission to bind port {port} (ports below 1024 need root)"
            return f"bind failed: {exc.strerror}"
    return None


def tcp_problem(address: str, *, what: str, timeout_s: float = 3.0) -> str | None:
    """Why a TCP connection to `address` fails: DNS failure, connection refused, no answer (None: it connects)."""
    host, port = split_host_port(address, what=what)
    found = _resolve(host, port, passive=False)
    if isinstance(found, str):
        return found
    family, kind, proto, _, sockaddr = found[0]
    with socket.socket(family, kind, proto) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(sockaddr)
        except ConnectionRefusedError:
            return f"connection refused: nothing listens on port {port} of {host}"
        except TimeoutError:
            return f"no answer from {host}:{port} within {timeout_s:g} s (host down, or a firewall drops the packets)"
        except OSError as exc:
            return f"cannot connect to {host}:{port}: {exc.strerror}"
    return None


def reach_problem(address: str, *, timeout_s: float = 3.0) -> str:
    """Why the coordinator at `address` may not answer: DNS failure, connection refused, no answer, or a TCP
    connection that works (then gRPC itself failed)."""
    return tcp_problem(address, what="coordinator", timeout_s=timeout_s) or (
        f"{address} accepts TCP connections, but the gRPC call failed (TLS settings, or not a FlexFL coordinator?)")

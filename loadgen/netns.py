"""Network namespaces and veth links through `ip`, for tests and the emulated fleet.

Every function needs root (or CAP_NET_ADMIN / CAP_SYS_ADMIN). Deletes are idempotent:
deleting what is not there is not an error, so cleanup code can call them unconditionally.

    create_netns("dev1")
    add_veth("dev1-a", "dev1-b", netns="dev1", address="10.123.1.2/24",
             peer_address="10.123.1.1/24")           # peer stays in the caller's namespace
    run_argv = exec_argv("dev1", ["python", "-m", "flexfl.app.cli", "loadgen", "serve"])
    ...
    delete_netns("dev1")                              # also destroys veth ends inside it
"""

from __future__ import annotations

import logging
import re

from loadgen._run import failure, in_netns, run
from loadgen.errors import NetnsError

log = logging.getLogger(__name__)

# Linux interface names: 1-15 bytes, no "/", ":" or whitespace (IFNAMSIZ - 1).
_IFNAME = re.compile(r"[^/:\s]{1,15}")
_NETNS = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def is_valid_ifname(name: object) -> bool:
    """True if `name` could be a Linux interface name (1-15 chars, no '/', ':' or spaces)."""
    return isinstance(name, str) and _IFNAME.fullmatch(name) is not None and name not in (".", "..")


def _check_netns_name(name: str) -> None:
    if not isinstance(name, str) or not _NETNS.fullmatch(name) or name in (".", ".."):
        raise NetnsError(f"bad network namespace name {name!r} (letters, digits, '_', '.', '-')")


def _check_ifname(name: str) -> None:
    if not is_valid_ifname(name):
        raise NetnsError(f"bad interface name {name!r} (1-15 characters, no '/', ':' or spaces)")


def _ip(netns: str | None) -> list[str]:
    return ["ip"] if netns is None else ["ip", "-n", netns]


def exec_argv(netns: str, argv: list[str]) -> list[str]:
    """The argument list that runs `argv` inside `netns` (for subprocess.Popen/run)."""
    _check_netns_name(netns)
    return ["ip", "netns", "exec", netns, *argv]


def list_netns() -> list[str]:
    """Names of the named network namespaces (those under /run/netns)."""
    out = run(["ip", "netns", "list"], error=NetnsError).stdout
    # Lines look like "name" or "name (id: 3)".
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_exists(name: str) -> bool:
    return name in list_netns()


def create_netns(name: str, *, exist_ok: bool = False) -> None:
    """Create a namespace with its loopback up."""
    _check_netns_name(name)
    if exist_ok and netns_exists(name):
        return
    run(["ip", "netns", "add", name], error=NetnsError)
    run(["ip", "-n", name, "link", "set", "lo", "up"], error=NetnsError)
    log.debug("created netns %s", name)


def delete_netns(name: str) -> None:
    """Delete a namespace; fine if it does not exist.

    Processes still inside keep the (now unnamed) namespace and its links alive: stop them
    first (`netns_pids`).
    """
    _check_netns_name(name)
    proc = run(["ip", "netns", "delete", name], error=NetnsError, check=False)
    if proc.returncode != 0 and "No such file" not in proc.stderr:
        raise failure(NetnsError, proc, hint=f"cannot delete network namespace {name!r}")


def netns_pids(name: str) -> list[int]:
    """Pids of the processes inside a namespace (empty if it does not exist)."""
    _check_netns_name(name)
    proc = run(["ip", "netns", "pids", name], error=NetnsError, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def link_exists(name: str, *, netns: str | None = None) -> bool:
    _check_ifname(name)
    return run([*_ip(netns), "link", "show", "dev", name], error=NetnsError, check=False).returncode == 0


def add_veth(
    name: str,
    peer: str,
    *,
    netns: str | None = None,
    peer_netns: str | None = None,
    address: str | None = None,
    peer_address: str | None = None,
) -> None:
    """Create a veth pair `name`<->`peer`, move each end to its namespace, address it, set it up.

    Addresses are CIDR strings ("10.123.1.2/24"); None leaves an end unaddressed.
    """
    _check_ifname(name)
    _check_ifname(peer)
    run(["ip", "link", "add", name, "type", "veth", "peer", "name", peer], error=NetnsError)
    try:
        for dev, ns, addr in ((name, netns, address), (peer, peer_netns, peer_address)):
            if ns is not None:
                run(["ip", "link", "set", dev, "netns", ns], error=NetnsError)
            if addr is not None:
                run([*_ip(ns), "addr", "add", addr, "dev", dev], error=NetnsError)
            run([*_ip(ns), "link", "set", dev, "up"], error=NetnsError)
    except NetnsError:
        # Deleting one end removes both, wherever the first end ended up.
        delete_link(name, netns=netns)
        delete_link(name)
        raise
    log.debug("veth %s(%s) <-> %s(%s)", name, netns, peer, peer_netns)


def set_link(name: str, *, up: bool, netns: str | None = None) -> None:
    """Set a link up or down."""
    _check_ifname(name)
    run([*_ip(netns), "link", "set", name, "up" if up else "down"], error=NetnsError)


def set_default_route(via: str, *, netns: str | None = None) -> None:
    """Route everything not on a local link via `via` (replacing any default route).

    A link taken down loses the routes through it, and bringing it up again restores only its
    own subnet's: a caller that brings a link back restores the default route with this.
    """
    run([*_ip(netns), "route", "replace", "default", "via", via], error=NetnsError)


def abort_tcp(*, dst: str, netns: str | None = None) -> None:
    """Abort every TCP connection to address `dst` (in `netns`, else here), as if the path had reset it.

    `ss -K`: the kernel closes each socket at once and its owner's next call fails
    (ECONNABORTED), rather than waiting out TCP's retransmission timer. A kernel without
    CONFIG_INET_DIAG_DESTROY aborts nothing (the connections then recover on their timers).
    """
    run(in_netns(["ss", "-K", "-t", "dst", dst], netns), error=NetnsError)


def delete_link(name: str, *, netns: str | None = None) -> None:
    """Delete a link (for veth: both ends); fine if it does not exist."""
    _check_ifname(name)
    if netns is not None and not netns_exists(netns):
        return
    proc = run([*_ip(netns), "link", "del", name], error=NetnsError, check=False)
    if proc.returncode != 0 and "Cannot find device" not in proc.stderr:
        raise failure(NetnsError, proc, hint=f"cannot delete link {name!r}")

"""`flexfl loadgen serve|send|keys|clean`: run a daemon, drive daemons, make CURVE keys, remove leftover qdiscs."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexfl.errors import ConfigError
from loadgen.protocol import COMMANDS

if TYPE_CHECKING:
    from loadgen.keys import ClientAuth

log = logging.getLogger(__name__)

DEFAULT_BIND = "tcp://127.0.0.1:5601"
_MESSAGE_FLAGS = ("percent", "rate_kbit", "burst_bytes", "latency_ms", "iface")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `loadgen` and its subcommands to the `flexfl` parser."""
    p = sub.add_parser("loadgen", help="CPU and bandwidth load generators and their daemon")
    lsub = p.add_subparsers(dest="loadgen_command", required=True, metavar="ACTION")

    serve = lsub.add_parser("serve", help="run the control daemon (ZeroMQ REP, JSON commands)")
    serve.add_argument("--bind", default=DEFAULT_BIND, help=f"ZeroMQ endpoint (default {DEFAULT_BIND}; "
                       "port * picks a free one)")
    serve.add_argument("--iface", help="interface set_bandwidth shapes when a request names none")
    serve.add_argument("--measure-interval-s", type=float, default=5.0,
                       help="status reports the CPU load over the last interval of this length")
    serve.add_argument("--nice", type=int, default=0,
                       help="stress-ng's nice; below 0 (root) it wins against other work")
    serve.add_argument("--cpus", type=float, help="CPUs to load (default: cgroup quota, else affinity)")
    serve.add_argument("--cpu-method", help="stress-ng --cpu-method (e.g. int8: uniform, accurate under a quota)")
    serve.add_argument("--keys", metavar="DIR",
                       help="authenticate clients with CURVE: DIR holds server.key_secret and clients/*.key "
                            "(required unless --bind is ipc:// or a loopback address)")
    serve.set_defaults(func=cmd_serve)

    send = lsub.add_parser("send", help="send one command to one or more daemons")
    send.add_argument("--endpoint", action="append", required=True,
                      help="daemon endpoint, e.g. tcp://10.0.0.5:5601 (repeat for a fleet)")
    send.add_argument("--timeout-s", type=float, default=5.0, help="wait this long for each reply")
    what = send.add_mutually_exclusive_group(required=True)
    what.add_argument("--cmd", choices=COMMANDS)
    what.add_argument("--json", help="the whole request as JSON, sent as it is")
    send.add_argument("--percent", type=float, help="set_cpu: share of the CPUs, 0-100")
    send.add_argument("--rate-kbit", type=int, help="set_bandwidth: rate in kbit/s (1000 bit/s)")
    send.add_argument("--burst-bytes", type=int, help="set_bandwidth: bucket size (default: 10 ms)")
    send.add_argument("--latency-ms", type=float, help="set_bandwidth: max queueing delay")
    send.add_argument("--iface", help="set_bandwidth: interface (default: the daemon's --iface)")
    send.add_argument("--client-key", type=Path, metavar="FILE",
                      help="CURVE: this client's NAME.key_secret (for daemons started with --keys)")
    send.add_argument("--server-key", type=Path, action="append", metavar="FILE",
                      help="CURVE: the daemon's server.key, once per --endpoint and in the same order")
    send.set_defaults(func=cmd_send)

    keys = lsub.add_parser("keys", help="make a CURVE keypair (NAME.key public, NAME.key_secret 0600)")
    keys.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for the two files")
    keys.add_argument("--name", default="server",
                      help="file name: 'server' for a daemon (its --keys folder), e.g. 'recorder' for a client")
    keys.add_argument("--allow", type=Path, action="append", metavar="FILE",
                      help="also copy this client public key into DIR/clients/ (repeatable)")
    keys.set_defaults(func=cmd_keys)

    clean = lsub.add_parser("clean", help="remove root qdiscs a killed daemon left behind")
    clean.add_argument("--iface", action="append", required=True, help="interface (repeatable)")
    clean.add_argument("--netns", help="network namespace the interfaces live in")
    clean.set_defaults(func=cmd_clean)


def cmd_serve(args: argparse.Namespace) -> int:
    from loadgen.daemon import DaemonConfig, run_daemon

    config = DaemonConfig(bind=args.bind, iface=args.iface, measure_interval_s=args.measure_interval_s,
                          nice=args.nice, cpus=args.cpus, cpu_method=args.cpu_method, keys_dir=args.keys)
    return run_daemon(config)


def build_message(args: argparse.Namespace) -> dict[str, Any]:
    """The request that `send --cmd ...` describes; the daemon validates it."""
    msg: dict[str, Any] = {"cmd": args.cmd}
    for flag in _MESSAGE_FLAGS:
        value = getattr(args, flag)
        if value is not None:
            msg[flag] = value
    return msg


def cmd_send(args: argparse.Namespace) -> int:
    """Print one JSON line per endpoint: {"endpoint": E, "reply": {...}}; 1 if any failed."""
    from loadgen.client import FleetClient

    if args.json is not None:
        extra = [f for f in _MESSAGE_FLAGS if getattr(args, f) is not None]
        if extra:
            flags = ", ".join("--" + f.replace("_", "-") for f in extra)
            raise ConfigError(f"{flags} cannot be combined with --json (put the fields in the JSON)")
        raw = args.json.encode()
    else:
        raw = json.dumps(build_message(args)).encode()
    with FleetClient(args.endpoint, timeout_s=args.timeout_s, auth=_client_auth(args)) as fleet:
        replies = fleet.broadcast_raw(raw)
    for endpoint, reply in replies.items():
        print(json.dumps({"endpoint": endpoint, "reply": reply}))
    failed = [e for e, r in replies.items() if not r.get("ok")]
    if failed:
        print(f"loadgen send: {len(failed)} of {len(replies)} failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _client_auth(args: argparse.Namespace) -> ClientAuth | None:
    """CURVE keys from --client-key and --server-key (one per --endpoint), or None without them."""
    from loadgen.keys import client_auth

    servers = args.server_key or []
    if args.client_key is None and not servers:
        return None
    if args.client_key is None or len(servers) != len(args.endpoint):
        raise ConfigError(f"CURVE needs --client-key and one --server-key per --endpoint "
                          f"(got {len(args.endpoint)} endpoint(s), {len(servers)} server key(s), "
                          f"{'a' if args.client_key else 'no'} client key)")
    return client_auth(args.client_key, dict(zip(args.endpoint, servers)))


def cmd_keys(args: argparse.Namespace) -> int:
    """Write NAME.key and NAME.key_secret; with --allow, copy client public keys into clients/."""
    from loadgen.keys import CLIENTS_DIR, copy_public_key, write_keypair

    public, secret = write_keypair(args.out, args.name)
    print(f"wrote {public} (public: give it to whoever talks to this key's owner) and {secret} (secret, 0600)")
    for source in args.allow or []:
        target = copy_public_key(source, args.out / CLIENTS_DIR, source.name.removesuffix(".key"))
        print(f"allowed client key {target}")
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    """Remove the root qdisc of each --iface (idempotent), e.g. after a daemon was SIGKILLed."""
    from loadgen import bandwidth

    for dev in args.iface:
        removed = bandwidth.clear(dev, netns=args.netns)
        print(f"{dev}: {'removed root qdisc' if removed else 'no qdisc to remove'}")
    return 0

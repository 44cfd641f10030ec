"""`flexfl status HOST:PORT`: watch a running coordinator, its round and every device, from its Status call.

It asks the coordinator the way an agent does: with the fleet token, and under TLS with the
fleet's CA; under mutual TLS with a client certificate of the fleet, whose common name (CN)
is the device id the call claims (proto/status.py). The flags mirror the agent config's
keys, and `--config AGENT_TOML` reads them all from an agent's config (on a device:
/etc/flexfl/agent.toml, the certificate and token the provisioning put there); flags win.

In a terminal it redraws every --interval seconds until the run finishes or Ctrl-C; piped, it
prints each poll below the last. --json prints one JSON object per poll, one a line; --once
asks once. A coordinator that cannot be reached at the first call is an error (exit 2); later,
the view says so (printed below the last: once, until it changes) and asks again, unless the run
had done its rounds (then the coordinator ended with it: exit 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from flexfl.errors import ConfigError

if TYPE_CHECKING:  # imported where used: `flexfl --help` imports no gRPC
    from flexfl.exchange import FleetState
    from flexfl.proto.status import Access

_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen (ANSI)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="watch a running coordinator: its round and every device",
                       description="Show a running coordinator's round (and the time left in it) and every device: "
                                   "its state, its last round's s / E and why it stopped there, the bytes it sent "
                                   "and received, its resident memory (RSS) and its link, as it reported them. "
                                   "Refreshes every --interval seconds until the run finishes (Ctrl-C stops). "
                                   "Under TLS give the fleet's CA, under mutual TLS a client certificate of the "
                                   "fleet too (its CN is the device id the call claims), or --config with an agent's "
                                   "config, which names them all.")
    p.add_argument("address", nargs="?", metavar="HOST:PORT",
                   help="the coordinator (default: the --config file's coordinator, else 127.0.0.1:50051)")
    p.add_argument("--config", type=Path, metavar="AGENT_TOML",
                   help="read the coordinator, token file, TLS files and device id from an agent's config "
                        "(e.g. /etc/flexfl/agent.toml on a provisioned device)")
    p.add_argument("--token-file", metavar="FILE", help="the fleet token (what the agents read)")
    p.add_argument("--tls-ca", metavar="PEM", help="TLS: the CA that signed the coordinator's certificate")
    p.add_argument("--tls-client-cert", metavar="PEM", help="mutual TLS: a client certificate signed by the fleet CA")
    p.add_argument("--tls-client-key", metavar="PEM", help="mutual TLS: its key")
    p.add_argument("--tls-server-name", metavar="NAME", help="the name to check in the coordinator's certificate")
    p.add_argument("--device-id", metavar="ID",
                   help="the device id the call claims (default: the client certificate's CN, else the --config "
                        "file's device_id, else flexfl-status)")
    p.add_argument("--json", action="store_true", help="one JSON object per poll, one a line")
    p.add_argument("--once", action="store_true", help="ask once and exit")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="between polls (default 2)")
    p.set_defaults(func=cmd_status)


def _access(args: argparse.Namespace) -> tuple[str, Access]:
    """The coordinator's address and what the call presents, from --config and the flags."""
    from edge_agent.config import load_agent_config
    from flexfl.proto.status import Access

    cfg = load_agent_config(args.config, overrides={
        "coordinator": args.address, "fleet_token_file": args.token_file, "tls_ca": args.tls_ca,
        "tls_client_cert": args.tls_client_cert, "tls_client_key": args.tls_client_key,
        "tls_server_name": args.tls_server_name})
    if not cfg.fleet_token_file:
        raise ConfigError("flexfl status needs the fleet token: --token-file FILE, or --config AGENT_TOML "
                          "with fleet_token_file")
    if bool(cfg.tls_client_cert) != bool(cfg.tls_client_key):
        raise ConfigError("mutual TLS needs both a client certificate and its key (--tls-client-cert and "
                          "--tls-client-key)")
    if cfg.tls_client_cert and not cfg.tls_ca:
        raise ConfigError("a client certificate needs TLS: give the fleet's CA too (--tls-ca)")
    # A certificate's CN comes before the config's device_id: under mutual TLS the call may only claim it.
    device_id = args.device_id or ("" if cfg.tls_client_cert or args.config is None else cfg.device_id)
    return cfg.coordinator, Access(token=cfg.token(), device_id=device_id, tls=cfg.tls_files())


def cmd_status(args: argparse.Namespace) -> int:
    from flexfl.proto.status import StatusClient, StatusError

    if not args.interval > 0:
        raise ConfigError(f"--interval must be > 0 seconds, got {args.interval:g}")
    address, access = _access(args)
    show = _printer(address, as_json=args.json, redraw=sys.stdout.isatty() and not args.json)
    with StatusClient(address, access) as client:
        state = client.fetch()  # unreachable or refused now: one error line, exit 2
        show(state, problem=None)
        try:
            while not (args.once or state.finished):
                time.sleep(args.interval)
                try:
                    state, problem = client.fetch(), None
                except StatusError as exc:
                    if not exc.away:
                        raise
                    if state.completed_round >= state.rounds:
                        return 0  # its last round was done: the coordinator ended with the run
                    problem = f"{exc}; asking again every {args.interval:g} s"
                show(state, problem=problem)
        except KeyboardInterrupt:
            return 0
    return 0


def _printer(address: str, *, as_json: bool, redraw: bool) -> Callable[..., None]:
    """show(state, problem=...): one poll's output, as JSON, a redrawn screen, or lines below the last.

    Printed below the last (JSON, or a pipe), a problem is said once until it changes or passes: a
    coordinator that has gone for good is not one line per poll.
    """
    from flexfl.fleet_view import render, state_json

    said: list[str | None] = [None]  # the problem printed last (printed below the last output only)

    def show(state: FleetState, *, problem: str | None) -> None:
        if not redraw:
            if problem is not None and problem == said[0]:
                return
            said[0] = problem
        if as_json:
            if problem is None:
                print(json.dumps(state_json(state)), flush=True)
            else:
                print(f"flexfl status: {problem}", file=sys.stderr, flush=True)
            return
        lines = render(state, address=address)
        if problem is not None:
            lines = [f"{time.strftime('%H:%M:%S')} {problem}; the last state it gave:", *lines]
        else:
            lines.append(f"({time.strftime('%H:%M:%S')}; Ctrl-C stops)" if redraw else "")
        print((_CLEAR if redraw else "") + "\n".join(lines), flush=True)

    return show

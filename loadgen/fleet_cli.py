"""`flexfl fleet up|down|status`: an emulated fleet on this machine (root). See loadgen/fleet.py.

    flexfl fleet up --devices 8 --cpu 0.25 --up-kbit 0,0,48000,24000   # lists cycle over devices
    flexfl fleet up --devices 4 --agent-config agent.toml --coordinator-port 50051
    flexfl fleet status
    flexfl fleet down                 # idempotent; also removes a crashed run's leftovers

Reached through the one `flexfl` command (flexfl.app.cli), whose error lines and logging it shares;
where the entry point is not installed, `python -m flexfl.app.cli fleet ACTION ...` is the same.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from flexfl.errors import ConfigError

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    """Add `fleet` and its subcommands to the `flexfl` parser."""
    p = sub.add_parser("fleet", help="emulated fleet on this machine: netns + veth + tbf + cgroup quota per device "
                                     "(root)")
    fsub = p.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")

    up = fsub.add_parser("up", help="create the devices and start a loadgen daemon in each")
    up.add_argument("--devices", type=int, required=True, help="number of devices")
    up.add_argument("--cpu", default="0.25", help="CPU quota per device in CPUs, or a comma list cycled over "
                                                  "devices; 0 = no quota (default 0.25)")
    up.add_argument("--up-kbit", default="0", help="upload limit (tbf on the device's egress) in kbit/s, or a "
                                                   "comma list; 0 = unshaped (default)")
    up.add_argument("--down-kbit", default="0", help="download limit (tbf on the coordinator side's egress) in "
                                                     "kbit/s, or a comma list; 0 = unshaped (default)")
    up.add_argument("--cfs-period-us", type=int, default=10_000, help="cgroup CPU period (default 10000)")
    up.add_argument("--no-loadgen", action="store_true", help="do not start the loadgen daemons")
    up.add_argument("--agent-config", type=Path, help="also start `flexfl agent --config FILE` in every device, "
                                                      "as dev-<i> with shard i")
    up.add_argument("--coordinator-port", type=int, default=50051,
                    help="port the agents dial on the fleet's coordinator address (default 50051)")
    _common(up)
    up.add_argument("--subnet", default="10.77.0", help="first three octets of the fleet's /24 (default 10.77.0)")
    up.set_defaults(func=cmd_up)

    down = fsub.add_parser("down", help="stop everything in the fleet and remove it (idempotent)")
    _common(down)
    down.set_defaults(func=cmd_down)

    status = fsub.add_parser("status", help="devices, addresses, qdisc rates, quotas, processes")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _common(status)
    status.set_defaults(func=cmd_status)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefix", default="ffl", help="name prefix of the fleet (default ffl)")


def _cycled(text: str, n: int, *, kind: type, flag: str) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected a number or a comma list, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise ConfigError(f"{flag}: values must be >= 0, got {text!r}")
    return [values[i % len(values)] or None for i in range(n)]


def cmd_up(args: argparse.Namespace) -> int:
    import os

    from loadgen.fleet import DeviceSpec, EmulatedFleet, FleetSpec
    from workloads.partition_spec import device_id

    n = args.devices
    cpus = _cycled(args.cpu, n, kind=float, flag="--cpu")
    ups = _cycled(args.up_kbit, n, kind=int, flag="--up-kbit")
    downs = _cycled(args.down_kbit, n, kind=int, flag="--down-kbit")
    devices = tuple(DeviceSpec(cpu_quota=c, up_kbit=u, down_kbit=d) for c, u, d in zip(cpus, ups, downs))
    spec = FleetSpec(devices=devices,
                     prefix=args.prefix, subnet=args.subnet, cfs_period_us=args.cfs_period_us)
    fleet = EmulatedFleet.up(spec)
    try:
        if not args.no_loadgen:
            for d in fleet.devices:
                fleet.start_loadgen(d.index, detach=True)
        if args.agent_config:
            env = dict(os.environ, OMP_NUM_THREADS="1")
            for d in fleet.devices:
                fleet.spawn(d.index, [sys.executable, "-m", "flexfl.app.cli", "agent", "--config",
                                      str(args.agent_config.resolve()),
                                      "--coordinator", f"{fleet.coordinator_host}:{args.coordinator_port}",
                                      "--device-id", device_id(d.index), "--shard-index", str(d.index)],
                            role="agent", env=env, detach=True)
    except BaseException:
        fleet.down()
        raise
    _print_table(fleet.status())
    print(f"fleet '{fleet.prefix}' up: {n} devices; coordinator address {fleet.coordinator_host} "
          f"(listen there, e.g. `flexfl coordinator --listen {fleet.coordinator_host}:{args.coordinator_port}`); "
          f"state and logs in {fleet.state_dir}; remove with `flexfl fleet down --prefix {fleet.prefix}`")
    if not args.no_loadgen:
        keys = fleet.state_dir / "keys"
        print(f"loadgen daemons authenticate with CURVE keys made for this run: flexfl loadgen send --endpoint "
              f"{fleet.devices[0].loadgen_endpoint} --client-key {keys}/controller.key_secret "
              f"--server-key {fleet.loadgen_keys_dir(0)}/server.key --cmd status")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from loadgen.fleet import down

    removed = down(args.prefix)
    print(f"fleet '{args.prefix}': " + (f"removed {', '.join(removed)}" if removed else "nothing to remove"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from loadgen.fleet import status

    rows = status(args.prefix)
    if args.json:
        print(json.dumps(rows, indent=1))
    elif rows:
        _print_table(rows)
    else:
        print(f"fleet '{args.prefix}' is not up")
    return 0


def _print_table(rows: list[dict]) -> None:
    def rate(v: int | None) -> str:
        return "-" if v is None else f"{v} kbit/s"

    table = [("device", "netns", "address", "up", "down", "cpu quota", "processes")]
    for r in rows:
        procs = " ".join(f"{p['role']}:{p['pid']}{'' if p['alive'] else '(dead)'}" for p in r["processes"]) or "-"
        quota = "-" if r["cpu_quota"] is None else f"{r['cpu_quota']:g} CPU"
        table.append((str(r["device"]), r["netns"], r["address"], rate(r["up_kbit"]),
                      rate(r["down_kbit"]), quota, procs))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())

"""Run a command inside an emulated device: join its cgroup and network namespace, then exec it.

    python -m loadgen.device_exec [--cgroup DIR] [--netns NAME] [--die-with PID] -- COMMAND ...

EmulatedFleet.spawn starts this launcher, which enters the device and replaces itself with
COMMAND. It takes a cgroup, a namespace, or neither (then it only arms --die-with, which a
command that is not FlexFL's cannot arm itself; CpuQuotaGroup's processes enter a cgroup alone).
Entering from a fresh process (rather than in a preexec_fn between fork and exec) means no
Python runs in a forked copy of a parent whose gRPC or ZeroMQ threads may hold locks:
subprocess can then use vfork, which runs no fork handlers. Only the standard library is
imported here (and flexfl.signals, which imports nothing else).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

from flexfl.signals import die_with_parent

_CLONE_NEWNET = 0x40000000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadgen.device_exec", description=__doc__.splitlines()[0])
    p.add_argument("--cgroup", help="cgroup folder to join (its cgroup.procs)")
    p.add_argument("--netns", help="network namespace name (/run/netns/NAME)")
    p.add_argument("--die-with", type=int, default=0, metavar="PID",
                   help="get SIGTERM when PID (the parent) dies; exit at once if it is already gone")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command after --")
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        if args.cgroup:
            with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if args.netns:
            fd = os.open(os.path.join("/run/netns", args.netns), os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {args.netns} failed")
            finally:
                os.close(fd)
    except OSError as exc:
        print(f"loadgen.device_exec: cannot enter device (cgroup {args.cgroup}, netns {args.netns}): {exc}",
              file=sys.stderr)
        return 1
    if args.die_with and not die_with_parent(signal.SIGTERM, parent_pid=args.die_with):
        return 1  # the parent died before the signal was armed
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"loadgen.device_exec: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())

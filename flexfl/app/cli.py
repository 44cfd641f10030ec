"""The `flexfl` command: one entry point, one subcommand per package that owns the work."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import signal
import sys

from flexfl import __version__
from flexfl.errors import ERROR_PREFIX, FlexFLError

log = logging.getLogger(__name__)


class _HelpFormatter(argparse.HelpFormatter):
    """A value's placeholder named after its flag (--deadline-s DEADLINE_S), not after where argparse stores
    it: flags that override a config field store it under an internal name (flexfl.config.flag_dest)."""

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        return action.option_strings[-1].lstrip("-").upper().replace("-", "_")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser with _HelpFormatter and no abbreviated flags; add_subparsers makes every subcommand's
    parser of this class.

    A command that takes no subcommand refuses a flag it does not know itself, with its own
    usage and the closest flags it has: argparse hands the unknown ones up to `flexfl`, whose
    usage names no flag of the command.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        # No prefixes of long flags: `sim table3 --seed 0` ran a 384-run sweep as --seeds 0 (issue 33).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            self.error(unrecognized(extras, [o for a in self._actions for o in a.option_strings]))
        return namespace, extras


def unrecognized(extras: list[str], options: list[str]) -> str:
    """The error for arguments a command does not know, with the closest of its `options` for each flag."""
    hints = []
    for arg in extras:
        flag = arg.partition("=")[0]
        if flag.startswith("--"):
            close = difflib.get_close_matches(flag, options, n=2, cutoff=0.75)
            if close:
                hints.append(f"{flag}: did you mean {' or '.join(close)}?")
    return f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else "")


# The module that registers each command. main() imports only the module of the command it
# runs: an edge agent then imports neither the simulator's, coordinator's, recorder's nor the
# report's command modules (1.7 MiB resident less beside torch, measured in one process;
# benchmarks/agent_memory.py). A test checks this table against what the modules register.
COMMAND_MODULES: dict[str, str] = {
    "coordinator": "coordinator.cli", "token": "coordinator.cli", "agent": "edge_agent.cli",
    "live": "flexfl.app.live_cli", "sim": "flexfl.app.sim_cli", "traces": "flexfl.app.traces_cli",
    "data": "workloads.cli", "loadgen": "loadgen.cli", "fleet": "loadgen.fleet_cli", "report": "flexfl.app.report.cli",
    "new": "flexfl.app.new", "campaign": "flexfl.app.campaign.cli", "status": "flexfl.app.status_cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `flexfl` parser with every command, or with only the commands of `command`'s module.

    Command modules are imported here, not at module import, so that `flexfl --help` stays
    cheap (none imports torch).
    """
    names = [COMMAND_MODULES[command]] if command in COMMAND_MODULES else list(dict.fromkeys(COMMAND_MODULES.values()))
    parser = _Parser(
        prog="flexfl",
        description="Federated learning testbed for devices that finish part of their work, "
        "go silent, leave or join late.",
    )
    parser.add_argument("--version", action="version", version=f"flexfl {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in names:
        importlib.import_module(name).register(sub)
    return parser


def _command(argv: list[str]) -> str | None:
    """The command `argv` names: its first word that is not an option (flexfl's own options take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _die_with_parent() -> None:
    """Started by loadgen.harness: get SIGTERM when the harness dies (a killed `flexfl live` leaves nothing)."""
    from flexfl.signals import DIE_WITH_PARENT_ENV, die_with_parent

    parent = os.environ.pop(DIE_WITH_PARENT_ENV, "")
    if parent.isdigit() and not die_with_parent(signal.SIGTERM, parent_pid=int(parent)):
        sys.exit(1)  # the harness died before the signal was armed


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    # A shell's background job starts with SIGINT ignored, and Python keeps an ignored SIGINT ignored: a campaign
    # or live run started so ran on through `kill -INT` (seen in a clean-clone test run). Every command stops
    # cleanly on it (KeyboardInterrupt, below), however it was started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.func(args) or 0)
    except FlexFLError as exc:
        print(f"{ERROR_PREFIX}{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # One line, no traceback; a sweep's says what stopped and how to resume (simulator.sweep.run_sweep).
        sys.stdout.flush()  # progress lines first, then the last word
        print(f"flexfl: interrupted: {exc}" if str(exc) else "flexfl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

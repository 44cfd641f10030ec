"""The `flexfl` command: one entry point, one subcommand per package that owns the work."""

from __future__ import annotations

import argparse
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
    """An ArgumentParser with _HelpFormatter; add_subparsers makes every subcommand's parser of this class."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    # Subcommand modules are imported here, not at module import, so `flexfl --help`
    # stays cheap and an edge device never imports the simulator.
    from coordinator import cli as coordinator_cli
    from edge_agent import cli as agent_cli
    from flexfl import live_cli
    from flexfl import new as new_cli
    from flexfl.report import cli as report_cli
    from loadgen import cli as loadgen_cli
    from loadgen import fleet_cli
    from simulator import cli as sim_cli
    from trace_recorder import cli as traces_cli
    from workloads import cli as data_cli

    parser = _Parser(
        prog="flexfl",
        description="Federated learning testbed for devices that finish part of their work, "
        "go silent, leave or join late.",
    )
    parser.add_argument("--version", action="version", version=f"flexfl {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (coordinator_cli, agent_cli, live_cli, sim_cli, traces_cli, data_cli, loadgen_cli, fleet_cli,
                   report_cli, new_cli):
        module.register(sub)
    return parser


def _die_with_parent() -> None:
    """Started by flexfl.harness: get SIGTERM when the harness dies (a killed `flexfl live` leaves nothing)."""
    from flexfl.signals import DIE_WITH_PARENT_ENV, die_with_parent

    parent = os.environ.pop(DIE_WITH_PARENT_ENV, "")
    if parent.isdigit() and not die_with_parent(signal.SIGTERM, parent_pid=int(parent)):
        sys.exit(1)  # the harness died before the signal was armed


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    parser = build_parser()
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

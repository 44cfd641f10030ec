"""`python -m loadgen [-v] ACTION ...`: the same as `flexfl loadgen ACTION ...`, for devices
and tests that run the daemon without the `flexfl` entry point installed."""

from __future__ import annotations

import argparse
import logging
import sys

from flexfl.errors import FlexFLError
from loadgen.cli import register


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = any(a in ("-v", "--verbose") for a in argv)
    argv = [a for a in argv if a not in ("-v", "--verbose")]
    # prog "python -m" makes the registered subcommand read "python -m loadgen ACTION".
    parser = argparse.ArgumentParser(prog="python -m")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["loadgen", *argv])
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.func(args) or 0)
    except FlexFLError as exc:
        print(f"loadgen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

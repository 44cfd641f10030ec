"""`python -m loadgen [-v] ACTION ...`: the same as `flexfl loadgen ACTION ...`, for devices
and tests that run the daemon without the `flexfl` entry point installed."""

from __future__ import annotations

import sys

from flexfl.cli import main as flexfl_main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = [a for a in argv if a in ("-v", "--verbose")]
    return flexfl_main([*verbose, "loadgen", *(a for a in argv if a not in verbose)])


if __name__ == "__main__":
    sys.exit(main())

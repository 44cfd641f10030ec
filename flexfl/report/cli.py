"""`flexfl report DIR`: write the folder's HTML report and print its path."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one self-contained HTML report of a run, sweep or trace-set folder",
                       description="Write an HTML report (figures inline, opens offline) of a live or simulated "
                                   "run folder, a scheme sweep (results/) or a trace set (traces/<set>).")
    p.add_argument("dir", type=Path, metavar="DIR", help="run folder, sweep results folder or trace-set folder")
    p.add_argument("--out", type=Path, default=None, help="HTML file to write (default DIR/report.html)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from flexfl.report import write_report

    print(write_report(args.dir, args.out))
    return 0

"""`flexfl report DIR`: write the folder's HTML report and print its path."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one self-contained HTML report of a run, sweep or trace-set folder",
                       description="Write an HTML report (figures inline, opens offline) of a live or simulated "
                                   "run folder, a scheme sweep (results/) or a trace set (traces/<set>).")
    p.add_argument("dir", type=Path, metavar="DIR", help="run folder, sweep results folder or trace-set folder")
    p.add_argument("--out", type=Path, default=None,
                   help="HTML file to write (default out/report/<DIR>.html, e.g. out/report/traces-paper.html)")
    p.add_argument("--screenshot", type=Path, default=None, metavar="PNG",
                   help="also open the page in headless Chromium, save a full-page screenshot, and fail on "
                        "console errors, broken images or requests outside the page")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from flexfl.app.report import write_report
    from flexfl.errors import ReportError

    try:
        import jinja2  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ReportError(f"flexfl report needs the 'report' extra ({exc.name} is missing): "
                          "pip install -e '.[report]'") from None
    path = write_report(args.dir, args.out)
    print(path)
    if args.screenshot is not None:
        from flexfl.app.report.browser import check_page

        check = check_page(path, screenshot=args.screenshot)
        if not check.ok:
            problems = check.console_errors + [f"broken image: {i}" for i in check.broken_images] + [
                f"outside request: {u}" for u in check.outside_requests] + (["no images"] if not check.images else [])
            raise ReportError(f"{path} in Chromium: " + "; ".join(problems))
        print(f"{args.screenshot} ({check.images} images, {check.height_px} px tall, no console errors)")
    return 0

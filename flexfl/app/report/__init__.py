"""`flexfl report DIR`: one self-contained HTML page for a run, a sweep or a trace set.

Library choices: Jinja2 lays out the page (autoescaped templates in `templates/`, package
data) and matplotlib draws every figure as SVG inlined as a data URI. matplotlib is
already FlexFL's plotting library (the `plot` extra), its SVGs are small (a run report is
a few hundred kB) and need no script to show, so the page opens offline, prints, and
cannot fail on JavaScript. Plotly would add hover but inline ~4.6 MB of JS to every page.
Neither is needed by the edge agent: both sit in the `report` extra, imported only here.

Modules: `data` reads folders (the one adapter for output formats), `sections` computes
what each section shows, `plots` draws, `render` lays out and writes.
"""

from __future__ import annotations

from pathlib import Path


def write_report(path: Path, out: Path | None = None) -> Path:
    """Write the report of a run, sweep or trace-set folder to `out` (default out/report/<path>.html); returns it."""
    from flexfl.app.report.render import write_report as _write

    return _write(path, out)


def report_line(path: Path) -> str:
    """Write `path`/report.html and return the line a command prints about it (a hint without the extra).

    For a command that has just written the run folder `path` (its own output), so the report sits beside it."""
    try:
        import jinja2  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return f"report: not written ({exc.name} is missing; pip install -e '.[report]', then flexfl report {path})"
    from flexfl.app.report.render import REPORT_NAME

    return f"report: {write_report(path, Path(path) / REPORT_NAME)}"

"""Markdown for the results pages: tables, sections and rounded numbers, written one way.

Every page writer (simulator's Tables 3-5, the figures, the strategies and operating-point
pages, trace_recorder's fidelity page) first computes a result object and then renders it
with these helpers, so a page never grows its own table syntax or rounding. Plain functions,
not a template engine: Jinja2 is only in the [report] extra, and the simulator writes pages
without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import ROUND_HALF_EVEN, Decimal


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A pipe table, one line per row, ending in a newline ("| a | b |" then "|---|---|"; an empty cell "| |")."""
    def line(cells: Iterable[object]) -> str:
        return "|" + "|".join(f" {cell} " if str(cell) else " " for cell in cells) + "|"

    return "\n".join([line(header), "|---" * len(header) + "|", *(line(row) for row in rows)]) + "\n"


def section(title: str, body: str, *, level: int = 2) -> str:
    """A heading and its body; "" when the body is empty, so a page never ends in an empty section."""
    if not body.strip():
        return ""
    return f"{'#' * level} {title}\n\n{body}"


def join(*blocks: str) -> str:
    """Blocks separated by one empty line, empty blocks left out."""
    return "\n".join(b for b in blocks if b)


def fixed(value: float, digits: int, *, scale: int = 1) -> str:
    """`value` x `scale` with `digits` decimals, rounded once, half to even, from `value`'s shortest decimal form.

    The shortest decimal form is what a CSV written by Python holds (repr round-trips), so a
    reader who rounds the CSV's number by hand gets the page's figure: 1.804714599609375 -> "1.80",
    never "1.81" by way of an intermediate "1.805" (rounding twice); an accuracy 0.9145 shown in %
    (scale 100) is 91.45 exactly, so "91.4", whatever 0.9145 * 100 is in binary. Not finite:
    "nan", "inf", "-inf".
    """
    number = Decimal(repr(float(value)))
    if not number.is_finite():
        return repr(float(value) * scale)
    return f"{(number * scale).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_EVEN):f}"


def ranges(values: Iterable[float]) -> str:
    """"lo-hi" of `values` in %g ("28-96"), or the one value; "" when there are none."""
    ordered = sorted(values)
    if not ordered:
        return ""
    lo, hi = ordered[0], ordered[-1]
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"

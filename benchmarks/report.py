"""Benchmark output that is printed as it comes and kept, then written as one section of a Markdown file.

Each benchmark owns a named section of results/performance.md, between
`<!-- BEGIN name -->` and `<!-- END name -->`; writing it replaces that section only (or
appends it), so benchmarks of different parts regenerate their own figures and leave the
rest of the file, prose included, as it is.
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from pathlib import Path

import psutil

from flexfl.files import atomic_file
from loadgen.hostinfo import cpu_description


def machine() -> str:
    """One line about where a benchmark ran."""
    return (f"{cpu_description()}, {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
            f"Linux {platform.release()}, Python {platform.python_version()}; "
            f"load average {os.getloadavg()[0]:.1f} at the start (the machine is shared)")


class Output:
    """print() that also keeps the lines for write_section()."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def write_section(self, path: Path, name: str, *, title: str) -> None:
        """Replace (or add) section `name` of the Markdown file `path` with the command and its output."""
        args, skip = [], False
        for a in sys.argv[1:]:  # the command without --markdown PATH
            if skip or a == "--markdown":
                skip = not skip
                continue
            if not a.startswith("--markdown="):
                args.append(a)
        command = " ".join(["python -m", f"benchmarks.{Path(sys.argv[0]).stem}", *map(shlex.quote, args)])
        write_section(path, name, title=title, intro=f"`{command}`, {self.started}; {machine()}.", lines=self.lines)


def write_section(path: Path, name: str, *, title: str, intro: str, lines: list[str], fenced: bool = True) -> None:
    """Replace (or append) section `name` of the Markdown file `path`: title, intro, then `lines` verbatim (in a
    code block; fenced=False: as Markdown, for lines that are tables and prose)."""
    fence = ["```"] if fenced else []
    body = "\n".join([f"<!-- BEGIN {name} -->", f"### {title}", "", intro, "", *fence, *lines, *fence,
                      f"<!-- END {name} -->"])
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + body + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + body + "\n"
    with atomic_file(path) as f:
        f.write(text)

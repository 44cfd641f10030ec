"""The README and `make help` say the same thing about the same target."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# "~15 min", "17-23 min", "~1 h", "~12 core-hours": how long a target takes.
DURATION = re.compile(r"~?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:min|h|hours?|core-hours)\b")


def _make_help() -> dict[str, str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(REPO), "help"], capture_output=True,
                         text=True, check=True).stdout
    return {m[1]: m[2] for m in re.finditer(r"^  make (\S+)\s+(.*)$", out, re.M)}


def _readme_targets() -> dict[str, str]:
    """What the README says of each `make X`: its row of the command table, and its line(s) in the first code block."""
    text = (REPO / "README.md").read_text()
    said: dict[str, str] = {}
    for m in re.finditer(r"^\| `make ([\w-]+)[^`]*`[^|]*\| (.*?) \|", text, re.M):
        said[m[1]] = said.get(m[1], "") + " " + m[2]
    block = text.split("```sh", 1)[1].split("```", 1)[0]
    for m in re.finditer(r"^make ([\w-]+)\s+#(.*(?:\n\s+#.*)*)", block, re.M):
        said[m[1]] = said.get(m[1], "") + " " + m[2]
    return said


def test_the_readme_and_make_help_give_a_target_the_same_duration() -> None:
    """`make help` said ~1 h for `make sim` where the README said ~15 min (measured: results/table3_timing.json)."""
    helps, readme = _make_help(), _readme_targets()
    assert {"sim", "test", "demo"} <= set(readme), sorted(readme)
    compared = 0
    for target, text in readme.items():
        stated = sorted(set(DURATION.findall(text)))
        if stated:
            assert target in helps, f"README gives `make {target}` a duration; make help has no such target"
            assert sorted(set(DURATION.findall(helps[target]))) == stated, (target, stated, helps[target])
            compared += 1
    assert compared >= 3, compared


def test_the_readme_shows_what_make_demo_prints_first() -> None:
    """The README's healthy `make demo` starts with the line today's `make demo` command prints."""
    import shlex

    from flexfl.cli import build_parser
    from flexfl.config import overrides_from_args
    from flexfl.live import load_live_config
    from flexfl.live_cli import banner

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    planned = subprocess.run(["make", "--no-print-directory", "-n", "-C", str(REPO), "demo"], capture_output=True,
                             text=True, check=True).stdout  # -n: print the commands, run none
    command = shlex.split(next(line for line in planned.splitlines() if "flexfl live" in line))
    args = build_parser().parse_args(command[command.index("live"):])
    first = banner(load_live_config(args.config, overrides=overrides_from_args(args)))
    assert f"```\n{first}\n" in (REPO / "README.md").read_text(), first

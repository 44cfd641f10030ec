"""The README and the docs/ pages say what the code does: the same durations as `make help`, targets that
exist, `flexfl` commands that parse, the demo's first line, and the plug-in example `flexfl new` writes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
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

    from flexfl.app.cli import build_parser
    from flexfl.app.live import load_live_config
    from flexfl.app.live_cli import banner
    from flexfl.config import overrides_from_args

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    planned = subprocess.run(["make", "--no-print-directory", "-n", "-C", str(REPO), "demo"], capture_output=True,
                             text=True, check=True).stdout  # -n: print the commands, run none
    command = shlex.split(next(line for line in planned.splitlines() if "flexfl live" in line))
    args = build_parser().parse_args(command[command.index("live"):])
    first = banner(load_live_config(args.config, overrides=overrides_from_args(args)))
    assert f"```\n{first}\n" in (REPO / "README.md").read_text(), first


def test_the_readmes_bring_your_own_example_is_what_flexfl_new_writes(tmp_path, capsys) -> None:
    """docs/plugins.md shows the starter's code, config lines and commands; copied by hand, they would drift."""
    from flexfl.app.cli import main
    from flexfl.app.new import STARTER

    section = (REPO / "docs" / "plugins.md").read_text()
    sources = [p.read_text() for p in (STARTER / "myfl").glob("*.py")]
    live_lines = (STARTER / "live.toml").read_text().splitlines()
    blocks = re.findall(r"```(python|toml|sh)\n(.*?)```", section, re.S)
    assert [kind for kind, _ in blocks] == ["sh", "python", "python", "python", "toml"]
    for kind, block in blocks:
        if kind == "python":
            assert any(block in source for source in sources), block
        elif kind == "toml":
            assert all(line in live_lines for line in block.splitlines() if line.strip()), block
    assert main(["new", str(tmp_path / "myexp")]) == 0
    printed = [line.strip().replace(str(tmp_path / "myexp"), "myexp")
               for line in capsys.readouterr().out.splitlines() if line.startswith("  flexfl ")]
    commands = [line.split("  #")[0].strip() for line in blocks[0][1].splitlines()]
    assert commands == ["flexfl new myexp", *printed], (commands, printed)


def _examples(text: str) -> list[str]:
    """The commands a page gives as examples: lines of its ```sh blocks (continuations joined, comments
    dropped), `$ `-prompted lines of any block, and table cells that start with a `command`."""
    commands = []
    for kind, block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            if kind == "sh" and not line.startswith("$ "):
                commands.append(line.split(" #", 1)[0].strip())
            elif line.startswith("$ "):
                commands.append(line[2:].strip())
    for row in re.findall(r"^\|.*\|$", text, re.M):
        commands += re.findall(r"\| `([^`]+)`", row)
    return [c for c in commands if c and not c.startswith("#")]


def test_every_page_names_only_make_targets_that_exist() -> None:
    helps = _make_help()
    for page in PAGES:
        text = page.read_text()
        named = set(re.findall(r"(?:`|^|&& )make ([a-z][\w-]*)", text, re.M))  # in code, not "make devices differ"
        missing = sorted(t for t in named if t not in helps)
        assert not missing, f"{page.relative_to(REPO)} names make targets that `make help` lacks: {missing}"


def test_every_flexfl_example_on_the_pages_parses() -> None:
    """Each `flexfl ...` example of the README and docs/ is accepted by today's parser (flags, choices, types);
    `--help` lists what changed when one is not."""
    import shlex

    from flexfl.app.cli import build_parser

    checked = 0
    for page in PAGES:
        for command in (c for c in _examples(page.read_text()) if "flexfl " in c):
            words = shlex.split(command)
            for at in (i for i, w in enumerate(words) if w in ("flexfl", ".venv/bin/flexfl")):
                args = words[at + 1:]
                args = args[:next((i for i, w in enumerate(args) if w in ("&&", "|", ";")), len(args))]
                if not args or "..." in args:
                    continue
                try:
                    build_parser().parse_args(args)
                except SystemExit as exc:
                    raise AssertionError(f"{page.relative_to(REPO)}: `flexfl {' '.join(args)}` does not parse "
                                         f"(exit {exc.code})") from None
                checked += 1
    assert checked >= 20, checked


def test_durations_on_the_docs_pages_are_make_helps() -> None:
    """A docs/ bullet that starts with `make X` gives only durations that `make help` gives X."""
    helps = _make_help()
    compared = 0
    for page in sorted((REPO / "docs").glob("*.md")):
        for m in re.finditer(r"^- `make ([\w-]+)[^`]*`(.*(?:\n  .*)*)", page.read_text(), re.M):
            stated = set(DURATION.findall(m[2]))
            if stated:
                assert m[1] in helps, f"{page.name} gives `make {m[1]}` a duration; make help has no such target"
                assert stated <= set(DURATION.findall(helps[m[1]])), (page.name, m[1], stated, helps[m[1]])
                compared += 1
    assert compared >= 3, compared

"""`flexfl new DIR`: a starter folder with a model, a dataset and a strategy of one's own, and configs that run them.

The folder is a copy of flexfl/app/starter/ (a package `myfl` with the three plug-ins, sim.toml,
live.toml, a README saying what to edit, and a pyproject.toml that declares the plug-ins as entry
points, so that the folder installs as a package, e.g. on a fleet by `make provision PLUGIN=DIR`);
its configs name the plug-ins by import path and put their own folder on sys.path
(`plugin_path = "."`), so they run from anywhere as written.

`flexfl new --flower DIR` writes a Flower app instead, a copy of flexfl/app/starter_flower/: a
ServerApp with FlexFL's strategy (coordinator.flower_strategy), a ClientApp that races the deadline
(edge_agent.flower_client), its data and model (task.py), and a pyproject.toml whose run config's
out-dir is made absolute (DIR/out/flower), because a ServerApp runs in the working folder of
whichever SuperLink runs it.
The copy is made beside DIR and renamed into place: DIR holds all of it or none of it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import tomllib
from pathlib import Path

from flexfl.errors import ConfigError
from flexfl.files import atomic_file

STARTER = Path(__file__).parent / "starter"
STARTER_FLOWER = Path(__file__).parent / "starter_flower"
OUT_DIR_KEY = "out-dir"  # [tool.flwr.app.config] out-dir of the Flower starter's pyproject.toml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("new", help="write a starter folder: your own model, dataset and strategy, with configs "
                                   "that run them in simulation and live (--flower: a Flower app with FlexFL's rules)",
                       description="Write a starter folder DIR: a package `myfl` with a small model, a dataset "
                                   "generated in code and a strategy, sim.toml and live.toml that run them, and a "
                                   "README saying what to edit. With --flower, a Flower app instead: a ServerApp "
                                   "with FlexFL's strategy (Scheme C, fast-reboot, a deadline), a ClientApp that "
                                   "races the deadline, and its pyproject.toml (`flwr run DIR`). DIR must not exist "
                                   "or be empty.")
    p.add_argument("dir", type=Path, metavar="DIR", help="the folder to write (created)")
    p.add_argument("--flower", action="store_true",
                   help="write a Flower app (flwr 1.42) whose rounds follow FlexFL's rules")
    p.set_defaults(func=cmd_new)


def write_starter(target: Path, *, flower: bool = False) -> list[Path]:
    """Copy the starter (`flower`: the Flower app) into `target` (missing or empty); the files written, relative
    to it."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} exists and is not an empty folder; `flexfl new` writes a new one (nothing "
                          "there is overwritten): choose another DIR")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise ConfigError(f"{parent} does not exist; create it first, or choose another DIR")
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    try:
        tree = staging / "tree"
        shutil.copytree(STARTER_FLOWER if flower else STARTER, tree,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache"))
        if flower:
            set_out_dir(tree / "pyproject.toml", target.absolute() / "out" / "flower")
        if target.exists():
            target.rmdir()  # empty (checked above)
        os.rename(tree, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file())


def set_out_dir(pyproject: Path, out: Path) -> None:
    """Make the Flower app's run config say out-dir = OUT, keeping the file's other lines and comments as they are.

    The one line is rewritten, its value written by tomli_w (FlexFL's TOML writer: quoted and escaped), and
    the file is read back to check that it says so."""
    import tomli_w

    lines = pyproject.read_text(encoding="utf-8").splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith(f"{OUT_DIR_KEY} = ")]
    if len(at) != 1:
        raise ConfigError(f"{pyproject}: expected one line `{OUT_DIR_KEY} = ...`, found {len(at)}")
    old = lines[at[0]]
    value = tomli_w.dumps({OUT_DIR_KEY: str(out)}).rstrip("\n")
    lines[at[0]] = f"{value:<38} {old[old.index('#'):]}" if "#" in old else f"{value}\n"  # the template's comment
    with atomic_file(pyproject) as f:
        f.write("".join(lines))
    written = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["flwr"]["app"]["config"][OUT_DIR_KEY]
    if written != str(out):
        raise ConfigError(f"{pyproject}: {OUT_DIR_KEY} reads back as {written!r}, not {str(out)!r}")


def cmd_new(args: argparse.Namespace) -> int:
    target: Path = args.dir
    files = write_starter(target, flower=args.flower)
    print(f"wrote {len(files)} files to {target}/: {', '.join(str(f) for f in files)}")
    if args.flower:
        print("run it in the environment that holds FlexFL and Flower (`pip install -e '.[flower]'` in FlexFL's "
              "checkout):")
        print(f"  flwr run {target} --stream --federation-config num-supernodes=5")
        print(f"  flexfl report {target / 'out' / 'flower'}/run-<run id>")
        print(f"on SuperNodes of your own, and what to edit: {target / 'README.md'}")
        return 0
    print("run them:")
    print(f"  flexfl sim run --config {target / 'sim.toml'} --scheme myfl.strategy:SqrtRescale --scheme B --scheme C "
          f"--out {target / 'out' / 'sim'}")
    print(f"  flexfl live --config {target / 'live.toml'}")
    print(f"then edit {target / 'myfl'}/model.py, data.py and strategy.py ({target / 'README.md'} says how)")
    return 0

"""`flexfl new DIR`: a starter folder with a model, a dataset and a strategy of one's own, and configs that run them.

The folder is a copy of flexfl/app/starter/ (a package `myfl` with the three plug-ins, sim.toml,
live.toml, a README saying what to edit, and a pyproject.toml that declares the plug-ins as entry
points, so that the folder installs as a package, e.g. on a fleet by `make provision PLUGIN=DIR`);
its configs name the plug-ins by import path and put their own folder on sys.path
(`plugin_path = "."`), so they run from anywhere as written.
The copy is made beside DIR and renamed into place: DIR holds all of it or none of it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from flexfl.errors import ConfigError

STARTER = Path(__file__).parent / "starter"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("new", help="write a starter folder: your own model, dataset and strategy, with configs "
                                   "that run them in simulation and live",
                       description="Write a starter folder DIR: a package `myfl` with a small model, a dataset "
                                   "generated in code and a strategy, sim.toml and live.toml that run them, and a "
                                   "README saying what to edit. DIR must not exist or be empty.")
    p.add_argument("dir", type=Path, metavar="DIR", help="the folder to write (created)")
    p.set_defaults(func=cmd_new)


def write_starter(target: Path) -> list[Path]:
    """Copy the starter into `target` (missing or empty); the files written, relative to it."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} exists and is not an empty folder; `flexfl new` writes a new one (nothing "
                          "there is overwritten): choose another DIR")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise ConfigError(f"{parent} does not exist; create it first, or choose another DIR")
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    try:
        tree = staging / "tree"
        shutil.copytree(STARTER, tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if target.exists():
            target.rmdir()  # empty (checked above)
        os.rename(tree, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file())


def cmd_new(args: argparse.Namespace) -> int:
    target: Path = args.dir
    files = write_starter(target)
    print(f"wrote {len(files)} files to {target}/: {', '.join(str(f) for f in files)}")
    print("run them:")
    print(f"  flexfl sim run --config {target / 'sim.toml'} --scheme myfl.strategy:SqrtRescale --scheme B --scheme C "
          f"--out {target / 'out' / 'sim'}")
    print(f"  flexfl live --config {target / 'live.toml'}")
    print(f"then edit {target / 'myfl'}/model.py, data.py and strategy.py ({target / 'README.md'} says how)")
    return 0

"""The quality gates `make test` runs: the layer contract (import-linter), ruff and mypy.

Each runs its tool on the checkout with the configuration in pyproject.toml and shows the
tool's own report when it fails. The tools come with the `dev` extra (`make setup`)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _run_tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    # The tool beside this interpreter (the venv's), else the one on PATH.
    beside = Path(sys.executable).with_name(name)
    exe = str(beside) if beside.exists() else shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]' (make setup installs it)")
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def _placed() -> tuple[set[str], set[str]]:
    """What the contracts give a floor: the packages the layers contract names, and the ground's module
    patterns ("flexfl.*": each module directly in flexfl) that the forbidden contract holds down."""
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    (layers,) = (c["layers"] for c in contracts if c["type"] == "layers")
    (ground,) = (c["source_modules"] for c in contracts if c["type"] == "forbidden")
    return {name.strip() for layer in layers for name in layer.replace(":", "|").split("|")}, set(ground)


def _modules(package: str) -> list[str]:
    """Every module of a root package (its own __init__ excluded; not package data such as flexfl/app/starter)."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if any(not (d / "__init__.py").exists() for d in path.parents if d.is_relative_to(ROOT / package)):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1:
            out.append(".".join(parts))
    return out


def test_layers_point_one_way() -> None:
    result = _run_tool("lint-imports", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_module_is_in_a_layer() -> None:
    """A module the contracts do not place is not checked: a new module must sit in a package that a layer
    names, or in the ground (a top module of flexfl or trace_recorder, or a trace importer)."""
    named, ground = _placed()
    assert all(g.endswith(".*") for g in ground), ground
    roots = PYPROJECT["tool"]["importlinter"]["root_packages"]
    unplaced = [m for root in roots for m in _modules(root)
                if not any(m == n or m.startswith(n + ".") for n in named)
                and m.rpartition(".")[0] + ".*" not in ground]
    assert not unplaced, f"modules in no layer of [tool.importlinter] (pyproject.toml): {unplaced}"


def test_proto_imports_only_the_ground_floor() -> None:
    """proto/ is installed as flexfl.proto, which import-linter cannot see; it sits on the ground floor alone (the
    modules at flexfl's top: errors, the exchanged records, net), never on flexfl.app or a package above."""
    allowed = ("flexfl.proto", *(f"flexfl.{p.stem}" for p in (ROOT / "flexfl").glob("*.py") if p.stem != "__init__"))
    wrong = []
    for path in sorted((ROOT / "proto").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            roots = ("flexfl", *PYPROJECT["tool"]["importlinter"]["root_packages"])
            wrong += [f"{path.name}: {n}" for n in names
                      if n.split(".")[0] in roots and not n.startswith(allowed)]
    assert not wrong, wrong


def test_ruff_is_clean() -> None:
    result = _run_tool("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    """mypy over [tool.mypy] files (~15 s cold); no cache is written (--cache-dir /dev/null)."""
    result = _run_tool("mypy", "--cache-dir", "/dev/null")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_package_folder_ships_in_the_wheel() -> None:
    """pyproject lists the packages a wheel holds: a package folder left out is missing from every install that
    is not the checkout (a Pi's venv: `flexfl` failed there on import of a new subpackage, only in provisioning)."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    renamed = {v: k for k, v in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}  # folder -> package
    roots = {name.split(".")[0] for name in listed} - {"flexfl"} | {"flexfl", "proto"}
    found = set()
    for root in roots:
        for init in (ROOT / root).rglob("__init__.py"):
            folder = init.parent.relative_to(ROOT).as_posix()
            if {"starter", "starter_flower"} & set(folder.split("/")):
                continue  # package data `flexfl new` copies, not a package of FlexFL
            top, _, rest = folder.partition("/")
            package = renamed.get(top, top) + ("." + rest.replace("/", ".") if rest else "")
            found.add(package)
    assert sorted(found - listed) == [], "add these to [tool.setuptools] packages in pyproject.toml"

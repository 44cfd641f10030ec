"""Build a reproducible wheel of FlexFL's checkout, or of a user's plug-in package, on the controller.

Runs under the controller's Python (the one running Ansible) and prints one JSON line:
{"changed": bool, "wheel": "/path/to/flexfl-X-py3-none-any.whl"}.

Why not just `pip wheel CHECKOUT`: pip builds a local folder in place, and setuptools'
build/ folder keeps modules that were deleted from the checkout since the last build. So
the project files are copied into a fresh folder first. SOURCE_DATE_EPOCH pins the
timestamps inside the wheel, so the same sources give the same bytes and the copy to the
hosts (and the reinstall behind it) only happens when the code changed. A digest of the
copied sources, kept beside the wheel, skips pip altogether when they are the ones the wheel
was built from (a build takes 4-10 s, most of it pip setting up setuptools).
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

# Files at the top of a checkout that a setuptools build may read.
TOP_LEVEL_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md", "README.rst",
                   "LICENSE", "LICENSE.txt")
# 1980-01-01, the earliest time a zip entry can hold.
FIXED_EPOCH = "315532800"


def package_dirs(checkout: Path) -> list[str]:
    """Top-level source folders of the packages: [tool.setuptools] packages mapped through its
    package-dir (flexfl.proto lives in proto/), else every folder with __init__.py."""
    setuptools = tomllib.loads((checkout / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})
    listed = setuptools.get("packages")
    if isinstance(listed, list):
        mapped = setuptools.get("package-dir", {})
        return sorted({mapped.get(name, name).split("/")[0].split(".")[0] for name in listed})
    return sorted(p.name for p in checkout.iterdir() if (p / "__init__.py").is_file())


def copy_sources(checkout: Path, dest: Path) -> None:
    for name in TOP_LEVEL_FILES:
        if (checkout / name).is_file():
            shutil.copy2(checkout / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in package_dirs(checkout):
        shutil.copytree(checkout / name, dest / name, ignore=ignore)


def sources_digest(src: Path) -> str:
    """SHA-256 of the copied sources: every file's relative path, size and bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(src).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def build(checkout: Path, out_dir: Path) -> dict[str, object]:
    out_dir.mkdir(parents=True, exist_ok=True)
    record = out_dir / ".last-build.json"  # {"sources": digest, "wheel": name} of the last wheel built here
    with tempfile.TemporaryDirectory(prefix="flexfl-wheel-") as tmp:
        src, built = Path(tmp) / "src", Path(tmp) / "dist"
        src.mkdir()
        copy_sources(checkout, src)
        sources = sources_digest(src)
        last = json.loads(record.read_text()) if record.is_file() else {}
        if last.get("sources") == sources and (out_dir / str(last.get("wheel"))).is_file():
            return {"changed": False, "wheel": str(out_dir / last["wheel"])}
        env = dict(os.environ, SOURCE_DATE_EPOCH=FIXED_EPOCH, PIP_DISABLE_PIP_VERSION_CHECK="1")
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(built), str(src)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"pip wheel failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
        wheels = sorted(built.glob("*.whl"))
        if len(wheels) != 1:
            sys.exit(f"expected one wheel from {checkout}, got {[w.name for w in wheels]}")
        target = out_dir / wheels[0].name
        changed = not (target.is_file() and filecmp.cmp(wheels[0], target, shallow=False))
        if changed:
            shutil.copy2(wheels[0], target.with_suffix(".tmp"))
            os.replace(target.with_suffix(".tmp"), target)
        record.write_text(json.dumps({"sources": sources, "wheel": target.name}) + "\n")
        return {"changed": changed, "wheel": str(target)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, required=True, help="folder holding pyproject.toml")
    parser.add_argument("--out", type=Path, required=True, help="folder the wheel is kept in")
    parser.add_argument("--setting", default="flexfl_install_checkout_dir",
                        help="the role variable that names the folder (for the error message)")
    args = parser.parse_args()
    if not (args.checkout / "pyproject.toml").is_file():
        sys.exit(f"no pyproject.toml in {args.checkout}: {args.setting} must name a folder that holds one "
                 "(a Python package's project folder; `flexfl new DIR` writes one)")
    print(json.dumps(build(args.checkout.resolve(), args.out.resolve())))


if __name__ == "__main__":
    main()

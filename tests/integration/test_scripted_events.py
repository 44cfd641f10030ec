"""Scripted arrivals and departures (run.expected_*) happen in the round asked for, however fast rounds run."""

from __future__ import annotations

import logging

from coordinator.config import with_changes
from coordinator.metrics import read_metrics
from edge_agent.config import ParticipationConfig


def _rows(fleet) -> dict[int, dict]:
    return {r.round: r for r in read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")}


def test_a_late_agent_started_after_its_round_is_waited_for(live_config, fleet_factory, wait_for):
    cfg = with_changes(live_config(rounds=4, n_devices=4, min_devices=3, deadline_s=2.0),
                       run={"expected_arrivals": {"dev-3": 2}, "expected_wait_s": 60.0})
    fleet = fleet_factory(cfg)
    for i in range(3):
        fleet.start_agent(i)
    engine = fleet.coordinator.engine

    def round_2_answered():
        r = engine.current
        return r is not None and r.round_id == 2 and len(r.updates) == 3

    # Every participant of round 2 has answered: without the hold the round would close now,
    # long before the late agent has even started.
    wait_for(round_2_answered, what="round 2 answered by its three participants")
    fleet.start_agent(3, participation=ParticipationConfig(join_in_round=2))
    assert fleet.coordinator.wait(timeout=60)
    rows = _rows(fleet)
    assert rows[2].arrivals == ("dev-3",), {k: r.arrivals for k, r in rows.items()}
    assert "dev-3" in rows[3].participants and rows[3].s["dev-3"] == 5


def test_a_scripted_arrival_that_never_comes_is_logged_and_the_run_goes_on(live_config, fleet_factory, caplog):
    cfg = with_changes(live_config(rounds=3, n_devices=4, min_devices=3, deadline_s=2.0),
                       run={"expected_arrivals": {"dev-3": 2}, "expected_wait_s": 0.5})
    fleet = fleet_factory(cfg)
    for i in range(3):
        fleet.start_agent(i)
    with caplog.at_level(logging.ERROR, logger="coordinator.membership"):
        assert fleet.coordinator.wait(timeout=60)
    rows = _rows(fleet)
    assert sorted(rows) == [1, 2, 3] and not any(r.arrivals for r in rows.values())
    assert "round 2: scripted arrival/departure of dev-3 did not happen within run.expected_wait_s = 0.5 s" \
        in caplog.text


def test_a_scripted_departure_takes_effect_in_its_round_even_when_it_answers_last(live_config, fleet_factory):
    cfg = with_changes(live_config(rounds=4, n_devices=3, min_devices=3, deadline_s=5.0),
                       run={"expected_departures": {"dev-0": 2}})
    fleet = fleet_factory(cfg)
    # dev-0 is the slowest, so its upload is the one that would close round 2 before its Leave.
    fleet.start_agent(0, participation=ParticipationConfig(min_update_s=0.05, leave_after_round=2))
    for i in (1, 2):
        fleet.start_agent(i)
    assert fleet.coordinator.wait(timeout=60)
    rows = _rows(fleet)
    assert rows[2].departures == ("dev-0",) and rows[2].s["dev-0"] == 5
    assert "dev-0" not in rows[3].participants

"""Devices that join while training is just starting found the objective; later ones are arrivals.

Before: with run.min_devices = 1 (the README's coordinator example), an agent started a few
seconds after the first one joined after round 1 and counted as a fast-reboot arrival:
nine of ten agents were boosted arrivals and the example ended at 10.84 %.
"""

from __future__ import annotations

from coordinator.config import with_changes
from coordinator.metrics import read_metrics
from edge_agent.config import ParticipationConfig


def _run_with_late_joiners(live_config, fleet_factory, wait_for, *, founding_rounds: int) -> list[dict]:
    cfg = with_changes(live_config(rounds=3, n_devices=4, min_devices=1, deadline_s=8.0),
                       run={"founding_rounds": founding_rounds})
    fleet = fleet_factory(cfg)
    engine = fleet.coordinator.engine
    fleet.start_agent(0, participation=ParticipationConfig(min_update_s=1.0))  # round 1 lasts ~5 s
    wait_for(lambda: engine.current is not None and engine.current.round_id == 1, what="round 1 to open")
    for i in (1, 2, 3):
        fleet.start_agent(i)
    wait_for(lambda: len(engine.registry.devices) == 4, what="the three late agents to join")
    assert engine.current.round_id == 1 and not engine.current.closed, "they joined too late for this test"
    assert fleet.coordinator.wait(timeout=90)
    return read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")


def test_devices_joining_in_the_founding_window_are_members_without_boost_or_shift(live_config, fleet_factory,
                                                                                    wait_for):
    rows = _run_with_late_joiners(live_config, fleet_factory, wait_for, founding_rounds=1)
    joined = next(r for r in rows if r.founded)
    assert sorted(joined.founded) == ["dev-1", "dev-2", "dev-3"] and not any(r.arrivals for r in rows)
    last = rows[-1]
    assert sorted(last.participants) == ["dev-0", "dev-1", "dev-2", "dev-3"]
    # No fast-reboot boost: p is each device's share of the samples, summing to 1.
    assert abs(sum(last.p.values()) - 1.0) < 1e-9, last.p
    # No objective shift: the learning rate follows round 1's schedule (eta_0 / tau) without a restart.
    assert last.lr < rows[0].lr and abs(last.lr * last.round - rows[0].lr) < 1e-12


def test_with_no_founding_rounds_late_joiners_are_boosted_arrivals(live_config, fleet_factory, wait_for):
    rows = _run_with_late_joiners(live_config, fleet_factory, wait_for, founding_rounds=0)
    arrived = sorted(d for r in rows for d in r.arrivals)
    assert arrived == ["dev-1", "dev-2", "dev-3"] and not any(r.founded for r in rows)
    after = next(r for r in rows if r.round > max(r2.round for r2 in rows if r2.arrivals))
    assert sum(after.p.values()) > 1.0  # fast-reboot boosts the newcomers

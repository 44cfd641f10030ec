"""Live rounds on loopback: progress, forced participation equals the simulator, arrivals, departures."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from coordinator.metrics import read_metrics
from edge_agent.config import ParticipationConfig
from simulator.engine import SimConfig, run_simulation
from simulator.participation import FixedParticipation




def _metrics(fleet):
    return read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")


def test_rounds_complete_and_accuracy_rises(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=6, n_devices=3, min_devices=3, iid=True, alpha=0.0, beta=0.0,
                                      total_samples=3000))
    for i in range(3):
        fleet.start_agent(i)
    assert fleet.coordinator.wait(timeout=60)
    rows = _metrics(fleet)
    assert [r["round"] for r in rows] == list(range(1, 7))
    assert all(set(r["s"].values()) == {5} for r in rows)  # no deadline pressure at this size
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]
    assert rows[-1]["test_acc"] > rows[0]["test_acc"]
    # Bytes on the wire: the model out and the delta in, each at least the model's size.
    model_bytes = sum(p.numel() * 4 for p in fleet.coordinator.engine.params.values())
    assert all(model_bytes <= v < 1.1 * model_bytes for v in rows[-1]["bytes_out"].values())
    assert all(model_bytes <= v < 1.1 * model_bytes for v in rows[-1]["bytes_in"].values())
    assert (fleet.coordinator.out_dir / "checkpoint.pt").exists()


def test_live_model_equals_simulated_model_under_forced_participation(live_config, fleet_factory, wait_for):
    schedule = [[5, 2, 0, 3], [1, 5, 4, 0], [3, 3, 5, 1]]  # s[round][device], incl. inactive devices
    cfg = live_config(rounds=3, n_devices=4, min_devices=4, deadline_s=30.0, scheme="C")
    fleet = fleet_factory(cfg)
    for i in range(4):  # join in index order so registry index == shard index == simulator device
        fleet.start_agent(i, participation=ParticipationConfig(forced_updates=tuple(row[i] for row in schedule)))
        wait_for(lambda: f"dev-{i}" in fleet.coordinator.engine.registry, what=f"dev-{i} to join")
    assert fleet.coordinator.wait(timeout=60)
    t = cfg.training
    sim = run_simulation(
        SimConfig(dataset=t.dataset, iid=t.iid, alpha=t.alpha, beta=t.beta, n_devices=4, rounds=3,
                  E=t.required_updates, scheme="C", seed=0, total_samples=t.total_samples),
        participation=FixedParticipation(schedule, E=t.required_updates),
    )
    live = fleet.coordinator.engine.params
    for name, value in sim.final_params.items():
        torch.testing.assert_close(live[name], value, rtol=1e-4, atol=1e-5)
    rows = _metrics(fleet)
    assert [list(r["s"].values()) for r in rows] == schedule
    np.testing.assert_allclose([r["test_acc"] for r in rows], [r.test_acc for r in sim.records], atol=1e-6)


def test_late_joiner_gets_boosted_coefficient_and_rate_reset(live_config, fleet_factory, wait_for):
    cfg = live_config(rounds=8, n_devices=4, min_devices=3, deadline_s=2.0)
    fleet = fleet_factory(cfg)
    for i in range(3):
        fleet.start_agent(i)
    wait_for(lambda: fleet.coordinator.engine.completed_round >= 3, what="round 3")
    fleet.start_agent(3)
    assert fleet.coordinator.wait(timeout=60)
    rows = _metrics(fleet)
    arrival = next(r for r in rows if "dev-3" in r["arrivals"])
    tau0 = arrival["round"]
    first, second = rows[tau0], rows[tau0 + 1]  # rounds tau0 + 1 and tau0 + 2
    n = fleet.coordinator.engine.objective.sample_counts
    p_l = n["dev-3"] / sum(n.values())
    assert first["p"]["dev-3"] == pytest.approx(3 * p_l)  # fast-reboot: 3 p_l at arrival
    assert second["p"]["dev-3"] == pytest.approx(p_l * (1 + 2 / 4))  # decaying as (r + 1)^-2
    eta0 = cfg.training.resolved_eta0
    assert first["lr"] == pytest.approx(eta0)  # eta_0 / (tau - tau_0) restarts
    assert second["lr"] == pytest.approx(eta0 / 2)
    assert rows[tau0 - 1]["lr"] == pytest.approx(eta0 / tau0)
    # The existing devices' weights were renormalised over the enlarged objective.
    assert first["p"]["dev-0"] == pytest.approx(n["dev-0"] / sum(n.values()))
    assert first["s"]["dev-3"] > 0 and first["coefficients"]["dev-3"] > 0


@pytest.mark.parametrize("policy", ["include", "exclude"])
def test_departure_policy_changes_p_as_specified(live_config, fleet_factory, policy, wait_for):
    cfg = live_config(rounds=7, n_devices=3, min_devices=3, departure_policy=policy)
    fleet = fleet_factory(cfg)
    agents = [fleet.start_agent(i) for i in range(3)]
    wait_for(lambda: fleet.coordinator.engine.completed_round >= 2, what="round 2")
    agents[2].stop(announce=True)
    assert fleet.coordinator.wait(timeout=60)
    rows = _metrics(fleet)
    dep = next(r for r in rows if "dev-2" in r["departures"])
    after = rows[dep["round"]]  # first round after the departure took effect
    n = {d: len(fleet.agents[d][0].shard) for d in ("dev-0", "dev-1", "dev-2")}
    if policy == "include":
        assert after["p"]["dev-2"] == pytest.approx(n["dev-2"] / sum(n.values()))
        assert after["s"]["dev-2"] == 0 and after["coefficients"]["dev-2"] == 0
        assert after["lr"] == pytest.approx(cfg.training.resolved_eta0 / after["round"])
    else:
        assert "dev-2" not in after["p"]
        assert after["p"]["dev-0"] == pytest.approx(n["dev-0"] / (n["dev-0"] + n["dev-1"]))
        assert after["lr"] == pytest.approx(cfg.training.resolved_eta0)  # objective shift
    assert "dev-2" not in after["participants"]

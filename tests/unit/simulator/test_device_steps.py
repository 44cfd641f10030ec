"""Counting a run's SGD steps without training gives what the engine computes when it trains."""

from dataclasses import replace

import pytest

from coordinator.rules.config import RulesConfig
from flexfl.run_spec import RunSpec
from simulator.device_steps import count_group, count_run, round_work
from simulator.engine import (
    ArrivalEvent,
    DepartureEvent,
    ScheduleConfig,
    SimConfig,
    TracesConfig,
    load_data,
    run_simulation,
)
from simulator.paper.schemes import comparison_groups
from workloads.partition_spec import PartitionSpec

# E in epochs on Pareto sizes: devices' steps per epoch differ, so a count of rows or of s would be wrong.
EPOCHS = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=8, total_samples=1200),
                   rules=RulesConfig(required_updates=3, unit="epoch"), traces=TracesConfig(num_traces=8),
                   run=RunSpec(rounds=5))


@pytest.mark.parametrize("scheme", ["A", "B", "C"])
def test_counted_steps_equal_the_engines_device_updates(scheme):
    cfg = replace(EPOCHS, rules=replace(EPOCHS.rules, scheme=scheme))
    data = load_data(cfg)
    assert len({-(-len(d) // 20) for d in data.train}) >= 2  # ragged: steps per epoch differ between devices
    trained = run_simulation(cfg, data=data)
    counted = count_run(cfg, data=data)
    assert counted.device_steps == trained.device_updates
    # Rows per round: A trains the complete devices only, B and C every device with s > 0.
    works = list(round_work(cfg, data=data))
    rows = [len(w.rows) for w in works]
    expected = [r.complete if scheme == "A" else r.active for r in trained.records]
    assert rows == expected
    assert sum(rows) == counted.device_rounds
    assert any(r.complete < r.active for r in trained.records)  # A and B/C differ: the branch is reached


def test_count_follows_arrivals_and_departures():
    cfg = replace(EPOCHS.with_run(rounds=6), schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=2, round=2),),
                                                            departures=(DepartureEvent(device=5, round=3),)))
    data = load_data(cfg)
    counted = count_run(cfg, data=data)
    assert counted.device_steps == run_simulation(cfg, data=data).device_updates
    trained_by_round = [{int(k) for k in w.shards} for w in round_work(cfg, data=data)]
    assert all(2 not in t for t in trained_by_round[:2]) and any(2 in t for t in trained_by_round[2:])
    assert any(5 in t for t in trained_by_round[:3]) and all(5 not in t for t in trained_by_round[3:])


def test_a_group_counts_only_the_runs_it_computes():
    """|T| = 1: every device completes, A = B = C, the sweep computes A once; |T| = 8: all three."""
    groups = comparison_groups(EPOCHS.with_run(rounds=2), settings=["niid"], num_traces=[1, 8], seeds=[0])
    data = load_data(groups[0].runs[0].config)
    one, eight = (count_group(g, data=data) for g in groups)
    assert list(one) == ["niid_T1_seed0_A"]
    assert list(eight) == ["niid_T8_seed0_A", "niid_T8_seed0_B", "niid_T8_seed0_C"]
    everyone = 2 * 3 * sum(-(-len(d) // 20) for d in data.train)  # 2 rounds, E = 3 epochs, all complete
    assert one["niid_T1_seed0_A"].device_steps == everyone
    assert eight["niid_T8_seed0_A"].device_steps < eight["niid_T8_seed0_B"].device_steps
    assert eight["niid_T8_seed0_B"].device_steps == eight["niid_T8_seed0_C"].device_steps

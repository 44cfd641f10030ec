"""The coordinator benchmark's machinery on a small fleet: light agents in two processes, real coordinator."""

from __future__ import annotations

import pytest

from benchmarks.coordinator_bench import run_fleet
from coordinator.round import RulesConfig


@pytest.mark.slow
def test_light_agents_in_two_processes_answer_every_round_with_a_full_size_zero_delta():
    E = RulesConfig().required_updates  # the benchmark's coordinator keeps the default rules
    run = run_fleet(5, rounds=3, dataset="synthetic", per_process=3, measure_memory=False)
    assert [r["round"] for r in run.rows] == [1, 2, 3]
    assert all(r["close_reason"] == "all answered" for r in run.rows)
    assert all(sorted(r["s"]) == [f"bench-{i}" for i in range(5)] and set(r["s"].values()) == {E} for r in run.rows)
    model_bytes = 610 * 4  # SYNTHETIC's logistic regression: 60 x 10 weights + 10 biases, float32
    assert all(model_bytes <= v < 1.2 * model_bytes for r in run.rows for v in r["bytes_in"].values())
    assert len(run.periods()) == 1 and run.periods()[0] > 0
    assert all(r["overhead_s"] is not None for r in run.rows[1:])

"""A round too large to stack is trained in chunks and closed from its RoundSum: the stacked run's rounds.

simulator.local_training.RunTrainer stacks a round's deltas while they fit in STACK_BUDGET_BYTES;
beyond it, each chunk of rows is added to the round's RoundSum (the live coordinator's summed form)
and its buffers reused, so a round's memory is one chunk of model copies (issue 36 item 4).
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Federation, RoundSum
from coordinator.rules.strategies import strategy_names
from flexfl.errors import AggregationError, ConfigError, RoundStateError
from flexfl.run_spec import RunSpec
from simulator.engine import (
    ArrivalEvent,
    DepartureEvent,
    ScheduleConfig,
    SimConfig,
    TracesConfig,
    load_data,
    run_simulation,
)
from simulator.local_training import STACK_BUDGET_BYTES, RunTrainer, rows_per_chunk
from simulator.participation import FixedParticipation
from workloads.federated import initial_model, model_spec
from workloads.partition_spec import PartitionSpec

E = 4
N = 12
# s per round and device: partial work, complete work, idle devices, and (round 3) nobody complete
SCHEDULE = [[4, 2, 0, 4, 1, 3, 4, 4, 2, 0, 4, 3],
            [1, 4, 4, 3, 4, 0, 2, 4, 4, 1, 3, 4],
            [3, 2, 1, 0, 2, 3, 1, 2, 3, 1, 2, 3],
            [4, 4, 4, 4, 0, 4, 4, 2, 4, 4, 1, 4]]
BASE = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=N, total_samples=1800),
                 rules=RulesConfig(required_updates=E), traces=TracesConfig(num_traces=8), run=RunSpec(rounds=6),
                 schedule=ScheduleConfig(arrivals=(ArrivalEvent(device=7, round=2),),
                                         departures=(DepartureEvent(device=0, round=3, policy="exclude"),
                                                     DepartureEvent(device=1, round=4, policy="include"))))


def _run(cfg: SimConfig, data, **kwargs):
    return run_simulation(cfg, data=data, participation=FixedParticipation(SCHEDULE, E=E), **kwargs)


@pytest.mark.parametrize("strategy", strategy_names())
def test_a_round_trained_in_chunks_closes_as_the_stacked_round_does(strategy, monkeypatch):
    rules = BASE.rules.with_strategy(strategy, mu=0.1 if strategy == "fedprox" else None)
    cfg = replace(BASE, rules=rules)
    data = load_data(cfg)
    stacked = _run(cfg, data)
    chunks = []
    real = RoundSum.add_rows
    monkeypatch.setattr(RoundSum, "add_rows", lambda self, devices, **kw: (chunks.append(len(devices)),
                                                                           real(self, devices, **kw))[1])
    chunked = _run(cfg, data, chunk_rows=3)
    assert chunks and max(chunks) == 3 and len(chunks) >= len(SCHEDULE)  # it really ran in chunks of 3
    assert [r["s"] for r in chunked.rows] == [r["s"] for r in stacked.rows]
    assert [(r["p"], r["coefficients"]) for r in chunked.rows] == [(r["p"], r["coefficients"]) for r in stacked.rows]
    assert [(r["arrivals"], r["departures"]) for r in chunked.rows] == \
        [(r["arrivals"], r["departures"]) for r in stacked.rows]
    for a, b in zip(chunked.records, stacked.records):
        assert (a.round, a.lr, a.active, a.complete, a.members) == (b.round, b.lr, b.active, b.complete, b.members)
        assert a.test_loss == pytest.approx(b.test_loss, rel=1e-5)
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-6, nan_ok=True)  # nan: nobody trained
    # Float32 rounding only: a sum of 3-row tensordots against one 12-row tensordot, over 6 rounds.
    for name, w in stacked.final_params.items():
        bound = 64 * torch.finfo(torch.float32).eps * float(w.abs().max())
        assert float((chunked.final_params[name] - w).abs().max()) <= bound, name
    start = initial_model(model_spec(cfg.partition.dataset), seed=cfg.seed)[1]
    assert any(not torch.equal(stacked.final_params[n], start[n]) for n in start)  # the runs trained at all

def _federation(strategy: str = "scheme-c") -> Federation:
    rules = RulesConfig(required_updates=E).with_strategy(strategy, mu=0.1 if strategy == "fedprox" else None)
    fed = Federation(rules=rules, dataset="synthetic",
                     params={"w": torch.zeros(3, 2), "b": torch.zeros(2)}, horizon=10, seed=0)
    fed.apply_events(arrivals=[Arrival(d, n) for d, n in (("a", 10), ("b", 30), ("c", 20), ("d", 40))])
    return fed


@pytest.mark.parametrize("strategy", strategy_names())
def test_rows_added_at_once_make_the_sum_updates_added_one_by_one_make(strategy):
    g = torch.Generator().manual_seed(1)
    s = {"a": 4, "b": 2, "c": 0, "d": 3}
    deltas = {"w": torch.randn(4, 3, 2, generator=g), "b": torch.randn(4, 2, generator=g)}
    one, rows = _federation(strategy), _federation(strategy)
    by_one, at_once = one.start_sum(one.open(1)), rows.start_sum(rows.open(1))
    for i, (d, v) in enumerate(s.items()):
        by_one.add(d, s=v, delta={n: t[i].numpy() for n, t in deltas.items()})
    at_once.add_rows(list(s), s=list(s.values()), deltas=deltas)
    assert at_once.s == by_one.s and at_once.running.weights == pytest.approx(by_one.running.weights)
    assert at_once.sketches.keys() == by_one.sketches.keys()
    for d in by_one.sketches:
        np.testing.assert_allclose(at_once.sketches[d], by_one.sketches[d], rtol=1e-12)
    assert at_once.kept.keys() == by_one.kept.keys()  # MIFA keeps copies, the others none
    for name in deltas:
        torch.testing.assert_close(at_once.running._sum[name], by_one.running._sum[name], rtol=1e-6, atol=1e-7)


def test_rows_that_cannot_enter_are_refused_and_change_nothing():
    fed = _federation()
    summed = fed.start_sum(fed.open(1))
    good = {"w": torch.ones(2, 3, 2), "b": torch.ones(2, 2)}
    summed.add_rows(["a", "b"], s=[4, 2], deltas=good)
    before = ({n: t.clone() for n, t in summed.running._sum.items()}, dict(summed.s), dict(summed.running.weights))
    cases = [
        (["c", "a"], [1, 1], good, AggregationError, "'a' is already in the sum"),
        (["c", "c"], [1, 1], good, AggregationError, "'c' is already in the sum"),
        (["c", "zz"], [1, 1], good, RoundStateError, "'zz', which is not in the objective"),
        (["c", "d"], [1, 9], good, AggregationError, "s"),
        (["c", "d"], [1, 1], {"w": torch.ones(2, 3, 2), "b": torch.ones(2, 3)}, AggregationError,
         r"tensor 'b' has shape \(2, 3\), expected \(2, 2\)"),
        (["c", "d"], [1, 1], {"w": torch.ones(2, 3, 2)}, AggregationError, "tensors"),
    ]
    for devices, s, deltas, error, message in cases:
        with pytest.raises(error, match=message):
            summed.add_rows(devices, s=s, deltas=deltas)
        for n, t in summed.running._sum.items():
            assert torch.equal(t, before[0][n]), (devices, n)
        assert (summed.s, summed.running.weights) == (before[1], before[2]), devices


def test_the_default_budget_keeps_every_paper_round_stacked_and_bounds_a_large_one():
    params = initial_model(model_spec("mnist"), seed=0)[1]
    row = 4 * sum(p.numel() for p in params.values())
    chunk = rows_per_chunk(params)
    assert chunk * row <= STACK_BUDGET_BYTES < (chunk + 1) * row
    assert chunk >= 100  # the paper's rounds have at most 100 devices: stacked, as committed
    assert rows_per_chunk(params, budget_bytes=1) == 1
    with pytest.raises(ConfigError, match="chunk_rows must be at least 1"):
        RunTrainer(BASE, initial_model(model_spec("synthetic"), seed=0)[0], load_data(BASE), chunk_rows=0)

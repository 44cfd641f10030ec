"""FedBuff: the strategy's formulas, and the asynchronous event loop on the simulated clock (simulator.async_run)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Federation
from coordinator.rules.strategies import configured, get_strategy, strategy_names
from edge_agent.trainer import device_rng, train_local
from flexfl.app.cli import main
from flexfl.errors import AggregationError, ConfigError
from flexfl.run_spec import RunSpec
from flexfl.vocabulary import DeparturePolicy
from simulator.clock import ClockConfig, RoundClock
from simulator.engine import ArrivalEvent, ScheduleConfig, SimConfig, load_data, run_simulation
from simulator.sim_config import DepartureEvent
from simulator.timeline_source import TimelineRun, timeline_participation
from simulator.trainers.trainer_kind import TrainerKind
from workloads.federated import initial_model
from workloads.partition_spec import PartitionSpec

E, D = 4, 10.0
PART = PartitionSpec(dataset="synthetic", n_devices=2, total_samples=400)


def fedbuff_cfg(rounds: int = 3, **params) -> SimConfig:
    rules = RulesConfig(required_updates=E, eta0=0.5).with_strategy("fedbuff", params=params)
    return SimConfig(partition=PART, rules=rules, run=RunSpec(rounds=rounds), trainer=TrainerKind.PLAIN)


class Speeds:
    """A source of s with a clock: device k always completes s[k] of E within the deadline D (a trace set whose
    traces are constant), so that its tasks take D E / s[k] (simulator.clock)."""

    def __init__(self, s: list[int]) -> None:
        self.s, self.clock, self.trace_names = s, RoundClock(deadline_s=D), [f"speed {v}" for v in s]

    def draw(self, shard: int, round_index: int) -> int:
        return self.s[shard]

    def work_times(self, shard: int, round_index: int):
        return None


# -- the strategy's rule -------------------------------------------------------------------------------------------


def test_staleness_weights_and_the_buffer_steps_factors() -> None:
    rule = configured("fedbuff", {"buffer": 4, "server_lr": 0.5, "es_factor": True})
    t = np.array([0, 1, 3, 8])
    assert np.allclose(rule.staleness_weights(t), [1, 1 / math.sqrt(2), 0.5, 1 / 3])
    assert np.allclose(configured("fedbuff", {"staleness": "constant"}).staleness_weights(t), 1.0)
    s, p = np.array([4, 2, 1, 0]), rule.staleness_weights(t)
    assert np.allclose(rule.arrival_weights(s=s, E=4, p=p), p * [1, 2, 4, 0])  # E / s, 0 for nothing
    plain = configured("fedbuff", {"buffer": 4})
    assert np.allclose(plain.arrival_weights(s=s, E=4, p=p), p * [1, 1, 1, 0])
    assert rule.round_scale(s=s, E=4, p=p) == 0.5 / 4
    assert rule.asynchronous and not get_strategy("scheme-c").asynchronous
    assert "fedbuff" not in strategy_names() and "fedbuff" in strategy_names(asynchronous=True)
    with pytest.raises(AggregationError, match="staleness must be integers >= 0"):
        rule.staleness_weights(np.array([-1]))


@pytest.mark.parametrize("params, message", [
    ({"buffer": 0}, "buffer .* must be an integer >= 1"),
    ({"concurrency": -1}, "concurrency .* must be an integer >= 0"),
    ({"server_lr": 0.0}, "server_lr must be a number > 0"),
    ({"staleness": "linear"}, "linear"),
    ({"buffr": 3}, "buffr"),
])
def test_bad_fedbuff_parameters_say_which(params: dict, message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        configured("fedbuff", params)


def test_a_round_engine_refuses_fedbuff() -> None:
    rules = RulesConfig(required_updates=E).with_strategy("fedbuff")
    _, params = initial_model("synthetic", seed=0)
    with pytest.raises(ConfigError, match="FedBuff has no rounds"):
        Federation(rules=rules, dataset="synthetic", params=params)


# -- the event loop ------------------------------------------------------------------------------------------------


def test_the_clock_orders_arrivals_and_staleness_counts_server_steps_since_the_pull() -> None:
    """dev-0 does E in D, dev-1 E in 2D; K = 1, both train at once. dev-0 arrives at D (step 1) and pulls again; at 2D
    dev-1 (pulled at step 0, started first) arrives one step stale, then dev-0 (pulled at step 1) one step stale."""
    cfg = fedbuff_cfg(rounds=3, buffer=1)
    result = run_simulation(cfg, data=load_data(cfg), participation=Speeds([E, E // 2]))
    rows = result.records
    assert [r.clock_s for r in rows] == [D, 2 * D, 2 * D]
    assert [dict(r.staleness or {}) for r in rows] == [{"dev-0": 0}, {"dev-1": 1}, {"dev-0": 1}]
    assert [dict(r.s) for r in rows] == [{"dev-0": E}, {"dev-1": E}, {"dev-0": E}]
    assert [r.coefficients[d] for r, d in zip(rows, ("dev-0", "dev-1", "dev-0"))] == \
        pytest.approx([1.0, 1 / math.sqrt(2), 1 / math.sqrt(2)])


def test_an_asynchronous_run_ends_at_its_first_step_at_or_after_until_s() -> None:
    cfg = replace(fedbuff_cfg(rounds=100, buffer=1), clock=ClockConfig(until_s=2.5 * D))
    rows = run_simulation(cfg, data=load_data(cfg), participation=Speeds([E, E // 2])).records
    assert [r.clock_s for r in rows] == [D, 2 * D, 2 * D, 3 * D]  # 3D is the first step at or after 2.5 D
    with pytest.raises(ConfigError, match="FedBuff has no rounds to wait in"):
        run_simulation(replace(cfg, clock=ClockConfig(wait_all=True)), data=load_data(cfg),
                       participation=Speeds([E, E]))


def test_arrivals_and_departures_count_server_steps() -> None:
    """dev-2 arrives once step 2 is taken; dev-0 departs at step 3: no task of its after that, an update on its way
    dropped; exclude takes it out of the tested objective, include keeps it there."""
    three = PartitionSpec(dataset="synthetic", n_devices=3, total_samples=600)
    events = ScheduleConfig(arrivals=(ArrivalEvent(device=2, round=2),),
                            departures=(DepartureEvent(device=0, round=3),))
    for policy, members_after in ((DeparturePolicy.EXCLUDE, 2), (DeparturePolicy.INCLUDE, 3)):
        cfg = replace(fedbuff_cfg(rounds=9, buffer=1), partition=three, schedule=events,
                      rules=replace(fedbuff_cfg().rules, departure_policy=policy))
        rows = run_simulation(cfg, data=load_data(cfg), participation=Speeds([E, E, E])).records
        assert [r.members for r in rows] == [2, 3] + [members_after] * 7
        assert [r.arrivals for r in rows][:3] == [(), ("dev-2",), ()]
        assert rows[2].departures == ("dev-0",) and rows[2].departure_policies == {"dev-0": str(policy)}
        assert all("dev-2" not in r.participants for r in rows[:2])
        assert any("dev-2" in r.participants for r in rows[2:])
        assert all("dev-0" not in r.participants for r in rows[3:])
    auto = replace(cfg, rules=replace(cfg.rules, departure_policy=DeparturePolicy.AUTO))
    with pytest.raises(ConfigError, match=r"departs under auto.*include or exclude"):
        run_simulation(auto, data=load_data(auto), participation=Speeds([E, E, E]))


def test_one_device_at_a_time_without_staleness_is_sequential_local_sgd() -> None:
    """concurrency 1, K = 1, server_lr 1: every server step is w <- w + delta of one device trained from w, at the
    rate eta_0 / (1 + floor(accepted / N)), with device k's j-th task's minibatches device_rng(seed, j, k)."""
    cfg = fedbuff_cfg(rounds=5, buffer=1, concurrency=1)
    data = load_data(cfg)
    result = run_simulation(cfg, data=data, participation=Speeds([E, E]))
    model, w = initial_model("synthetic", seed=cfg.seed)
    tasks = [0, 0]
    for step, row in enumerate(result.records):
        (device,) = row.participants
        k = int(device.removeprefix("dev-"))
        tasks[k] += 1
        lr = 0.5 / (1 + step // 2)
        assert row.lr == pytest.approx(lr)
        model.load_state_dict({n: t.clone() for n, t in w.items()})
        res = train_local(model, data.train[k], updates=E, lr=lr, batch_size=cfg.rules.batch_size_for("synthetic"),
                          rng=device_rng(cfg.seed, tasks[k], k), unit="step")
        w = {n: w[n] + res.delta[n] for n in w}
    for n in w:
        torch.testing.assert_close(result.final_params[n], w[n], rtol=1e-5, atol=1e-6)
    assert sorted({r.participants[0] for r in result.records}) == ["dev-0", "dev-1"]  # the draw used both


def test_a_budget_cuts_a_task_at_the_deadline_and_the_es_factor_weighs_it_up() -> None:
    cfg = fedbuff_cfg(rounds=2, buffer=2, budget=True, es_factor=True, staleness="constant")
    rows = run_simulation(cfg, data=load_data(cfg), participation=Speeds([E, 1])).records
    assert [r.clock_s for r in rows] == [D, 2 * D]  # both end at the deadline
    assert dict(rows[0].s) == {"dev-0": E, "dev-1": 1} or dict(rows[0].s) == {"dev-1": 1, "dev-0": E}
    assert rows[0].coefficients == pytest.approx({"dev-0": 1 / 2, "dev-1": E / 2})
    unscaled = run_simulation(fedbuff_cfg(rounds=1, buffer=2, budget=True), data=load_data(cfg),
                              participation=Speeds([E, 1])).records[0]
    assert unscaled.coefficients == pytest.approx({"dev-0": 1 / 2, "dev-1": 1 / 2})


def test_a_run_is_a_function_of_its_config() -> None:
    cfg = fedbuff_cfg(rounds=6, buffer=2, concurrency=1)
    one, two = (run_simulation(cfg, data=load_data(cfg), participation=Speeds([E, 2])) for _ in range(2))
    assert one.rows == two.rows  # every field but the host's seconds
    other = run_simulation(cfg.with_run(seed=5), data=load_data(cfg), participation=Speeds([E, 2]))
    assert [r.participants for r in other.records] != [r.participants for r in one.records] or \
        not torch.equal(other.final_params["linear.weight"], one.final_params["linear.weight"])


def test_what_an_asynchronous_run_refuses() -> None:
    cfg = fedbuff_cfg()
    data = load_data(cfg)

    no_clock = Speeds([E, E])
    no_clock.clock = None  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="runs on the simulated clock"):
        run_simulation(cfg, data=data, participation=no_clock)
    with pytest.raises(ConfigError, match="no device could start a task"):
        run_simulation(cfg, data=data, participation=Speeds([0, 0]))


TIMELINE = """\
device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online
dev-0,0,100,1.0,1000,1000,1
dev-1,0,5,0.25,1000,1000,0
dev-1,5,100,0.25,1000,1000,1
"""


def test_a_timelines_tasks_take_their_conditions_times(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(TIMELINE)
    cfg = fedbuff_cfg(rounds=3, buffer=1)
    data = load_data(cfg)
    source = timeline_participation(cfg, TimelineRun(path=str(path), deadline_s=5.0, update_s=0.5),
                                    sample_counts=list(data.sample_counts))
    transfer = 2 * 8 * source.model_bytes / 1000 / 1000  # down and up at 1000 kbit/s
    full, quarter = source.task_at(0, 0.0, budget=False), source.task_at(1, 6.0, budget=False)
    assert full is not None and quarter is not None
    assert (full.s, full.duration_s) == (E, pytest.approx(E * 0.5 + transfer))
    assert (quarter.s, quarter.duration_s) == (E, pytest.approx(E * 2.0 + transfer))
    assert source.task_at(1, 1.0, budget=False) is None  # offline
    # Within the 5 s deadline, less the margin and the transfers, two updates of 2 s fit.
    cut = source.task_at(1, 6.0, budget=True)
    assert cut is not None and cut.s == 2 and cut.duration_s == pytest.approx(2 * 2.0 + transfer)
    rows = run_simulation(cfg.with_run(rounds=8), data=data, participation=source).records
    # dev-0 arrives every 2.04 s; dev-1 is offline until second 5, retries at the next round start (every 5 s),
    # pulls after dev-0's steps at 2.04 and 4.08 s and arrives 8.04 s later, after dev-0's four more: 4 steps stale.
    (late,) = [r for r in rows if "dev-1" in r.participants]
    assert late.clock_s == pytest.approx(5.0 + E * 2.0 + transfer)
    assert dict(late.staleness or {}) == {"dev-1": 4} and late.round == 7
    assert [r.participants for r in rows if r is not late] == [("dev-0",)] * 7


def test_sim_run_fedbuff_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["sim", "run", "--dataset", "synthetic", "--devices", "6", "--total-samples", "600", "--E", "5",
                 "--rounds", "4", "--strategy", "fedbuff", "--buffer", "3", "--deadline-s", "10",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "fedbuff" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert all(sum(r["s"].values()) == 3 * 5 for r in rows)  # three updates of E each per step
    clocks = [r["clock_s"] for r in rows]
    assert clocks == sorted(clocks) and clocks[0] >= 10.0  # a task takes at least the deadline (s <= E in D)
    assert rows[0]["rules"]["strategy"] == {"name": "fedbuff", "buffer": 3}
    page = (out / "fedbuff" / "report.html").read_text()  # the report counts server steps, not rounds
    assert "<b>4</b><span>server steps</span>" in page and 'alt="test accuracy against time"' in page
    assert main(["sim", "run", "--buffer", "3", "--scheme", "C", "--out", str(tmp_path / "x")]) == 2
    assert "--buffer: FedBuff's parameters; run it with --scheme fedbuff" in capsys.readouterr().err

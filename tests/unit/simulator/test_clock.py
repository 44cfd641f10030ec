"""The simulated clock (simulator.clock): device times from a timeline or a trace's fraction, rounds' clock_s."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from coordinator.rules.config import RulesConfig
from coordinator.rules.round_record import RoundRecord
from flexfl.app.cli import main
from flexfl.errors import ConfigError
from flexfl.run_spec import RunSpec
from simulator.clock import ClockConfig, RoundClock, clock_of, times_from_fraction
from simulator.engine import SimConfig, load_data, run_simulation
from simulator.participation import FixedParticipation, TraceParticipation
from simulator.timeline_source import TimelineRun, timeline_participation
from trace_recorder.deadline import updates_before_deadline
from trace_recorder.format import Trace, TraceManifest, read_trace_set, utc_now_iso, write_trace_set
from workloads.partition_spec import PartitionSpec

CFG = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=3, total_samples=600),
                rules=RulesConfig(required_updates=5), run=RunSpec(rounds=4))
E = 5

TIMELINE = """\
device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online
dev-0,0,2,1.0,1000,1000,1
dev-0,2,10,0.25,100,500,1
dev-1,0,1,0.5,1000,1000,1
dev-1,1,10,0.5,1000,1000,0
dev-2,0,10,0.0,1000,1000,1
"""


def test_a_round_lasts_its_deadline_and_rounds_start_every_round_s() -> None:
    back_to_back = RoundClock(deadline_s=2.5)
    assert [back_to_back.closes_s(t) for t in (1, 2, 3)] == [2.5, 5.0, 7.5]
    spaced = RoundClock(deadline_s=2.0, round_s=3.0)
    assert [(spaced.opens_s(t), spaced.closes_s(t)) for t in (1, 2)] == [(0.0, 2.0), (3.0, 5.0)]
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ConfigError, match="deadline_s must be a finite number of seconds > 0"):
            RoundClock(deadline_s=bad)
        with pytest.raises(ConfigError, match=r"clock.deadline_s must be a finite number"):
            ClockConfig(deadline_s=bad)


def test_a_fraction_of_the_deadline_gives_a_speed_and_nothing_at_zero() -> None:
    times = times_from_fraction(4, deadline_s=2.0)
    assert times is not None and times.per_update_s == 0.5 and times.finish_s(4) == 2.0 and times.finish_s(E) == 2.5
    assert times_from_fraction(0, deadline_s=2.0) is None


def test_timeline_times_are_the_deadline_rules_own_arithmetic(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(TIMELINE)
    run = TimelineRun(path=str(path), deadline_s=2.0, update_s=0.1, round_s=1.5)
    data = load_data(CFG)
    source = timeline_participation(CFG, run, sample_counts=list(data.sample_counts))
    assert clock_of(source) == RoundClock(deadline_s=2.0, round_s=1.5)
    kbit = 8 * source.model_bytes / 1000
    fast, slow = source.work_times(0, 1), source.work_times(0, 3)  # round 3 reads second 3: the slow row
    assert fast is not None and slow is not None
    assert fast == (kbit / 1000, 0.1, kbit / 1000)
    assert slow == pytest.approx((kbit / 500, 0.4, kbit / 100))
    assert source.work_times(1, 2) is None  # offline at second 1.5
    no_cpu = source.work_times(2, 1)
    assert no_cpu is not None and no_cpu.per_update_s == math.inf
    # The s the same source gives is the largest that fits: its times and the margin within the deadline.
    for shard, tau in ((0, 1), (0, 3), (1, 1)):
        t = source.work_times(shard, tau)
        assert t is not None
        s = source.draw(shard, tau)
        assert t.finish_s(s) <= run.deadline_s - run.margin_s + 1e-9
        assert s == E or t.finish_s(s + 1) > run.deadline_s - run.margin_s
        conditions = source.timeline.conditions_at(source.names[shard], source.time_of(tau))
        assert s == updates_before_deadline(conditions, E=E, deadline_s=2.0, update_s=0.1,
                                            model_bytes=source.model_bytes, margin_s=run.margin_s).s
    result = run_simulation(CFG, data=data, participation=source)
    assert [r.clock_s for r in result.records] == [2.0, 3.5, 5.0, 6.5]


def _recorded_set(tmp_path: Path, *, deadline_s: float | None) -> Path:
    out, names = tmp_path / f"set-{deadline_s}", ("T0", "T1")
    rng = np.random.default_rng(0)
    traces = [Trace(name=n, round=np.arange(1, 9), fraction=rng.integers(0, E + 1, 8) / E) for n in names]
    write_trace_set(out, TraceManifest(
        schema_version=1, name="clock", kind="recorded" if deadline_s else "calibrated", description="test",
        source={"test": True}, required_updates=E, deadline_s=deadline_s, traces=names,
        conditions={n: {} for n in names}, hosts=(), created=utc_now_iso()), traces)
    return out


def test_a_trace_sets_clock_is_its_recorded_deadline_or_the_configs(tmp_path: Path) -> None:
    cfg = replace(CFG, traces=replace(CFG.traces, num_traces=2))
    recorded = read_trace_set(_recorded_set(tmp_path, deadline_s=0.75))
    source = TraceParticipation(recorded, cfg)
    assert clock_of(source) == RoundClock(deadline_s=0.75)
    for shard in range(3):
        for tau in (1, 2, 3):
            s, t = source.draw(shard, tau), source.work_times(shard, tau)
            assert (t is None) if s == 0 else (t is not None and t.finish_s(s) == pytest.approx(0.75))
    assert [r.clock_s for r in run_simulation(cfg, traces=recorded).records] == [0.75, 1.5, 2.25, 3.0]
    # [clock] deadline_s is given precedence over the set's; a set without a deadline gives no clock.
    assert clock_of(TraceParticipation(recorded, replace(cfg, clock=ClockConfig(deadline_s=2.0)))) == RoundClock(2.0)
    calibrated = read_trace_set(_recorded_set(tmp_path, deadline_s=None))
    assert clock_of(TraceParticipation(calibrated, cfg)) is None
    assert {r.clock_s for r in run_simulation(cfg, traces=calibrated).records} == {None}
    assert clock_of(FixedParticipation([[E, E, E]], E=E)) is None


def test_clock_s_is_in_the_rows_and_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["sim", "run", "--dataset", "synthetic", "--devices", "3", "--total-samples", "600", "--E", "5",
                 "--rounds", "3", "--scheme", "C", "--deadline-s", "4", "--out", str(out)]) == 0
    lines = (out / "C" / "metrics.jsonl").read_text().splitlines()
    records = [RoundRecord.from_json(json.loads(line), where=f"line {i}") for i, line in enumerate(lines, 1)]
    assert [r.clock_s for r in records] == [4.0, 8.0, 12.0]
    assert RoundRecord.from_json(records[0].to_json(), where="again") == records[0]
    # The report draws accuracy against the clock (a run without one has no such figure).
    page = tmp_path / "report.html"
    assert main(["report", str(out / "C"), "--out", str(page)]) == 0
    assert 'alt="test accuracy against time"' in page.read_text()
    assert "<b>3</b><span>rounds</span>" in page.read_text()
    assert main(["sim", "run", "--dataset", "synthetic", "--devices", "3", "--total-samples", "600", "--E", "5",
                 "--rounds", "2", "--scheme", "C", "--out", str(tmp_path / "no-clock")]) == 0
    assert main(["report", str(tmp_path / "no-clock" / "C"), "--out", str(page)]) == 0
    assert 'alt="test accuracy against time"' not in page.read_text()


def test_rounds_that_wait_for_all_close_when_the_last_participant_arrives(tmp_path: Path) -> None:
    """FedAvg waiting for everyone: s is E or 0, a round opens at the last close and lasts its slowest device."""
    cfg = replace(CFG, traces=replace(CFG.traces, num_traces=2), clock=ClockConfig(wait_all=True))
    recorded = read_trace_set(_recorded_set(tmp_path, deadline_s=0.75))
    plain = TraceParticipation(recorded, replace(cfg, clock=None))
    result = run_simulation(cfg, traces=recorded)
    opened = 0.0
    for r in result.records:
        draws = {k: plain.draw(k, r.round) for k in range(3)}
        assert {d: r.s[d] for d in r.s} == {f"dev-{k}": E if s else 0 for k, s in draws.items()}
        assert all(r.coefficients[f"dev-{k}"] == 0 for k, s in draws.items() if s == 0)
        longest = max((0.75 * E / s for s in draws.values() if s), default=0.75)  # E updates at D / s each
        assert r.clock_s == pytest.approx(opened + longest)
        opened = r.clock_s
    # The same draws closed at the deadline: every round 0.75 s, partial work kept.
    assert [r.clock_s for r in run_simulation(replace(cfg, clock=None), traces=recorded).records] == \
        [0.75, 1.5, 2.25, 3.0]


def test_waiting_for_all_on_a_timeline_reads_the_conditions_at_each_opening(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(TIMELINE)
    run = TimelineRun(path=str(path), deadline_s=2.0, update_s=0.1)
    cfg = replace(CFG, clock=ClockConfig(wait_all=True))
    data = load_data(cfg)
    source = timeline_participation(cfg, run, sample_counts=list(data.sample_counts))
    result = run_simulation(cfg, data=data, participation=source)
    kbit = 8 * source.model_bytes / 1000
    fast = kbit / 1000 + E * 0.1 + kbit / 1000  # dev-0 before second 2; dev-1 the same at cpu 0.5: 2x per update
    dev1 = kbit / 1000 + E * 0.2 + kbit / 1000
    first = result.records[0]
    assert first.s == {"dev-0": E, "dev-1": E, "dev-2": 0}  # dev-2 has no CPU: it never finishes, nobody waits
    assert first.clock_s == pytest.approx(max(fast, dev1))
    later = result.records[1]  # opens after second 1: dev-1 offline, dev-0 still fast until second 2
    assert later.s == {"dev-0": E, "dev-1": 0, "dev-2": 0}
    assert later.clock_s == pytest.approx(first.clock_s + fast)
    reasons = [json.loads(json.dumps(row)).get("stop_reason") for row in result.rows]
    assert reasons[0] == {"dev-0": "complete", "dev-1": "complete", "dev-2": "offline"}
    with pytest.raises(ConfigError, match=r"--wait-all.*need the simulated clock"):
        run_simulation(replace(cfg, traces=replace(CFG.traces, num_traces=2)),
                       traces=read_trace_set(_recorded_set(tmp_path, deadline_s=None)))


def test_sim_run_wait_all_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["sim", "run", "--dataset", "synthetic", "--devices", "3", "--total-samples", "600", "--E", "5",
                 "--rounds", "3", "--scheme", "C", "--deadline-s", "4", "--wait-all", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "C" / "metrics.jsonl").read_text().splitlines()]
    assert all(set(row["s"].values()) <= {0, E} for row in rows)
    clocks = [row["clock_s"] for row in rows]
    assert clocks == sorted(clocks) and clocks[0] > 0
    assert "wait_all = true" in (out / "C" / "sim.toml").read_text()


def test_a_run_ends_at_its_first_close_at_or_after_until_s(tmp_path: Path) -> None:
    cfg = replace(CFG, traces=replace(CFG.traces, num_traces=2), run=RunSpec(rounds=50))
    recorded = read_trace_set(_recorded_set(tmp_path, deadline_s=0.75))
    timed = run_simulation(replace(cfg, clock=ClockConfig(until_s=2.0)), traces=recorded).records
    assert [r.clock_s for r in timed] == [0.75, 1.5, 2.25]  # 2.25 is the first close at or after 2.0
    waiting = run_simulation(replace(cfg, clock=ClockConfig(wait_all=True, until_s=6.0)), traces=recorded).records
    assert waiting[-1].clock_s is not None and waiting[-1].clock_s >= 6.0
    assert all(r.clock_s is not None and r.clock_s < 6.0 for r in waiting[:-1])
    untimed = run_simulation(replace(cfg, run=RunSpec(rounds=4), clock=ClockConfig(until_s=1.0)),
                             traces=read_trace_set(_recorded_set(tmp_path, deadline_s=None))).records
    assert len(untimed) == 4  # no clock: rounds alone end it
    with pytest.raises(ConfigError, match=r"clock.until_s must be a finite number"):
        ClockConfig(until_s=0.0)

"""What each report section counts, on hand-made per-round records (see conftest.ROUNDS)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flexfl.app.report import plots
from flexfl.app.report.data import SweepDataset, read_run
from flexfl.app.report.sections import (
    Cell,
    coefficient_matrix,
    device_table,
    durations,
    participation,
    run_summary,
    stop_reasons,
    sweep_table,
    trace_table,
    traffic,
)

REPO = Path(__file__).resolve().parents[3]
A, I, R, S = Cell.ABSENT, Cell.INACTIVE, Cell.REJECTED, Cell.ACTIVE  # noqa: E741 (the table's own letters)


def test_participation_tells_active_inactive_rejected_and_absent_apart(live_dir):
    run = read_run(live_dir)
    part = participation(run, list(run.rounds))
    assert part.devices == ["dev-0", "dev-1", "dev-2", "dev-3"] and part.rounds == [1, 2, 3, 4]
    np.testing.assert_array_equal(part.state, [
        [S, S, S, A],  # dev-0 departs during round 3
        [S, R, S, S],  # dev-1: round 2's only update was rejected
        [I, S, S, S],  # dev-2: nothing in round 1; round 3 rejected once, then a valid s = 5
        [A, A, S, S],  # dev-3 arrives during round 2, trains from round 3
    ])
    np.testing.assert_allclose(part.fraction[:, 2], [0.8, 1.0, 0.5, 0.2])
    assert np.isnan(part.fraction[1, 1]) and np.isnan(part.fraction[3, 0])
    assert part.rejected_any[1, 1] and part.rejected_any[2, 2] and part.rejected_any.sum() == 2
    assert part.scale == "E = 10"


def test_without_E_the_scale_is_the_largest_s_and_says_so(live_dir):
    run = read_run(live_dir)
    run = type(run)(**{**run.__dict__, "required_updates": None})
    part = participation(run, list(run.rounds))
    assert part.scale == "max s = 10 (E unknown)"
    assert np.nanmax(part.fraction) == 1.0


def test_device_table_counts_over_the_rounds_a_device_took_part_in(live_dir):
    run = read_run(live_dir)
    rows = {d.device: d for d in device_table(run, list(run.rounds))}
    d0, d1, d2, d3 = (rows[f"dev-{i}"] for i in range(4))
    assert (d0.trace, d0.shard, d0.rounds_participant, d0.first_round, d0.last_round) == ("T0", 0, 3, 1, 3)
    assert d0.mean_s_over_E == pytest.approx((10 + 10 + 8) / 3 / 10)
    assert d0.departed_after == 3 and d0.arrived_after is None
    assert d1.rounds_inactive == 1 and d1.rejected == 1
    assert d1.reasons == [("tensor 'fc.weight' has shape (3,) not (10, 5)", 1)]
    assert d2.rounds_inactive == 1 and d2.rejected == 1 and d2.reasons == [("update contains NaN", 1)]
    assert d2.mean_s_over_E == pytest.approx((0 + 6 + 5 + 10) / 4 / 10)
    assert (d3.trace, d3.arrived_after, d3.rounds_participant, d3.first_round) == (None, 2, 2, 3)
    assert d1.stopped == [("complete", 2), ("compute", 1), ("missed", 1)]
    assert d3.stopped == [("compute", 1), ("complete", 1)]  # absent before its arrival: no rows, no reasons


def test_stop_reasons_give_each_device_its_s_and_reason_per_round_or_nothing_without_them(live_dir, sim_dir):
    run = read_run(live_dir)
    sr = stop_reasons(run, list(run.rounds))
    assert sr is not None and sr.devices == ["dev-0", "dev-1", "dev-2", "dev-3"] and sr.rounds == [1, 2, 3, 4]
    assert list(sr.reason[1]) == ["compute", "missed", "complete", "complete"]  # dev-1: s = 4, rejected, 10, 10
    assert list(sr.s[1]) == [4, 0, 10, 10]
    assert sr.reason[3, 0] == "" and sr.s[3, 0] == -1  # dev-3 before it arrived: in no row
    assert sr.reason[0, 3] == "" and sr.s[0, 3] == -1  # dev-0 after its departure (excluded)
    sim = read_run(sim_dir)
    assert stop_reasons(sim, list(sim.rounds)) is None  # a simulation records no stop reason


def test_coefficients_are_nan_outside_the_objective(live_dir):
    run = read_run(live_dir)
    coef = coefficient_matrix(["dev-0", "dev-1", "dev-2", "dev-3"], list(run.rounds))
    assert np.isnan(coef[3, 0]) and np.isnan(coef[0, 3])
    assert coef[0, 0] == pytest.approx(10 / 10 / 3) and coef[1, 1] == 0.0


def test_traffic_and_durations_sum_per_round_or_are_absent(live_dir, sim_dir):
    run = read_run(live_dir)
    t = traffic(list(run.rounds))
    assert t["bytes_out"] == [3000, 3000, 4000, 3000]
    assert t["bytes_in"] == [800, 800, 1600, 1200]  # s = 0 updates carry no bytes here
    d = durations(list(run.rounds))
    assert d["round_s"] == [1.5] * 4 and d["close_reason"][0] == "deadline" and d["close_reason"][3] == "all answered"
    assert len(d["arrivals"]) == 3 + 3 + 4 + 3
    sim = read_run(sim_dir)
    assert traffic(list(sim.rounds)) is None and durations(list(sim.rounds)) is None


def test_run_summary(live_dir, sim_dir):
    run = read_run(live_dir)
    s = run_summary(run, list(run.rounds))
    assert s["rounds"] == 4 and s["final_acc"] == 0.6 and s["best_acc"] == 0.6
    assert s["inactive_device_rounds"] == 2 and s["rejected_updates"] == 2 and s["discarded_rounds"] == 0
    assert s["arrivals"] == [(2, "dev-3")] and s["departures"] == [(3, "dev-0")]
    assert run_summary(read_run(sim_dir), list(read_run(sim_dir).rounds))["rejected_updates"] is None


def test_accuracy_axis_is_fixed_at_0_to_100_and_loss_starts_at_0(live_dir):
    run = read_run(live_dir)
    rows = list(run.rounds)
    # A run at chance level: an auto-scaled axis would make these 10 % look like a curve.
    fig = plots.accuracy_loss_figure({None: ([r.round for r in rows], [0.1, 0.1, 0.11, 0.1], [2.3, 2.31, 2.29, None])},
                                     [(2, "dev-3", "arrival"), (3, "dev-0", "departure")])
    acc_ax, loss_ax = fig.axes[:2]
    assert acc_ax.get_ylim() == (0, 100)
    assert loss_ax.get_ylim() == pytest.approx((0, 2.31 * 1.05))
    assert len(acc_ax.lines) == 1 + 2  # the curve and one line per event


def test_sweep_table_is_simulator_table3_beside_the_paper():
    final = []
    for seed, (a, b, c) in enumerate([(0.5, 0.6, 0.63), (0.4, 0.5, 0.5)]):
        for scheme, acc in zip("ABC", (a, b, c)):
            final.append({"setting": "niid", "num_traces": 2, "seed": seed, "scheme": scheme, "final_acc": acc})
    table = sweep_table(SweepDataset(dataset="synthetic", final=tuple(final), runs_dir=None))
    assert table.settings == ["niid"]
    b_a, c_b = table.ours_values[("niid", 2)]
    np.testing.assert_allclose(b_a, [20.0, 25.0])
    np.testing.assert_allclose(c_b, [5.0, 0.0])
    assert table.ours[("niid", 2)] == ("22.5 ± 3.5", "2.5 ± 3.5")
    assert table.paper[("niid", 2)] == ("9.6", "1.5") and table.paper[("niid", 8)] == ("41.6", "8.0")
    assert ("niid", 3) not in table.ours
    assert table.final_acc[("niid", 2, "A")] == (pytest.approx(0.45), 2)


def test_trace_table_puts_table2_beside_traces_of_the_same_name():
    from trace_recorder.format import read_trace_set

    trace_set = read_trace_set(REPO / "traces" / "paper")
    rows = {r.name: r for r in trace_table(trace_set)}
    t30 = trace_set.get("T30")
    assert rows["T30"].mean_pct == t30.mean_pct and rows["T30"].std_pct == t30.std_pct
    assert (rows["T30"].paper_mean_pct, rows["T30"].paper_std_pct) == (75.3, 14.8)
    assert rows["Tlo"].zero_share > 0 and rows["T0"].zero_share == 0
    assert rows["T30"].condition == "cpu_load_pct=30"
    assert rows["T0"].rounds == len(trace_set.get("T0")) and rows["T0"].first_round == 0


def test_device_conditions_line_up_with_the_stop_reasons_and_hold_each_rounds_opening(timeline_dir):
    from flexfl.app.report.sections import device_conditions

    run = read_run(timeline_dir)
    rows = list(run.rounds)
    dc, sr = device_conditions(run, rows), stop_reasons(run, rows)
    assert dc is not None and sr is not None
    assert (dc.devices, dc.rounds) == (sr.devices, sr.rounds)  # the same rows and columns as the map they sit under
    np.testing.assert_allclose(dc.cpu_share[1], [0.5, 1.0, 1.0, 1.0])  # round 3: its opening, not its later change
    np.testing.assert_allclose(dc.cpu_quota[1], [0.125, np.nan, np.nan, np.nan])  # share 1: no quota (NaN)
    np.testing.assert_array_equal(dc.online[2], [0, 1, 1, 1])
    np.testing.assert_array_equal(dc.online[3], [-1, -1, 1, 1])  # dev-3: nothing applied before it took part
    np.testing.assert_array_equal(dc.online[0], [1, 1, 1, -1])  # dev-0 departed: not recorded in round 4
    np.testing.assert_allclose(dc.up_kbit[2], [8000, 800, 8000, 8000])
    assert "conditions.jsonl" in run.sources


def test_a_run_without_a_timeline_has_no_device_conditions(live_dir, sim_dir):
    from flexfl.app.report.sections import device_conditions

    for path in (live_dir, sim_dir):
        run = read_run(path)
        assert run.conditions is None and device_conditions(run, list(run.rounds)) is None


def test_the_configuration_reads_as_dotted_keys_and_values_without_reprs_or_this_machines_paths(tmp_path,
                                                                                               monkeypatch):
    from flexfl.app.report.sections import config_rows

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "out" / "run"
    config = {"rules": {"unit": "step", "fast_reboot": True, "strategy": {"name": "fedprox", "mu": 0.1}},
              "traces": {"set": "/elsewhere/traces/paper", "num_traces": 8}, "extra_tests": [],
              "schedule": {"arrivals": [{"device": 3, "round": 5}]}, "rounds": 6, "emnist_root": "",
              "timeline": str(tmp_path / "timelines" / "t.csv"), "log": str(run / "coordinator" / "c.log")}
    assert config_rows(config, run) == [
        ("emnist_root", "none"), ("extra_tests", "none"), ("log", "coordinator/c.log"), ("rounds", "6"),
        ("rules.fast_reboot", "true"), ("rules.strategy.mu", "0.1"), ("rules.strategy.name", "fedprox"),
        ("rules.unit", "step"), ("schedule.arrivals", '[{"device": 3, "round": 5}]'),
        ("timeline", "timelines/t.csv"), ("traces.num_traces", "8"), ("traces.set", ".../paper")]


def test_elapsed_is_a_live_runs_wall_clock_from_its_first_opening(live_dir):
    from flexfl.app.report.sections import elapsed

    run = read_run(live_dir)
    seconds, clock = elapsed(list(run.rounds))  # rows made at 1.7e9 + n; round 1 took 1.5 s and 0.02 s to close
    assert clock == "wall"
    assert seconds == pytest.approx([1.52, 2.52, 3.52, 4.52])

"""A simulation driven by a hand-written timeline sees exactly the s the deadline rule computes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.rules.config import RulesConfig
from edge_agent.config import AgentConfig
from flexfl.app.cli import main
from flexfl.errors import ConfigError
from flexfl.run_spec import RunSpec
from simulator.engine import SimConfig, load_data, run_simulation
from simulator.timeline_source import TimelineRun, model_bytes, timeline_participation
from trace_recorder.deadline import updates_before_deadline
from trace_recorder.timeline import OFFLINE, Conditions
from workloads.partition_spec import PartitionSpec

CFG = SimConfig(partition=PartitionSpec(dataset="synthetic", n_devices=3, total_samples=600),
                rules=RulesConfig(required_updates=5), run=RunSpec(rounds=4))
DEADLINE_S, UPDATE_S = 1.0, 0.1

# Round tau reads second tau - 1 (round_s = the deadline, 1 s).
TIMELINE = """\
# hand-written for the test
device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online
dev-0,0,2,1.0,1000,1000,1
dev-0,2,4,0.25,1000,1000,1
dev-1,0,1,0.5,1000,1000,1
dev-1,1,3,0.5,1000,1000,0
dev-1,3,10,1.0,10,1000,1
dev-2,1,4,1.0,1000,1000,1
dev-9,0,4,1.0,1000,1000,1
"""
# The conditions each device meets at the start of rounds 1..4, written out from the file above.
FULL = Conditions(1.0, 1000, 1000, True)
QUARTER = Conditions(0.25, 1000, 1000, True)
HALF = Conditions(0.5, 1000, 1000, True)
SLOW_UP = Conditions(1.0, 10, 1000, True)
EXPECTED_CONDITIONS = {
    "dev-0": [FULL, FULL, QUARTER, QUARTER],
    "dev-1": [HALF, OFFLINE, OFFLINE, SLOW_UP],
    "dev-2": [OFFLINE, FULL, FULL, FULL],  # no row covers second 0
}
# By hand: the synthetic model is 60 x 10 weights + 10 biases = 610 float32 = 2440 bytes, 19.52 kbit, 0.01952 s each
# way at 1000 kbit/s; room = 1 - 0.05 (margin) - 0.03904 = 0.91096 s: 9 updates at full share (E = 5 caps it), 2 at
# a quarter (0.4 s each), 4 at a half (0.2 s); at 10 kbit/s the upload alone takes 1.952 s.
EXPECTED_S = {"dev-0": [5, 5, 2, 2], "dev-1": [4, 0, 0, 0], "dev-2": [0, 5, 5, 5]}


def _timeline(tmp_path: Path) -> Path:
    path = tmp_path / "timeline.csv"
    path.write_text(TIMELINE)
    return path


def test_the_model_costs_what_the_hand_calculation_says() -> None:
    assert model_bytes(CFG) == 2440


def test_a_simulation_sees_exactly_the_s_the_deadline_rule_computes(tmp_path: Path) -> None:
    data = load_data(CFG)
    run = TimelineRun(path=str(_timeline(tmp_path)), deadline_s=DEADLINE_S, update_s=UPDATE_S)
    participation = timeline_participation(CFG, run, sample_counts=data.sample_counts)
    result = run_simulation(CFG, data=data, participation=participation)

    seen = {d: [row["s"][d] for row in result.rows] for d in EXPECTED_S}
    rule = {d: [updates_before_deadline(c, E=5, deadline_s=DEADLINE_S, update_s=UPDATE_S, model_bytes=2440,
                                        margin_s=AgentConfig.safety_margin_s).s for c in conditions]
            for d, conditions in EXPECTED_CONDITIONS.items()}
    assert seen == rule == EXPECTED_S
    # Why, in the live rows' words: a quarter or half share cannot fit E = 5 even with a free upload
    # (2.0 s and 1.0 s of the 0.93 s without it); at 10 kbit/s the upload alone overruns the deadline.
    assert {d: [row["stop_reason"][d] for row in result.rows] for d in EXPECTED_S} == {
        "dev-0": ["complete", "complete", "compute", "compute"], "dev-1": ["compute", "offline", "offline", "upload"],
        "dev-2": ["offline", "complete", "complete", "complete"]}
    assert result.trace_assignment == ["timeline dev-0", "timeline dev-1", "timeline dev-2"]
    assert [r.active for r in result.records] == [2, 2, 2, 2]  # devices with s > 0 trained


def test_a_round_timeline_is_read_at_the_round_id(tmp_path: Path) -> None:
    path = tmp_path / "rounds.csv"
    path.write_text("device,start_round,end_round,cpu_share,up_kbit_s,down_kbit_s,online\n"
                    "dev-0,1,3,1.0,1000,1000,1\ndev-1,2,5,0.25,1000,1000,1\ndev-2,4,5,1.0,1000,1000,0\n")
    data = load_data(CFG)
    participation = timeline_participation(CFG, TimelineRun(path=str(path), deadline_s=DEADLINE_S, update_s=UPDATE_S),
                                           sample_counts=data.sample_counts)
    assert [[participation.draw(k, tau) for tau in range(1, 5)] for k in range(3)] == [[5, 5, 0, 0], [0, 2, 2, 2],
                                                                                       [0, 0, 0, 0]]
    assert participation.rounds_covered() == 4


def test_sample_s_costs_an_update_by_its_samples(tmp_path: Path) -> None:
    data = load_data(CFG)
    batch = CFG.rules.batch_size_for(CFG.partition.dataset)
    run = TimelineRun(path=str(_timeline(tmp_path)), deadline_s=DEADLINE_S, sample_s=UPDATE_S / batch)
    participation = timeline_participation(CFG, run, sample_counts=data.sample_counts)
    assert participation.update_s == pytest.approx([UPDATE_S] * 3)
    assert [participation.draw(0, tau) for tau in range(1, 5)] == EXPECTED_S["dev-0"]


def test_a_device_missing_from_the_timeline_is_named(tmp_path: Path) -> None:
    path = tmp_path / "short.csv"
    path.write_text("device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online\ndev-0,0,4,1,1000,1000,1\n")
    data = load_data(CFG)
    with pytest.raises(ConfigError, match=r"short.csv: no rows for dev-1, dev-2 \(the simulation has 3 devices"):
        timeline_participation(CFG, TimelineRun(path=str(path), deadline_s=1.0, update_s=0.1),
                               sample_counts=data.sample_counts)


def test_a_timeline_run_needs_one_cost() -> None:
    with pytest.raises(ConfigError, match="--update-s SECONDS"):
        TimelineRun(path="t.csv", deadline_s=1.0)
    with pytest.raises(ConfigError, match="one of them"):
        TimelineRun(path="t.csv", deadline_s=1.0, update_s=0.1, sample_s=0.01)
    with pytest.raises(ConfigError, match="--deadline-s must be a finite number > 0"):
        TimelineRun(path="t.csv", deadline_s=float("nan"), update_s=0.1)


def test_cli_run_from_a_timeline_writes_the_s_it_computes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["sim", "run", "--dataset", "synthetic", "--devices", "3", "--total-samples", "600", "--E", "5",
                 "--rounds", "4", "--scheme", "C", "--timeline", str(_timeline(tmp_path)), "--deadline-s", "1",
                 "--update-s", "0.1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"timeline {tmp_path / 'timeline.csv'} (deadline 1 s)" in printed.splitlines()[0]
    rows = [json.loads(line) for line in (out / "C" / "metrics.jsonl").read_text().splitlines()]
    assert {d: [r["s"][d] for r in rows] for d in EXPECTED_S} == EXPECTED_S
    assert [r["clock_s"] for r in rows] == [1.0, 2.0, 3.0, 4.0]  # back-to-back rounds of the deadline
    run_info = json.loads((out / "C" / "run.json").read_text())
    assert run_info["deadline_s"] == 1.0 and run_info["devices"]["dev-1"]["trace"] == "timeline dev-1"
    assert json.loads((out / "summary.json").read_text())["timeline"]["update_s"] == 0.1


@pytest.mark.parametrize("argv, message", [
    (["--update-s", "0.1"], "--update-s only apply with --timeline FILE"),
    (["--timeline", "t.csv", "--update-s", "0.1"], "--timeline needs --deadline-s"),
    (["--timeline", "t.csv", "--deadline-s", "1", "--update-s", "0.1", "--trace-set", "traces/paper"],
     "--timeline replaces the trace set"),
])
def test_cli_timeline_flags_are_checked_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       argv: list[str], message: str) -> None:
    out = tmp_path / "out"
    assert main(["sim", "run", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()

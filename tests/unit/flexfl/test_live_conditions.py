"""`flexfl live --timeline`, without root: when the driver applies a timeline, what it records, what it refuses.

The coordinator's side is its real StatusReply message; the fleet records the calls it gets
(the real one needs root: tests/netns/test_live_timeline.py runs it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flexfl.proto import fleet_pb2 as pb

from coordinator.rules.round_record import LiveRound, RoundRecord
from flexfl.app.live import load_live_config
from flexfl.app.live_conditions import LiveTimeline, fleet_timeline
from flexfl.errors import ConfigError, ReportError, TraceFormatError
from loadgen.fleet import DEFAULT_CFS_PERIOD_US, least_quota_cpus
from loadgen.fleet_timeline import CONDITIONS_FILE, read_conditions, seconds_per_round

LEAST = least_quota_cpus(DEFAULT_CFS_PERIOD_US)
ROUNDS = """# dev-1 drops to a tenth of its compute in round 3; dev-2 is offline in round 2
device,start_round,end_round,cpu_share,up_kbit_s,down_kbit_s,online
dev-0,1,9,1,8000,8000,1
dev-1,1,3,1,8000,8000,1
dev-1,3,9,0.1,8000,8000,1
dev-2,1,2,1,8000,8000,1
dev-2,2,3,1,8000,8000,0
dev-2,3,9,1,8000,8000,1
"""


def _status(open_round: int, joined: tuple[str, ...] = ("dev-0", "dev-1", "dev-2")) -> pb.StatusReply:
    return pb.StatusReply(open_round=open_round, completed_round=max(0, open_round - 1), started=open_round > 0,
                          devices=[pb.DeviceStatus(device_id=d, connected=True) for d in joined])


def _player(tmp_path: Path, text: str, fleet, *, full_cpus=(None, None, None), clock=None):
    path = tmp_path / "t.csv"
    path.write_text(text)
    kwargs = {"clock": clock} if clock else {}
    return LiveTimeline(fleet_timeline(path, list(full_cpus), least_cpus=LEAST), fleet, out=tmp_path, **kwargs), fleet


def test_round_r_conditions_apply_when_round_r_opens_and_each_opening_is_recorded(
        tmp_path: Path, recording_fleet) -> None:
    play, fleet = _player(tmp_path, ROUNDS, recording_fleet)
    assert play.follow(None) == [] and play.follow(_status(0)) == []  # before round 1 nothing applies
    assert fleet.calls == [] and not (tmp_path / CONDITIONS_FILE).read_text()
    assert len(play.follow(_status(1))) == 6  # rates of the three devices (share 1 of one core: no quota)
    fleet.calls.clear()
    assert play.follow(_status(1)) == [] and fleet.calls == []  # polled again in the same round: nothing
    assert [str(c) for c in play.follow(_status(2))] == ["dev-2 online -> offline"]
    assert [str(c) for c in play.follow(_status(3))] == ["dev-1 CPU quota none -> 0.1 CPU", "dev-2 offline -> online"]
    play.close()
    lines = [json.loads(line) for line in (tmp_path / CONDITIONS_FILE).read_text().splitlines()]
    assert [r["round"] for r in lines] == [1, 2, 3]
    assert lines[1]["devices"]["dev-2"] == {"cpu_share": 1.0, "cpu_quota": None, "up_kbit_s": 8000,
                                            "down_kbit_s": 8000, "online": False}
    assert lines[2]["devices"]["dev-1"]["cpu_share"] == 0.1 and lines[2]["devices"]["dev-1"]["cpu_quota"] == 0.1
    assert read_conditions(tmp_path / CONDITIONS_FILE)[2]["dev-2"]["online"] is False


def test_a_device_that_has_not_joined_is_held_back_until_it_has(tmp_path: Path, recording_fleet) -> None:
    play, fleet = _player(tmp_path, ROUNDS, recording_fleet)
    play.follow(_status(1, joined=("dev-0", "dev-1")))
    assert {i for _, i, _ in fleet.calls} == {0, 1}
    fleet.calls.clear()
    play.follow(_status(1))  # dev-2 joins during round 1: it gets round 1's conditions now
    assert fleet.calls == [("up", 2, 8000), ("down", 2, 8000)]
    play.close()
    rows = [json.loads(line) for line in (tmp_path / CONDITIONS_FILE).read_text().splitlines()]
    assert [sorted(r["devices"]) for r in rows] == [["dev-0", "dev-1"], ["dev-0", "dev-1", "dev-2"]]
    assert sorted(read_conditions(tmp_path / CONDITIONS_FILE)[1]) == ["dev-0", "dev-1"]  # as the round opened


def test_a_seconds_timeline_runs_on_the_clock_from_round_1s_opening(tmp_path: Path, recording_fleet) -> None:
    now = [100.0]
    text = ("device,start_s,end_s,cpu_share,up_kbit_s,down_kbit_s,online\n"
            "dev-0,0,5,1,8000,8000,1\ndev-0,5,60,0.5,8000,8000,1\n")
    play, fleet = _player(tmp_path, text, recording_fleet, full_cpus=(1.0,), clock=lambda: now[0])
    play.follow(_status(0, joined=("dev-0",)))
    now[0] = 150.0  # start-up takes its time: t counts from round 1's opening
    play.follow(_status(1, joined=("dev-0",)))
    assert fleet.calls == [("cpu", 0, 1.0), ("up", 0, 8000), ("down", 0, 8000)]
    now[0] = 154.9
    assert play.follow(_status(2, joined=("dev-0",))) == []
    now[0] = 155.0  # inside round 2: the change comes on time, and is recorded as round 2's second line
    assert [str(c) for c in play.follow(_status(2, joined=("dev-0",)))] == ["dev-0 CPU quota 1 CPU -> 0.5 CPU"]
    play.close()
    rows = [json.loads(line) for line in (tmp_path / CONDITIONS_FILE).read_text().splitlines()]
    assert [(r["round"], r["t_s"], r["devices"]["dev-0"]["cpu_quota"]) for r in rows] == [
        (1, 0.0, 1.0), (2, pytest.approx(4.9), 1.0), (2, 5.0, 0.5)]
    assert read_conditions(tmp_path / CONDITIONS_FILE)[2]["dev-0"]["cpu_quota"] == 1.0  # as round 2 opened
    assert seconds_per_round(tmp_path / CONDITIONS_FILE) == pytest.approx(4.9)  # sim run's --round-s


def test_a_bad_timeline_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(ROUNDS.replace("dev-2,3,9,1,", "dev-2,3,9,-1,"))
    with pytest.raises(TraceFormatError, match=r"t.csv:8: field 'cpu_share': value '-1' is negative"):
        fleet_timeline(path, [None] * 3, least_cpus=LEAST)
    path.write_text(ROUNDS)
    with pytest.raises(ConfigError, match=r"t.csv: it names dev-2, which the fleet does not have"):
        fleet_timeline(path, [None] * 2, least_cpus=LEAST)


def test_a_share_below_the_kernels_least_quota_is_warned_about_before_the_run(tmp_path: Path, caplog) -> None:
    path = tmp_path / "t.csv"
    path.write_text(ROUNDS)
    fleet_timeline(path, [None, 0.25, None], least_cpus=LEAST)  # dev-1's 0.1 x 0.25 CPU
    assert "dev-1: cpu_share 0.1 in 1 row(s) (first from 3) is below the kernel's least quota" in caplog.text


def test_the_timeline_is_an_emulate_setting_the_flag_sets_and_the_config_checks(tmp_path: Path) -> None:
    from flexfl.app.cli import build_parser
    from flexfl.config import overrides_from_args

    args = build_parser().parse_args(["live", "--emulate", "--timeline", "t.csv", "--devices", "3"])
    cfg = load_live_config(None, overrides=overrides_from_args(args))
    assert cfg.emulate.timeline == "t.csv" and cfg.emulate.enabled
    toml = tmp_path / "live.toml"
    toml.write_text('[emulate]\nenabled = true\ntimeline = "timelines/a.csv"\n')
    assert load_live_config(toml).emulate.timeline == str(tmp_path / "timelines" / "a.csv")  # beside the file
    with pytest.raises(ConfigError, match=r"--timeline t.csv: a timeline is applied to an emulated fleet; add --emu"):
        load_live_config(None, overrides={"emulate": {"timeline": "t.csv"}})
    with pytest.raises(ConfigError, match=r"--timeline t.csv sets every device's upload rate: drop --emulate-up-kbit "
                                          r"0,800"):
        load_live_config(None, overrides={"emulate": {"enabled": True, "timeline": "t.csv", "up_kbit": [0, 800]}})


def test_conditions_records_off_the_schema_are_refused_naming_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / CONDITIONS_FILE
    good = {"round": 1, "t_s": 0.0, "devices": {"dev-0": {"cpu_share": 1.0, "cpu_quota": None, "up_kbit_s": 8000,
                                              "down_kbit_s": None, "online": True}}}
    bad = {"round": 2, "t_s": 2.0, "devices": {"dev-0": {**good["devices"]["dev-0"], "online": "yes"}}}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ReportError, match=r"conditions.jsonl:2: field 'devices.dev-0.online': expected true or false"):
        read_conditions(path)
    path.write_text(json.dumps(good) + "\n" + '{"round": 2, "dev')  # torn by a crash: the rows before it stand
    assert list(read_conditions(path)) == [1]


def _row(k: int, *, s: dict[str, int], train_s: dict[str, float]) -> RoundRecord:
    """A live round's record with only s and the devices' training times to go on."""
    live = LiveRound(time=0.0, close_reason="deadline", bytes_out={}, bytes_in={}, train_s=train_s, local_loss={},
                     rejected={}, round_s=1.0, aggregate_eval_s=0.0, overhead_s=None)
    return RoundRecord(round=k, lr=0.1, participants=tuple(s), devices=tuple(s), s=s, p={}, coefficients={},
                       discarded=False, test_acc=0.5, test_loss=1.0, live=live)


def test_the_cost_of_an_update_at_full_share_scales_each_timing_by_the_share_in_force() -> None:
    from flexfl.app.live_conditions import update_s_at_full_share

    on = {"cpu_share": 1.0, "cpu_quota": None, "up_kbit_s": 8000, "down_kbit_s": 8000, "online": True}
    applied = {1: {"dev-0": on, "dev-1": {**on, "cpu_share": 0.1, "cpu_quota": 0.1}},
               2: {"dev-0": on, "dev-1": {**on, "online": False}}}
    rows = [_row(1, s={"dev-0": 2000, "dev-1": 500}, train_s={"dev-0": 0.8, "dev-1": 1.9}),
            _row(2, s={"dev-0": 1000, "dev-1": 0}, train_s={"dev-0": 0.5}),
            _row(3, s={"dev-0": 2000}, train_s={"dev-0": 9.9})]  # no conditions recorded: left out
    # 0.8 / 2000 = 4e-4; 1.9 / 500 x 0.1 = 3.8e-4; 0.5 / 1000 = 5e-4: the median of three device-rounds
    assert update_s_at_full_share(rows, applied) == {"update_s": pytest.approx(4e-4), "device_rounds": 3}
    assert update_s_at_full_share(rows[2:], applied) is None


def test_a_conditions_line_reads_back_from_its_json_and_names_line_and_field_when_off_the_schema() -> None:
    from loadgen.fleet_timeline import UNLIMITED, ConditionsLine, Settings

    settings = Settings(cpu_share=0.5, cpu_quota=0.125, up_kbit=800, down_kbit=None, online=False)
    obj = json.loads(json.dumps({"round": 3, "time": 1e9, "t_s": 9.5,
                                 "devices": {"dev-0": settings.record(), "dev-1": UNLIMITED.record()}}))
    line = ConditionsLine.from_json(obj, "c.jsonl:4")
    assert line == ConditionsLine(round=3, t_s=9.5, devices={"dev-0": settings.record(),
                                                             "dev-1": UNLIMITED.record()})
    with pytest.raises(ReportError, match=r"^c\.jsonl:4: field 't_s': expected seconds since round 1 opened, "
                                          r"got '9\.5'$"):
        ConditionsLine.from_json({**obj, "t_s": "9.5"}, "c.jsonl:4")
    with pytest.raises(ReportError, match=r"^c\.jsonl:4: field 'round': expected a round id"):
        ConditionsLine.from_json([obj], "c.jsonl:4")

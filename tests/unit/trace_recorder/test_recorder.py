"""The recorder's rules on coordinator metrics rows: deadline calibration, round selection, trace building."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.rules.round_record import LiveRound, RoundRecord
from trace_recorder.format import read_trace_set, write_trace_set
from trace_recorder.recording.recorder import DeviceRun, RecordError, build_traces, calibrate_deadline, select_rounds

IDS = ["T0", "T90"]
DEVICES = [DeviceRun(device_id=d, trace=d, shard_index=i, loadgen=f"ipc:///x{i}", iface=None)
           for i, d in enumerate(IDS)]


def row(k: int, *, s: dict, delivered: tuple = ("T0", "T90"), arrived: tuple = ("T0", "T90"),
        upload: dict | None = None, after: dict | None = None) -> RoundRecord:
    live = LiveRound(time=0.0, close_reason="deadline", bytes_out={d: 800_000 for d in delivered},
                     bytes_in={d: 796_840 if s[d] else 0 for d in arrived}, train_s={d: 0.1 * s[d] for d in arrived},
                     local_loss={}, rejected={}, round_s=1.0, aggregate_eval_s=0.0, overhead_s=None,
                     previous_upload_s=upload or {d: 0.05 for d in arrived},
                     arrived_after_s=after or {d: 0.3 for d in arrived})
    return RoundRecord(round=k, lr=0.1, participants=tuple(s), devices=tuple(s), s=s, p={}, coefficients={},
                       discarded=False, test_acc=0.5, test_loss=1.0, live=live)


def test_deadline_is_factor_times_the_statistic_of_complete_unloaded_rounds_plus_the_agents_margin() -> None:
    rows = [row(k, s={"T0": 20, "T90": 12}, after={"T0": t, "T90": 0.9}) for k, t in
            [(1, 5.0), (2, 0.30), (3, 0.40), (4, 0.35)]]
    rows.append(row(5, s={"T0": 19, "T90": 12}, after={"T0": 9.0, "T90": 0.9}))  # incomplete: ignored
    deadline, details = calibrate_deadline(rows, reference=["T0"], E=20, skip_rounds=1, statistic="max", factor=1.1,
                                           margin_s=0.05)
    # 1.1 x 0.40 + the agents' margin: round 1 (cold start) and the incomplete round 5 do not count
    assert deadline == pytest.approx(0.49)
    assert details["samples"] == 3
    deadline, _ = calibrate_deadline(rows, reference=["T0"], E=20, skip_rounds=1, statistic="median", factor=1.0,
                                  margin_s=0.0)
    assert deadline == pytest.approx(0.35)


def test_calibration_without_a_complete_unloaded_round_is_an_error() -> None:
    rows = [row(k, s={"T0": 10, "T90": 5}) for k in (1, 2, 3)]
    with pytest.raises(RecordError, match="completed all 20 updates"):
        calibrate_deadline(rows, reference=["T0"], E=20, skip_rounds=0, statistic="max", factor=1.1, margin_s=0.05)


def test_settling_rounds_are_dropped_per_segment_and_every_kept_round_has_a_successor() -> None:
    rows = {k: row(k, s={"T0": 20, "T90": 10}) for k in range(1, 21)}
    # Segment after round 4 (calibration): rounds 5-6 miss a device, 7 is the first all-delivered one.
    for k in (5, 6):
        rows[k] = row(k, s={"T0": 20, "T90": 0}, delivered=("T0",), arrived=("T0",))
    # A restart after round 12: 13 is all-delivered (settling), 14.. recorded again; 12 has no successor
    # in its segment, so it is not kept.
    assert select_rounds(rows, segments=[4, 12], ids=IDS, rounds=100) == [8, 9, 10, 11, 14, 15, 16, 17, 18, 19]
    assert select_rounds(rows, segments=[4, 12], ids=IDS, rounds=3) == [8, 9, 10]


def test_traces_take_fraction_and_timings_and_the_upload_time_from_the_next_header(tmp_path) -> None:
    rows = {
        7: row(7, s={"T0": 20, "T90": 12}),
        8: row(8, s={"T0": 20, "T90": 0}, arrived=("T0",), upload={"T0": 0.04}),  # T90's update was late
        9: row(9, s={"T0": 20, "T90": 15}, upload={"T0": 0.06, "T90": 0.7}),
    }
    t0, t90 = build_traces(rows, [7, 8], DEVICES, E=20)
    assert list(t0.fraction) == [1.0, 1.0] and list(t90.fraction) == [0.6, 0.0]
    assert list(t90.extra["arrived"]) == [1, 0]
    assert list(t90.extra["upload_bytes"]) == [796_840, 0]
    assert list(t90.extra["train_s"]) == [pytest.approx(1.2), 0.0]
    # Round 8's header did not arrive for T90, so round 7's upload time is unknown (0); round 9's
    # header reports the (late) upload of round 8.
    assert list(t90.extra["upload_s"]) == [0.0, 0.7]
    assert list(t0.extra["upload_s"]) == [0.04, 0.06]


def test_built_traces_round_trip_through_the_format(tmp_path) -> None:
    from trace_recorder.format import TraceManifest, utc_now_iso

    rows = {k: row(k, s={"T0": 20, "T90": 7 + k}) for k in range(1, 5)}
    traces = build_traces(rows, [1, 2, 3], DEVICES, E=20)
    manifest = TraceManifest(schema_version=1, name="t", kind="recorded", description="", source={},
                             required_updates=20, deadline_s=0.5, traces=("T0", "T90"), conditions={},
                             hosts=(), created=utc_now_iso())
    write_trace_set(tmp_path / "t", manifest, traces)
    back = read_trace_set(tmp_path / "t")
    assert list(back.get("T90").fraction) == [0.4, 0.45, 0.5]
    assert back.get("T90").extra["arrived"].dtype.kind == "i"


def test_an_unfinished_work_folder_needs_resume_and_a_finished_one_is_reused(tmp_path) -> None:
    import json

    from flexfl.errors import ConfigError
    from trace_recorder.recording.recorder import Recording, RecordOptions

    work = tmp_path / "work"
    work.mkdir()
    (work / "state.json").write_text(json.dumps({"phase": "recording"}))
    opts = RecordOptions(out=tmp_path / "set", work=work)
    with pytest.raises(ConfigError, match="unfinished recording; --resume continues it"):
        Recording(opts)._load_state()
    (work / "state.json").write_text(json.dumps({"phase": "done"}))
    (work / "old.log").write_text("x")
    recording = Recording(opts)
    recording._load_state()
    assert recording.state["phase"] == "calibrating" and not (work / "old.log").exists()
    with pytest.raises(ConfigError, match=r"--resume: .* another profile"):
        Recording(RecordOptions(out=tmp_path / "set", work=work, resume=True, rounds=7))._load_state()


def test_a_failed_state_save_leaves_the_previous_state(tmp_path, monkeypatch) -> None:
    """state.json (what --resume continues from) is replaced only by a complete, synced file."""
    import errno
    import os

    from trace_recorder.recording.recorder import Recording, RecordOptions

    work = tmp_path / "work"
    recording = Recording(RecordOptions(out=tmp_path / "set", work=work))
    recording._load_state()  # the first state: calibrating
    before = (work / "state.json").read_text()
    recording.state["phase"] = "recording"

    def disk_fails(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", disk_fails)
    with pytest.raises(OSError, match="I/O error"):
        recording._save_state()
    assert (work / "state.json").read_text() == before
    assert sorted(p.name for p in work.iterdir()) == ["state.json"]  # no temp file left behind


def test_the_recorder_follows_a_metrics_file_that_a_resumed_coordinator_rewrote(tmp_path) -> None:
    """A coordinator resumed from round 3 rewrites metrics.jsonl without rows 4 and 5 and runs them
    again: the recorder must see the rows written since, and not the dropped ones."""
    import json

    from coordinator.metrics import MetricsWriter, read_metrics
    from trace_recorder.recording.recorder import Recording, RecordOptions

    recording = Recording(RecordOptions(out=tmp_path / "set", work=tmp_path / "work"))
    path = recording.metrics_path
    path.parent.mkdir(parents=True)

    def lines(rounds, lr):  # the learning rate tells the first run's rows from the resumed one's
        return "".join(json.dumps(replace(row(k, s={"T0": 20, "T90": 3}), lr=lr).to_json()) + "\n" for k in rounds)

    path.write_text(lines(range(1, 6), 0.1))
    assert sorted(recording._rows()) == [1, 2, 3, 4, 5]
    MetricsWriter.rewrite(path, [r.to_json() for r in read_metrics(path)[:3]])
    assert sorted(recording._rows()) == [1, 2, 3]
    with open(path, "a", encoding="utf-8") as f:
        f.write(lines((4, 5, 6), 0.2))
    assert {k: r.lr for k, r in recording._rows().items()} == {1: 0.1, 2: 0.1, 3: 0.1, 4: 0.2, 5: 0.2, 6: 0.2}


def test_an_emulated_recordings_fleet_token_is_kept_beside_its_work_folder_and_found_again_on_resume(tmp_path) -> None:
    """It was work/fleet_token: in the folder whose configs, logs and metrics are copied and shared."""
    import json
    from types import SimpleNamespace

    from edge_agent.config import load_agent_config
    from trace_recorder.recording.recorder import Recording, RecordOptions

    work = tmp_path / "work"
    fleet = SimpleNamespace(coordinator_listen="10.77.0.1:50061", n_devices=2, devices=DEVICES,  # as the fleet says
                            server_tls={}, watch_tls=None)
    recording = Recording(RecordOptions(out=tmp_path / "set", work=work))
    recording._load_state()
    _coordinator, agents, token = recording._write_configs(fleet)
    assert [p for p in work.rglob("*") if "token" in p.name] == []
    assert token not in "".join(p.read_text() for p in work.rglob("*") if p.is_file())
    assert (tmp_path / ".work.secrets" / "fleet_token").read_text() == token
    assert all(load_agent_config(a).token() == token for a in agents)

    (work / "state.json").write_text(json.dumps({**recording.state, "phase": "recording"}))
    resumed = Recording(RecordOptions(out=tmp_path / "set", work=work, resume=True))
    resumed._load_state()
    assert resumed._write_configs(fleet)[2] == token  # the agents, which never stopped, still hold it


def test_a_missing_fleet_token_says_how_to_get_one(tmp_path) -> None:
    from flexfl.errors import ConfigError
    from trace_recorder.recording.recorder import read_fleet_token

    with pytest.raises(ConfigError, match=r"nope: No such file or directory; `flexfl token --out \S+nope` makes one "
                                          r"\(a fleet whose agents already run needs the token they were given"):
        read_fleet_token(tmp_path / "nope")

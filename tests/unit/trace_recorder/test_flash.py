"""FLASH-style state logs -> a timeline: availability = screen locked, charging and on WiFi."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from flexfl.errors import ConfigError, TraceFormatError
from trace_recorder.availability import DeviceSpec, TraceClock
from trace_recorder.importers.flash import UnusableLog, import_flash, parse_states

# One device's day in FLASH's shape: local time, a tab, a state.
LOG = "\n".join([
    "2020-01-02 08:00:00\tscreen_unlock",
    "2020-01-02 08:00:10\twifi",
    "2020-01-02 08:00:20\tbattery_charged_on",
    "2020-01-02 08:00:30\tscreen_lock",       # ready from 30 s
    "2020-01-02 08:00:40\t57%",
    "2020-01-02 08:01:00\t4g",                # not ready from 60 s
    "2020-01-02 08:01:30\twifi",              # ready again from 90 s
    "2020-01-02 08:01:40\tscreen_off",
    "2020-01-02 08:02:00\tbattery_charged_off",  # not ready from 120 s
    "2020-01-02 08:03:20\tscreen_unlock",     # the log ends at 200 s
])
STATES = {
    "1001": {"guid": "a1", "model": "Redmi Note 8", "messages": LOG},
    "1002": {"guid": "b2", "model": "Pixel 3", "messages": "2020-01-02 08:00:00\twifi\n"
                                                           "2020-01-02 08:00:00\tbattery_charged_on\n"
                                                           "2020-01-02 08:00:00\tscreen_lock\n"
                                                           "2020-01-02 08:00:50\tscreen_unlock\n"},
    "1003": {"guid": "c3", "model": "x", "messages": "2020-01-02 08:00:00\twifi\n"},  # spans no time
    "1004": {"guid": "d4", "model": "x", "messages": "2020-01-02 08:00:00\tscreen_lock\n2020-01-02 08:00:09\tflying\n"},
}


def _states(tmp_path: Path, data: object = STATES) -> Path:
    path = tmp_path / "state_traces.json"
    path.write_text(json.dumps(data))
    return path


def test_ready_windows_follow_flashs_rule() -> None:
    av = parse_states(LOG)
    assert av.windows == ((30.0, 60.0), (90.0, 120.0)) and av.period_s == 200.0


def test_a_window_open_at_the_last_message_ends_there() -> None:
    av = parse_states("2020-01-02 00:00:00\twifi\n2020-01-02 00:00:00\tbattery_charged_on\n"
                      "2020-01-02 00:00:05\tscreen_lock\n2020-01-02 00:01:05\t80%\n")
    assert av.windows == ((5.0, 65.0),) and av.period_s == 65.0


def test_unusable_logs_are_left_out_and_counted(tmp_path: Path) -> None:
    result = import_flash(_states(tmp_path), constant=DeviceSpec(1.0, 4000, 8000), clock=TraceClock(horizon_s=400))
    assert len(result.timeline.devices) == 2
    assert result.sources == {"dev-0": "state log '1001'", "dev-1": "state log '1002'"}
    assert len(result.skipped) == 2
    assert "device '1003': the log spans no time" in result.skipped[0]
    assert "device '1004': message 2: unknown state 'flying'" in result.skipped[1]


def test_constant_conditions_while_online_and_the_log_repeating(tmp_path: Path) -> None:
    result = import_flash(_states(tmp_path), constant=DeviceSpec(0.5, 4000, 8000), clock=TraceClock(horizon_s=400))
    rows = result.timeline.devices["dev-0"]
    assert [(r.start, r.end, r.conditions.online) for r in rows] == [
        (0.0, 30.0, False), (30.0, 60.0, True), (60.0, 90.0, False), (90.0, 120.0, True), (120.0, 230.0, False),
        (230.0, 260.0, True), (260.0, 290.0, False), (290.0, 320.0, True), (320.0, 400.0, False)]
    conditions = {(r.conditions.cpu_share, r.conditions.up_kbit_s, r.conditions.down_kbit_s) for r in rows}
    assert conditions == {(0.5, 4000, 8000)}
    assert result.reference_ms_per_sample is None  # the shares are the user's, not scaled from a trace


def test_compute_and_links_from_a_fedscale_capacity_file(tmp_path: Path) -> None:
    cap = tmp_path / "client_device_capacity"
    cap.write_bytes(pickle.dumps({5: {"computation": 10.0, "communication": 300.0},
                                  6: {"computation": 40.0, "communication": 900.0}}))
    result = import_flash(_states(tmp_path), capacity_path=cap, clock=TraceClock(horizon_s=100))
    shares = sorted(rows[0].conditions.cpu_share for rows in result.timeline.devices.values())
    assert shares == [0.25, 1.0] and result.reference_ms_per_sample == 30.0  # 10 ms x 3, the faster one
    assert all(", capacity client " in s for s in result.sources.values())


def test_it_needs_exactly_one_source_of_conditions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FLASH's state logs hold availability only"):
        import_flash(_states(tmp_path))


@pytest.mark.parametrize("data, match", [
    ([], r"expected a non-empty JSON object"),
    ({"1": {"messages": 5}}, r"device '1': field 'messages': expected an object with the state log as text"),
    ({"1": {"messages": "2020-01-02 00:00:00\twifi\n"}}, r"no usable device log \(1 left out; the first: .*spans no"),
])
def test_files_off_the_shape_are_format_errors(tmp_path: Path, data: object, match: str) -> None:
    with pytest.raises(TraceFormatError, match=match):
        import_flash(_states(tmp_path, data), constant=DeviceSpec(1.0, 1.0, 1.0))


def test_text_that_is_not_json_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "state_traces.json"
    path.write_text("{'1': ")
    with pytest.raises(TraceFormatError, match=r"state_traces.json: not JSON"):
        import_flash(path, constant=DeviceSpec(1.0, 1.0, 1.0))


@pytest.mark.parametrize("log, match", [
    ("2020-01-02 00:00:00 wifi\n2020-01-02 00:00:09\twifi", "message 1: expected 'time<TAB>state'"),
    ("02/01/2020 00:00\twifi\n", "message 1: time '02/01/2020 00:00' is not %Y-%m-%d %H:%M:%S"),
    ("2020-01-02 00:00:09\twifi\n2020-01-02 00:00:00\twifi", "message 2: time 2020-01-02 00:00:00 is before"),
])
def test_bad_messages_say_which(log: str, match: str) -> None:
    with pytest.raises(UnusableLog, match=match):
        parse_states(log)

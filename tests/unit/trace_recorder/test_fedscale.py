"""FedScale's two pickles -> a timeline: schema-true files written here, scaling, wrap-around, bad entries."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from flexfl.errors import ConfigError, TraceFormatError
from trace_recorder.availability import ComputeScaling, TraceClock, merge_windows, online_segments
from trace_recorder.importers.fedscale import import_fedscale
from trace_recorder.timeline import read_timeline, write_timeline

# The shapes of FedScale's benchmark/dataset/data/device_info files (its README there), in miniature.
CAPACITY = {
    432802: {"computation": 162.0, "communication": 5648.109619499134},
    17: {"computation": 54.0, "communication": 800.0},
    99: {"computation": 27.0, "communication": 20000.0},
}
BEHAVE = {
    1: {"duration": 200, "active": [0, 50], "inactive": [20, 80], "finish_time": 100, "model": "SM-G960F"},
    2: {"duration": 200, "active": [10], "inactive": [100], "finish_time": 100, "model": "Pixel 3"},
    3: {"duration": 200, "active": [], "inactive": [], "finish_time": 60, "model": "iPhone"},
}


def _pickles(tmp_path: Path, capacity: object = CAPACITY, behave: object = BEHAVE) -> tuple[Path, Path]:
    cap, beh = tmp_path / "client_device_capacity", tmp_path / "client_behave_trace"
    cap.write_bytes(pickle.dumps(capacity))
    beh.write_bytes(pickle.dumps(behave))
    return cap, beh


def test_all_devices_in_id_order_with_scaled_shares_and_their_links(tmp_path: Path) -> None:
    cap, beh = _pickles(tmp_path)
    result = import_fedscale(cap, beh, clock=TraceClock(horizon_s=100))
    t = result.timeline
    assert list(t.devices) == ["dev-0", "dev-1", "dev-2"]
    # Capacity ids in order 17, 99, 432802; x3 (FedScale's training factor): 162, 81, 486 ms per sample.
    assert result.reference_ms_per_sample == 81.0 and result.capped == 0  # the fastest gets cpu_share 1
    shares = [t.devices[d][0].conditions.cpu_share for d in t.devices]
    assert shares == [81 / 162, 1.0, 81 / 486]
    first = t.devices["dev-2"][0].conditions
    assert (first.up_kbit_s, first.down_kbit_s) == (5648.109619499134, 5648.109619499134)
    assert result.sources["dev-0"] == "capacity client 17, behave client 1"


def test_availability_windows_become_online_and_offline_rows(tmp_path: Path) -> None:
    cap, beh = _pickles(tmp_path)
    t = import_fedscale(cap, beh, clock=TraceClock(horizon_s=250)).timeline
    rows = [(r.start, r.end, r.conditions.online) for r in t.devices["dev-0"]]
    # Behave client 1: online [0, 20) and [50, 80) of every 100 s, the trace repeating.
    assert rows == [(0.0, 20.0, True), (20.0, 50.0, False), (50.0, 80.0, True), (80.0, 100.0, False),
                    (100.0, 120.0, True), (120.0, 150.0, False), (150.0, 180.0, True), (180.0, 200.0, False),
                    (200.0, 220.0, True), (220.0, 250.0, False)]
    # Behave client 2: online [10, 100) of every 100 s.
    assert [(r.start, r.end, r.conditions.online) for r in t.devices["dev-1"]][:3] == [
        (0.0, 10.0, False), (10.0, 100.0, True), (100.0, 110.0, False)]
    # Client 3 never becomes available.
    assert [(r.start, r.end, r.conditions.online) for r in t.devices["dev-2"]] == [(0.0, 250.0, False)]


def test_time_scale_and_start_map_run_seconds_onto_trace_seconds() -> None:
    av = merge_windows([(0, 20), (50, 80)], period_s=100)
    # A run second reads 10 trace seconds, from trace second 40:
    # [40, 50) off, [50, 80) on, [80, 100) off, [100, 120) on.
    segments = online_segments(av, TraceClock(horizon_s=8, time_scale=10, start_s=40))
    assert segments == [(0.0, 1.0, False), (1.0, 4.0, True), (4.0, 6.0, False), (6.0, 8.0, True)]


def test_a_window_across_the_period_end_joins_the_next_period_start() -> None:
    av = merge_windows([(0, 10), (90, 100)], period_s=100)
    assert online_segments(av, TraceClock(horizon_s=200)) == [(0.0, 10.0, True), (10.0, 90.0, False),
                                                              (90.0, 110.0, True), (110.0, 190.0, False),
                                                              (190.0, 200.0, True)]


def test_a_seeded_draw_takes_n_devices_from_each_file_the_same_way_each_time(tmp_path: Path) -> None:
    cap, beh = _pickles(tmp_path)
    a = import_fedscale(cap, beh, devices=2, seed=5, clock=TraceClock(horizon_s=100))
    b = import_fedscale(cap, beh, devices=2, seed=5, clock=TraceClock(horizon_s=100))
    assert a.timeline == b.timeline and a.sources == b.sources and len(a.timeline.devices) == 2
    draws = {tuple(import_fedscale(cap, beh, devices=2, seed=s, clock=TraceClock(horizon_s=100)).sources.values())
             for s in range(10)}
    assert len(draws) > 1  # the seed matters


def test_without_a_behave_trace_every_device_is_always_online(tmp_path: Path) -> None:
    cap, _ = _pickles(tmp_path)
    t = import_fedscale(cap, None, clock=TraceClock(horizon_s=30)).timeline
    assert all([(r.start, r.end, r.conditions.online) for r in rows] == [(0.0, 30.0, True)]
               for rows in t.devices.values())


def test_a_reference_and_a_model_cost_ratio_scale_the_shares(tmp_path: Path) -> None:
    cap, beh = _pickles(tmp_path)
    # The run's model costs twice FedScale's x3: 324, 162, 972 ms/sample; this host trains at 200 ms/sample.
    result = import_fedscale(cap, beh, scaling=ComputeScaling(model_cost_ratio=6.0, reference_ms_per_sample=200.0),
                             clock=TraceClock(horizon_s=100))
    shares = [rows[0].conditions.cpu_share for rows in result.timeline.devices.values()]
    assert shares == [200 / 324, 1.0, 200 / 972]
    assert result.capped == 1  # capacity client 99 is faster than the host at full share


def test_the_timeline_written_reads_back(tmp_path: Path) -> None:
    cap, beh = _pickles(tmp_path)
    result = import_fedscale(cap, beh, clock=TraceClock(horizon_s=333, time_scale=7, start_s=13))
    write_timeline(tmp_path / "t.csv", result.timeline)
    assert read_timeline(tmp_path / "t.csv") == result.timeline


@pytest.mark.parametrize("capacity, behave, match", [
    ([1, 2], BEHAVE, r"client_device_capacity: expected client_device_capacity as a non-empty dict .* got list"),
    ({1: {"computation": 1.0}}, BEHAVE, r"client_device_capacity: client 1: field 'communication': missing"),
    ({1: {"computation": float("nan"), "communication": 1.0}}, BEHAVE, r"client 1: field 'computation': value nan"),
    ({1: {"computation": -3, "communication": 1.0}}, BEHAVE, r"client 1: field 'computation': value -3 is not a pos"),
    ({1: {"computation": "fast", "communication": 1.0}}, BEHAVE, r"field 'computation': value 'fast'"),
    (CAPACITY, {1: {"active": [0], "inactive": [5, 9], "finish_time": 10}},
     r"client 1: field 'inactive': 2 times for 1"),
    (CAPACITY, {1: {"active": [6], "inactive": [5], "finish_time": 10}},
     r"client 1: field 'inactive\[0\]': 5 is before"),
    (CAPACITY, {1: {"active": [0], "inactive": [5], "finish_time": 0}}, r"client 1: field 'finish_time': value 0"),
    (CAPACITY, {1: {"active": [0], "inactive": [5]}}, r"client_behave_trace: client 1: field 'finish_time': missing"),
    (CAPACITY, {1: {"active": 0, "inactive": [5], "finish_time": 9}}, r"field 'active': expected a list of times"),
    (CAPACITY, {1: [0, 5]}, r"client 1: expected a dict, got list"),
])
def test_entries_off_the_schema_name_file_client_and_field(tmp_path: Path, capacity: object, behave: object,
                                                          match: str) -> None:
    cap, beh = _pickles(tmp_path, capacity, behave)
    with pytest.raises(TraceFormatError, match=match):
        import_fedscale(cap, beh)


def test_more_devices_than_the_files_hold_is_refused(tmp_path: Path) -> None:
    cap, beh = _pickles(tmp_path)
    with pytest.raises(ConfigError, match="asked for 4 devices, the trace has 3"):
        import_fedscale(cap, beh, devices=4)


def test_a_malicious_capacity_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    import os

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    cap = tmp_path / "client_device_capacity"
    cap.write_bytes(pickle.dumps({1: {"computation": 1.0, "communication": Evil()}}))
    with pytest.raises(TraceFormatError, match="refused: the pickle names"):
        import_fedscale(cap, None)
    assert not marker.exists()

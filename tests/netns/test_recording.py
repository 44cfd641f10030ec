"""`flexfl traces record` on an emulated fleet: two devices, one CPU-loaded, a few rounds.

The set must be valid, replayable by the simulator, show the loaded device completing less,
and leave no fleet behind.
"""

from __future__ import annotations

import os

import numpy as np

from flexfl.run_spec import RunSpec
from loadgen import fleet as fl
from simulator.engine import SimConfig, TracesConfig, run_simulation
from trace_recorder.format import read_trace_set
from trace_recorder.recording.recorder import RecordOptions, record
from workloads.partition_spec import PartitionSpec

PROFILE = """
name = "netns-test"
rounds = 5
[deadline]
warmup_rounds = 5
skip_rounds = 1
statistic = "max"
factor = 1.0
warmup_deadline_s = 30.0
[emulation]
cpu_quota = 0.2
cfs_period_us = 10000
[[traces]]
name = "T0"
cpu_load_pct = 0
[[traces]]
name = "T90"
cpu_load_pct = 90
"""


def test_short_recording_is_valid_replayable_and_the_loaded_device_does_less(fleet_host, stress_ng, tmp_path,
                                                                              capsys) -> None:
    prefix = f"fr{os.getpid():06x}"
    profile = tmp_path / "profile.toml"
    profile.write_text(PROFILE)
    out = tmp_path / "recorded"
    try:
        result = record(RecordOptions(out=out, profile=profile, work=tmp_path / "work", prefix=prefix,
                                      subnet=f"10.78.{(os.getpid() % 60) * 4 + 3}", command="test"))
    finally:
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
    printed = capsys.readouterr().out
    assert "calibration: deadline" in printed and "round" in printed  # progress was shown

    ts = read_trace_set(out)
    m = ts.manifest
    assert m.kind == "recorded" and m.required_updates == 20 and m.deadline_s > 0
    assert [t.name for t in ts.traces] == ["T0", "T90"]
    assert all(len(t) == 5 for t in ts.traces)
    assert m.conditions["T90"]["cpu_load_pct"] == 90 and m.conditions["T90"]["cpu_quota"] == 0.2
    devices = [h for h in m.hosts if h["role"] == "device"]
    assert [h["device_id"] for h in devices] == ["T0", "T90"] and all(h["hardware"].get("cpu_model") for h in devices)
    t0, t90 = ts.traces
    assert set(t0.extra) == {"train_s", "upload_s", "upload_bytes", "arrived", "stop_reason"}
    for t in (t0, t90):  # fleet.proto's StopReason: 1 complete (s = E), 2-3 the deadline budget, 0 not arrived
        came, why = t.extra["arrived"] == 1, t.extra["stop_reason"]
        assert (why[~came] == 0).all() and (why[came & (t.fraction == 1)] == 1).all(), (t.name, t.fraction, why)
        assert np.isin(why[came & (t.fraction < 1)], [2, 3]).all(), (t.name, t.fraction, why)
    assert (t0.extra["upload_bytes"][t0.fraction > 0] > 700_000).all()  # the MNIST MLP's delta
    assert t90.fraction.mean() < t0.fraction.mean(), (t0.fraction, t90.fraction)
    assert result["elapsed_s"] > 0

    sim = run_simulation(SimConfig(partition=PartitionSpec(n_devices=4), run=RunSpec(rounds=3),
                                   traces=TracesConfig(set=str(out), num_traces=2)))
    assert len(sim.records) == 3
    assert set(sim.trace_assignment) <= {"T0", "T90"}
    assert np.isfinite(sim.records[-1].test_loss)

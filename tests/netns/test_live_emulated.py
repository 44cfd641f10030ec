"""`flexfl live --emulate`: the emulated CPU quota and upload rate decide each device's s, and say why.

Two MNIST agents, each in an emulated device; one device's upload goes through a
256 kbit/s tbf, so the MLP's 0.8 MB delta needs about 25 s against a 2 s deadline. The
coordinator must count that device as s = 0 every round while the unshaped one stays active,
and the fleet must be gone afterwards.

Then deadline mode as `flexfl live --emulate` runs it by default (no trace): three devices,
one without a quota, one at 0.1 CPU, one at full CPU behind a 1.2 Mbit/s upload.
"""

from __future__ import annotations

import os
from pathlib import Path

from coordinator.metrics import read_metrics
from edge_agent.config import load_agent_config
from flexfl.app.live import EmulationConfig, LiveConfig, LiveRun, load_live_config
from flexfl.run_spec import DeadlineRunSpec
from flexfl.vocabulary import StopReason
from loadgen import fleet as fl
from trace_recorder.traces_table import TracesConfig
from workloads.partition_spec import PartitionSpec


def test_bandwidth_limited_agent_is_inactive_while_the_unlimited_one_stays_active(fleet_host, tmp_path: Path) -> None:
    prefix = f"fl{os.getpid():06x}"
    cfg = LiveConfig(partition=PartitionSpec(dataset="mnist", n_devices=2, sizes="equal"),
                     run=DeadlineRunSpec(rounds=3, deadline_s=2.0), arrive_round=0, depart_round=0,
                     traces=TracesConfig(set=""), update_s=0.0, out=str(tmp_path),
                     emulate=EmulationConfig(enabled=True, cpu=0.0, up_kbit=(0, 256), prefix=prefix,
                                             subnet=f"10.78.{(os.getpid() % 60) * 4 + 2}"))
    try:
        LiveRun(cfg).run()
    finally:
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
    rows = read_metrics(tmp_path / "coordinator" / "metrics.jsonl")
    assert [r.round for r in rows] == [1, 2, 3]
    assert [r.s["dev-1"] for r in rows] == [0, 0, 0], rows
    assert all(r.s["dev-0"] > 0 for r in rows), [r.s for r in rows]
    assert all("dev-1" not in r.live.bytes_in or r.live.bytes_in["dev-1"] == 0 for r in rows)


def test_in_deadline_mode_the_cpu_share_and_the_upload_rate_decide_s_and_the_metrics_say_why(
        fleet_host, tmp_path: Path) -> None:
    """E = 2700 SGD steps of the MNIST MLP against a 6 s deadline. dev-2's ~0.8 MB update needs ~5.4 s at
    1.2 Mbit/s: once it has measured one, its budget leaves ~0.5 s to train, and its reason is "upload" when
    the updates it then lacks would have fitted in the upload's time: when E steps take ~0.5-5 s in the run.
    A step took ~0.35 ms on the quiet 2-core EPYC this was written on and ~1.3 ms in the clean-clone CI run
    of 2026-11-29, where the run's agents and coordinator share two cores (a 2 s deadline and 1.7 s upload
    with E = 1500 failed there): E = 2700 takes ~1-3.5 s in both, and passed beside stress-ng --cpu 2.
    dev-1 at 0.1 CPU needs >= 9 s for E: "compute" once its quota is set. dev-2's first round knows no
    upload time yet: it trains E and its update comes late (missed), which is why "upload" is asked for
    in some rounds, not all."""
    prefix = f"fd{os.getpid():06x}"
    # As `flexfl live --emulate` builds it: the emulated defaults (no trace, no padding) come from load_live_config.
    cfg = load_live_config(None, overrides={
        "partition": {"dataset": "mnist", "n_devices": 3, "sizes": "equal"}, "run": {"rounds": 6, "deadline_s": 6.0},
        "arrive_round": 0, "depart_round": 0, "out": str(tmp_path),
        "rules": {"required_updates": 2700, "eta0": 0.003},  # not checked: accuracy
        "emulate": {"enabled": True, "cpu": [0.0, 0.1, 0.0], "up_kbit": [0, 0, 1200], "prefix": prefix,
                    "subnet": f"10.78.{(os.getpid() % 60) * 4 + 3}"}})
    assert cfg.trace_set == "" and cfg.update_s == 0.0
    try:
        summary = LiveRun(cfg).run()
    finally:
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
    rows = read_metrics(tmp_path / "coordinator" / "metrics.jsonl")
    assert [r.round for r in rows] == [1, 2, 3, 4, 5, 6]
    # (a) no agent followed a trace: none was configured, and no round ended at a trace's cap
    assert [load_agent_config(tmp_path / f"agent-{i}.toml").participation.trace for i in range(3)] == ["", "", ""]
    why = [r.stop_reason for r in rows]
    assert all(set(w) == set(r.s) for w, r in zip(why, rows)), why  # a reason for every device with an s
    allowed = {str(m) for m in StopReason} - {StopReason.TRACE, StopReason.UNKNOWN}
    assert {v for w in why for v in w.values()} <= allowed, why
    # (b) the 0.1-CPU device completes fewer updates than the one without a quota, on average, for its CPU's sake
    s = {d: [r.s[d] for r in rows] for d in ("dev-0", "dev-1", "dev-2")}
    assert sum(s["dev-1"]) < 0.75 * sum(s["dev-0"]), s
    # round 1 may start before the quota is set (agents get it once joined: flexfl.app.live)
    assert all(w["dev-1"] in (StopReason.COMPUTE, StopReason.MISSED) for w in why[1:]), why
    assert summary["stop_reasons"]["dev-1"].get(StopReason.COMPUTE, 0) >= 3, summary["stop_reasons"]
    # (c) the throttled upload is named as the reason in some round
    assert any(w["dev-2"] == StopReason.UPLOAD for w in why), why

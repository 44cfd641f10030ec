"""`flexfl campaign run --emulate`: 2 strategies x 3 seeds on the emulated fleet, stopped with Ctrl-C in its third
run, completed by the same command without running a finished run again; its page and report exist."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from coordinator.metrics import read_metrics
from loadgen import fleet as fl

RUNS = [f"strategy-{s}__seed-{k}" for s in ("scheme-a", "scheme-c") for k in range(3)]


def _campaign_file(tmp_path: Path, prefix: str) -> Path:
    path = tmp_path / "two-by-three.toml"
    path.write_text(f"""
[campaign]
name = "two-by-three"

[base]
arrive_round = 0
depart_round = 0
update_s = 0.3        # each round lasts its 2 s deadline: long enough to watch a run on a loaded machine
[base.run]
rounds = 3
deadline_s = 2.0
[base.partition]
dataset = "synthetic"
n_devices = 2
[base.rules]
required_updates = 10
[base.emulate]
cpu = [0.0, 0.3]
prefix = "{prefix}"
subnet = "10.78.{(os.getpid() % 60) * 4 + 1}"

[axes]
"rules.strategy" = ["scheme-a", "scheme-c"]
"run.seed" = [0, 1, 2]
""")
    return path


def _campaign(path: Path, out: Path) -> subprocess.Popen:
    # A session of its own, as a terminal's job: the Ctrl-C below goes to its process group.
    return subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", "campaign", "run", str(path), "--emulate",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _watch_a_run(campaign: subprocess.Popen, out: Path) -> dict:
    """`flexfl status --config <run>/agent-1.toml --json --once` on a run in progress, as a user watches the fleet
    from another terminal; a run can end between finding it and asking (each is a few seconds): then the next."""
    limit = time.monotonic() + 300
    while time.monotonic() < limit:
        assert campaign.poll() is None, campaign.communicate()
        busy = [run for run in sorted((out / "runs").glob("*/agent-1.toml"))
                if not (run.parent / "summary.json").exists()]
        if busy:
            watch = subprocess.run([sys.executable, "-m", "flexfl.app.cli", "status", "--config", str(busy[0]),
                                    "--json", "--once"], capture_output=True, text=True, timeout=60)
            seen = json.loads(watch.stdout) if watch.returncode == 0 else {}
            if len(seen.get("devices", ())) == 2:
                return seen
        time.sleep(0.2)
    raise AssertionError("flexfl status never saw a run of the campaign in progress")


def _digest(run: Path) -> str:
    return hashlib.sha256((run / "coordinator" / "metrics.jsonl").read_bytes()
                          + (run / "summary.json").read_bytes()).hexdigest()


def test_an_emulated_campaign_stopped_midway_completes_on_rerun_without_repeating_a_run(fleet_host,
                                                                                       tmp_path: Path) -> None:
    prefix = f"fc{os.getpid():06x}"
    path, out = _campaign_file(tmp_path, prefix), tmp_path / "campaign"
    started = time.monotonic()
    first = _campaign(path, out)
    try:
        seen = _watch_a_run(first, out)
        assert seen["rounds"] == 3 and not seen["finished"], seen
        assert sorted(d["device_id"] for d in seen["devices"]) == ["dev-0", "dev-1"], seen
        third = out / "runs" / RUNS[2] / "coordinator" / "metrics.jsonl"
        limit = time.monotonic() + 600
        while not (third.exists() and read_metrics(third)):
            assert first.poll() is None and time.monotonic() < limit, first.communicate()
            time.sleep(0.2)
        assert first.poll() is None, "the campaign ended before the Ctrl-C"
        os.killpg(first.pid, signal.SIGINT)  # Ctrl-C in the terminal
        printed, errors = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
    assert first.returncode == 130, (printed[-3000:], errors)
    # Stopped in run 3, or in a later one when run 3 ended between the poll and the Ctrl-C (a loaded machine).
    stopped = re.search(r"flexfl: interrupted: campaign two-by-three stopped in run (\d) of 6 \((\S+)\); "
                        r"`flexfl campaign run .*` continues it \(runs that ended are not run again\)$",
                        errors.strip().splitlines()[-1])
    assert stopped, errors
    k = int(stopped.group(1))
    assert k >= 3 and stopped.group(2) == RUNS[k - 1], errors
    ended = {name: _digest(out / "runs" / name) for name in RUNS[:k - 1]}
    assert not (out / "runs" / RUNS[k - 1] / "summary.json").exists()
    checkpointed = (out / "runs" / RUNS[k - 1] / "coordinator" / "checkpoint.pt").exists()

    second = _campaign(path, out)
    try:
        printed, errors = second.communicate(timeout=900)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
        assert fl.find_leftovers(prefix) == {"netns": [], "links": [], "cgroups": []}
    wall_s = time.monotonic() - started
    assert second.returncode == 0, (printed[-3000:], errors)
    lines = [line for line in printed.splitlines() if line.startswith("campaign two-by-three: run ")]
    assert lines[:k - 1] == [f"campaign two-by-three: run {i} of 6 ({RUNS[i - 1]}): done before: not run again"
                             for i in range(1, k)], lines
    assert lines[k - 1].startswith(f"campaign two-by-three: run {k} of 6 ({RUNS[k - 1]}): " + (
        "interrupted: resumed from its checkpoint" if checkpointed else "started again")), lines
    assert [line.rpartition(": ")[2] for line in lines[k:]] == ["started"] * (6 - k), lines
    assert {name: _digest(out / "runs" / name) for name in RUNS[:k - 1]} == ended  # not run again
    if checkpointed:
        resumed = json.loads((out / "runs" / RUNS[k - 1] / "summary.json").read_text())
        assert resumed["resumed_after_round"] >= 1 and resumed["rounds"] == 3
    index = json.loads((out / "campaign.json").read_text())
    assert [(r["name"], r["state"], r["rounds"]) for r in index["runs"]] == [(name, "done", 3) for name in RUNS]
    page = (out / "campaign.md").read_text()
    assert "| scheme-a | " in page and "| scheme-c | " in page and page.count("(n=3)") == 6, page
    assert (out / "report.html").stat().st_size > 0 and "report: " in printed
    print(f"campaign of 6 emulated runs, interrupted once in run {k} (checkpoint: {checkpointed}): {wall_s:.0f} s "
          "in all")

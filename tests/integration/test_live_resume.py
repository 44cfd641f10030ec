"""`flexfl live --resume` and honest endings: an interrupted run continues to its last round, and a run that
ended short of its rounds says so with one error line and exit code 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from coordinator.checkpoint import checkpointed_round
from coordinator.metrics import read_metrics

ERROR = "flexfl: error: "


def _live(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", "live", "--trace-set", "", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_round(live: subprocess.Popen, out: Path, rnd: int) -> None:
    metrics = out / "coordinator" / "metrics.jsonl"
    limit = time.monotonic() + 180
    while not (metrics.exists() and len(read_metrics(metrics)) >= rnd):
        assert live.poll() is None and time.monotonic() < limit, live.communicate()
        time.sleep(0.1)


def _finish(live: subprocess.Popen) -> tuple[str, str]:
    try:
        return live.communicate(timeout=180)
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()


def test_an_interrupted_live_run_resumes_to_its_last_round_without_its_departed_device(tmp_path: Path) -> None:
    out = tmp_path / "run"
    flags = ("--devices", "3", "--rounds", "7", "--arrive-round", "0", "--depart-round", "2", "--deadline-s", "1",
             "--E", "10", "--out", str(out))
    live = _live(*flags)
    _wait_for_round(live, out, 3)
    live.send_signal(signal.SIGTERM)  # flexfl live itself, as `kill` or systemd stops it
    printed, errors = _finish(live)
    assert live.returncode == 130, (printed[-2000:], errors)
    done = checkpointed_round(out / "coordinator" / "checkpoint.pt")  # the coordinator wrote it as it stopped
    assert done is not None and done >= 3
    assert f"flexfl: interrupted: flexfl live stopped after round {done} of 7; " in errors, errors
    assert f"`flexfl live --resume --out {out}` continues it" in errors
    assert not (out / "summary.json").exists()  # an interrupted run has no summary yet

    # Flags may repeat the saved config, not change it; --config is not taken.
    changed = subprocess.run([sys.executable, "-m", "flexfl.app.cli", "live", "--resume", "--out", str(out),
                              "--rounds", "9"], capture_output=True, text=True, timeout=120)
    assert changed.returncode == 2 and changed.stderr.strip().splitlines() == [
        f"{ERROR}--resume continues {out} as it was configured ({out / 'live.toml'}); these flags change it: "
        "run.rounds: 7 -> 9"], changed.stderr

    resumed = _live("--resume", "--out", str(out), "--E", "10")
    printed, errors = _finish(resumed)
    assert resumed.returncode == 0, (printed[-3000:], errors)
    assert f"resuming {out} after round {done} of 7" in printed
    assert "after 7 of 7 rounds" in printed and f"resumed after round {done}" in printed
    rows = read_metrics(out / "coordinator" / "metrics.jsonl")
    assert [r.round for r in rows] == list(range(1, 8))
    assert [r.round for r in rows if r.departures] == [2]
    assert all("dev-0" not in r.s for r in rows[2:]), [r.s for r in rows]
    joins = [line for line in (out / "agent-0.log").read_text().splitlines() if "dev-0 joined" in line]
    assert len(joins) == 1, joins  # the departed device was not started again
    assert len([line for line in (out / "agent-1.log").read_text().splitlines() if "dev-1 joined" in line]) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 7 and summary["resumed_after_round"] == done and summary["problems"] == []


def test_a_live_run_whose_coordinator_was_stopped_early_is_an_error_that_says_how_far_it_got(tmp_path: Path) -> None:
    out = tmp_path / "short"
    live = _live("--devices", "2", "--rounds", "30", "--arrive-round", "0", "--depart-round", "20",
                 "--deadline-s", "1", "--E", "10", "--out", str(out))
    _wait_for_round(live, out, 2)
    coordinator = next(p for p in psutil.Process(live.pid).children(recursive=True)
                       if "coordinator" in p.cmdline())
    coordinator.send_signal(signal.SIGTERM)  # it checkpoints and exits 0, as a stopped service does
    printed, errors = _finish(live)
    assert live.returncode == 2, (printed[-2000:], errors)
    done = len(read_metrics(out / "coordinator" / "metrics.jsonl"))
    assert done < 20
    assert errors.strip().splitlines() == [
        f"{ERROR}the run stopped after round {done} of 30 (the coordinator ended early: see {out / 'coordinator.log'})"
        f"; `flexfl live --resume --out {out}` continues it"], errors
    assert f"after {done} of 30 rounds" in printed

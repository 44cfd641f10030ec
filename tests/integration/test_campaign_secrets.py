"""`flexfl campaign run` on loopback keeps its runs' fleet tokens out of the campaign folder, which people zip
and share, and a run interrupted midway still finds its token when the rerun resumes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from coordinator.metrics import read_metrics
from edge_agent.config import load_agent_config

RUN = "seed-0"  # the one run: its axis value names it


def _campaign(path: Path, out: Path) -> subprocess.Popen:
    # A session of its own, as a terminal's job: the Ctrl-C below goes to its process group.
    return subprocess.Popen([sys.executable, "-m", "flexfl.app.cli", "campaign", "run", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_campaign_folder_holds_no_fleet_token_and_an_interrupted_run_resumes_with_its_token(tmp_path: Path) -> None:
    """Before: <campaign>/runs/.<run>.secrets/fleet_token, inside the folder that is shared."""
    path, out = tmp_path / "tiny.toml", tmp_path / "tiny"
    path.write_text("""
[campaign]
name = "tiny"

[base]
arrive_round = 0
depart_round = 0
[base.run]
rounds = 5
deadline_s = 1.0
[base.traces]
set = ""
[base.partition]
dataset = "synthetic"
n_devices = 2

[axes]
"run.seed" = [0]
""")
    first = _campaign(path, out)
    metrics = out / "runs" / RUN / "coordinator" / "metrics.jsonl"
    limit = time.monotonic() + 240
    while not (metrics.exists() and read_metrics(metrics)):
        assert first.poll() is None and time.monotonic() < limit, _finish(first)
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C in the terminal, after round 1
    printed, errors = _finish(first)
    assert first.returncode == 130, (printed[-3000:], errors)
    assert (out / "runs" / RUN / "coordinator" / "checkpoint.pt").exists(), "nothing to resume: no checkpoint"
    assert [p for p in out.rglob("*") if "token" in p.name] == []
    private = tmp_path / ".tiny.secrets" / "runs" / RUN / "fleet_token"
    token = private.read_text()

    second = _campaign(path, out)
    printed, errors = _finish(second)
    assert second.returncode == 0, (printed[-3000:], errors)
    assert f"campaign tiny: run 1 of 1 ({RUN}): interrupted: resumed from its checkpoint" in printed, printed
    summary = json.loads((out / "runs" / RUN / "summary.json").read_text())
    assert summary["resumed_after_round"] >= 1 and summary["rounds"] == 5 and summary["problems"] == [], summary
    assert [p for p in out.rglob("*") if "token" in p.name] == []
    shared = "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    assert token not in shared and private.read_text() not in shared  # each start of a run makes its own
    agent = load_agent_config(out / "runs" / RUN / "agent-1.toml")  # what `flexfl status --config` reads
    assert Path(agent.fleet_token_file) == private and agent.token() == private.read_text()

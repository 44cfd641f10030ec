"""A coordinator resumed under other rules: refused, naming each change, unless allowed; then its rows say so."""

from __future__ import annotations

import signal

import pytest

from coordinator.checkpoint import load_checkpoint
from coordinator.metrics import read_metrics
from edge_agent.config import ParticipationConfig

from .conftest import coordinator_toml, flexfl_process, free_port

MODEL = {"linear.weight": ((10, 60), None), "linear.bias": ((10,), None)}


def _run_files(out):
    """The run's files and their bytes (the folder's lock says which process held it last: left out)."""
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".flexfl.lock"}


def test_a_resume_under_changed_rules_is_refused_unless_allowed_and_the_first_row_after_it_records_the_change(
        tmp_path, procs, agents, wait_for):
    port = free_port()
    config = coordinator_toml(tmp_path, port, rounds=5, eta0=0.5)  # E = 5
    coord = flexfl_process("coordinator", "--config", str(config), log=tmp_path / "c1.log")
    procs.append(coord)
    for i in range(3):
        agents(port, i, participation=ParticipationConfig(min_update_s=0.05))
    out = tmp_path / "out"
    metrics, checkpoint = out / "metrics.jsonl", out / "checkpoint.pt"
    wait_for(lambda: checkpoint.exists() and load_checkpoint(checkpoint, expected=MODEL).completed_round >= 2,
             timeout=90, what="two checkpointed rounds")
    coord.send_signal(signal.SIGKILL)
    coord.wait(timeout=10)
    done = load_checkpoint(checkpoint, expected=MODEL).completed_round
    assert done < 5 and load_checkpoint(checkpoint, expected=MODEL).rules["eta0"] == 0.5
    folder_before = _run_files(out)

    changed = ("--eta0", "0.1", "--E", "7")
    refused = flexfl_process("coordinator", "--config", str(config), "--resume", *changed)
    procs.append(refused)
    said, _ = refused.communicate(timeout=90)
    assert refused.returncode == 2, said[-2000:]
    assert "eta0: 0.5 -> 0.1" in said and "required_updates: 5 -> 7" in said and "--allow-rule-change" in said
    assert "batch_size" not in said  # only what changed is named
    # nothing of the run was touched: rows and checkpoint as the crash left them
    assert _run_files(out) == folder_before

    allowed = flexfl_process("coordinator", "--config", str(config), "--resume", *changed, "--allow-rule-change",
                             log=tmp_path / "c3.log")
    procs.append(allowed)
    assert allowed.wait(timeout=120) == 0, (tmp_path / "c3.log").read_text()[-3000:]
    rows = read_metrics(metrics)
    assert [r.round for r in rows] == [1, 2, 3, 4, 5]
    before, after = rows[:done], rows[done:]
    assert all(r.rules is not None and r.rules["eta0"] == 0.5 and r.E == 5 for r in before)
    assert all(r.rules is not None and r.rules["eta0"] == 0.1 and r.E == 7 for r in after)
    assert after[0].rule_changes == {"eta0": (0.5, 0.1), "required_updates": (5, 7)}
    assert all(r.rule_changes is None for r in before + after[1:])
    # the new rules are the ones that ran: eta0 / tau, and agents told E = 7 (0.05 s per update: all finish)
    assert after[0].lr == pytest.approx(0.1 / after[0].round)
    assert all(v == 7 for r in after for v in r.s.values()), [dict(r.s) for r in after]
    assert load_checkpoint(checkpoint, expected=MODEL).rules["required_updates"] == 7

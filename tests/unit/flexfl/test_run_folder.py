"""flexfl.run_folder: the lock, the refusal of an earlier run, --fresh, leftovers of killed writes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flexfl.errors import ConfigError
from flexfl.run_folder import LOCK_NAME, RunFolderBusy, RunFolderTaken, claim_run_folder, entries_besides_lock

HOLD = """
import sys
from pathlib import Path
from flexfl.run_folder import claim_run_folder, entries_besides_lock
held = claim_run_folder(Path(sys.argv[1]), what="a test holder", holds_run=entries_besides_lock)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_folder_held_by_another_process_is_refused_until_that_process_ends(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunFolderBusy,
                           match=rf"in use by another FlexFL process \(pid {holder.pid}: a test holder\)"):
            claim_run_folder(tmp_path / "run", what="test", holds_run=lambda _: None)
    finally:
        holder.kill()  # a killed holder leaves no stale lock: the kernel drops it
        holder.wait()
    claim_run_folder(tmp_path / "run", what="test", holds_run=lambda _: None).release()


def test_an_earlier_run_is_refused_resumed_or_moved_aside_never_overwritten(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    with pytest.raises(RunFolderTaken, match=r"holds an earlier run \(metrics.jsonl\); pass --resume"):
        claim_run_folder(run, what="test", holds_run=entries_besides_lock)
    # flexfl live cannot continue a run: it is told of --fresh only
    with pytest.raises(RunFolderTaken,
                       match=r"holds an earlier run \(metrics.jsonl\); pass --fresh to start a new one"):
        claim_run_folder(run, what="test", holds_run=entries_besides_lock, resumable=False)
    with pytest.raises(ConfigError, match="pick one"):
        claim_run_folder(run, what="test", holds_run=entries_besides_lock, resume=True, fresh=True)
    claim_run_folder(run, what="test", holds_run=entries_besides_lock, resume=True).release()
    assert (run / "metrics.jsonl").read_text() == '{"round": 1}\n'

    folder = claim_run_folder(run, what="test", holds_run=entries_besides_lock, fresh=True)
    assert folder.moved_aside is not None and folder.moved_aside.name.startswith("run.previous-")
    assert (folder.moved_aside / "metrics.jsonl").read_text() == '{"round": 1}\n'
    assert [p.name for p in run.iterdir()] == [LOCK_NAME]
    # The new folder is locked by this claim (not the one moved aside).
    with pytest.raises(RunFolderBusy):
        claim_run_folder(run, what="test", holds_run=entries_besides_lock)
    folder.release()


def test_temporaries_of_a_killed_atomic_write_are_removed_and_nothing_else(tmp_path):
    (tmp_path / ".checkpoint.pt.a1b2c3.tmp").write_bytes(b"\0" * 100)
    (tmp_path / "notes.tmp").write_text("a user's file: not ours")
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    claim_run_folder(tmp_path, what="test", holds_run=lambda _: None).release()
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME, "checkpoint.pt", "notes.tmp"]


def test_a_runs_secrets_live_in_a_private_folder_beside_its_results_never_in_them(tmp_path):
    import stat

    from flexfl.run_folder import secrets_dir

    run = tmp_path / "out" / "demo"
    private = secrets_dir(run)
    assert private == tmp_path / "out" / ".demo.secrets" and not run.exists()
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    private.chmod(0o755)  # loosened by someone: made private again
    assert stat.S_IMODE(secrets_dir(run).stat().st_mode) == 0o700


def test_the_secrets_of_a_run_inside_a_shared_folder_live_beside_that_folder(tmp_path):
    """A campaign's run is <campaign>/runs/<name>: beside the run would still be inside the campaign."""
    import stat

    from flexfl.run_folder import secrets_dir

    campaign = tmp_path / "c1"
    private = secrets_dir(campaign / "runs" / "seed-0", within=campaign)
    assert private == tmp_path / ".c1.secrets" / "runs" / "seed-0" and not campaign.exists()
    assert stat.S_IMODE((tmp_path / ".c1.secrets").stat().st_mode) == 0o700
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    with pytest.raises(ValueError):
        secrets_dir(tmp_path / "elsewhere", within=campaign)  # not a run of it: a caller's bug, not a place

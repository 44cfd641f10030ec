"""A crash between a round's two writes (metrics row, checkpoint) loses no row; --resume repairs or reports."""

from __future__ import annotations

import logging

import pytest

import coordinator.finisher as finisher_module
from coordinator.checkpoint import load_checkpoint
from coordinator.metrics import MetricsWriter, read_metrics

from .conftest import Fleet


class Crash(BaseException):
    """The process dies here (BaseException: nothing on the way catches it)."""


@pytest.fixture
def crash_between_the_writes_of_round(monkeypatch):
    """Let the first of round N's two writes happen, then "kill" the coordinator: every later write fails."""
    state = {"round": None, "first_done": False, "dead": False}

    def guarded(kind, write):
        def wrapper(*args, **kwargs):
            # The writer may put several rounds' rows in one write (it fell behind).
            # A writer that fell behind also skips older checkpoints: a later one holds round N too.
            covers = (state["round"] in [r["round"] for r in args[-1]] if kind == "metrics"  # the JSON objects written
                      else state["round"] is not None and args[-1].completed_round >= state["round"])
            if state["dead"]:
                raise Crash(f"{kind} write after the crash")
            if covers:
                if state["first_done"]:
                    state["dead"] = True
                    raise Crash(f"killed before the {kind} write of round {state['round']}")
                state["first_done"] = True
            return write(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(finisher_module, "save_checkpoint", guarded("checkpoint", finisher_module.save_checkpoint))
    monkeypatch.setattr(MetricsWriter, "write_many", guarded("metrics", MetricsWriter.write_many))

    def arm(round_index: int) -> dict:
        state["round"] = round_index
        return state

    return arm


def _train(cfg, *, resume: bool = False, agents: int = 3) -> Fleet:
    """A coordinator and `agents` agents run to the end (or to the coordinator's "crash")."""
    fleet = Fleet(cfg, resume=resume)
    try:
        for i in range(agents):
            fleet.start_agent(i)
        assert fleet.coordinator.wait(timeout=60)
    finally:
        fleet.close()
    return fleet


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the "killed" engine thread
def test_a_crash_between_the_row_and_the_checkpoint_loses_no_row(live_config, crash_between_the_writes_of_round,
                                                                  monkeypatch, caplog):
    cfg = live_config(rounds=5, n_devices=3, min_devices=3, deadline_s=5.0)
    state = crash_between_the_writes_of_round(3)
    first = _train(cfg)
    assert state["dead"], "the crash point was never reached"
    out = first.coordinator.out_dir
    ckpt = load_checkpoint(out / "checkpoint.pt", expected=first.coordinator.engine.expected)
    rows_at_crash = [r.round for r in read_metrics(out / "metrics.jsonl")]
    # Whichever write came first, the disk now holds round 3 in exactly one of the two files
    # (a writer that fell behind writes several rows at once and skips older checkpoints: the
    # last one may be round 1's, the rows may reach round 4).
    assert rows_at_crash == list(range(1, len(rows_at_crash) + 1))
    assert ckpt.completed_round < 3 <= len(rows_at_crash) or len(rows_at_crash) < 3 <= ckpt.completed_round, \
        (ckpt.completed_round, rows_at_crash)

    state["round"], state["dead"] = None, False  # the restarted process writes normally
    with caplog.at_level(logging.WARNING, logger="coordinator.resume"):
        _train(cfg, resume=True)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r.round for r in rows] == [1, 2, 3, 4, 5]
    redone = [r for r in rows_at_crash if r > ckpt.completed_round]
    if redone:
        assert f"metrics hold rows of rounds {redone} that the checkpoint does not: they run again" in caplog.text


def test_resume_reports_rounds_that_have_no_row(live_config, caplog):
    cfg = live_config(rounds=2, n_devices=3, min_devices=3, deadline_s=5.0)
    fleet = _train(cfg)
    metrics = fleet.coordinator.out_dir / "metrics.jsonl"
    MetricsWriter.rewrite(metrics, [r.to_json() for r in read_metrics(metrics) if r.round != 1])  # as a crash used to
    with caplog.at_level(logging.WARNING, logger="coordinator.resume"):
        Fleet(cfg, resume=True).close()
    assert "metrics have no row for rounds [1]" in caplog.text


def test_joins_and_leaves_while_a_resumed_coordinator_waits_for_its_fleet(live_config):
    """Found by the soak: before its first resumed round, a new device's join was refused (INVALID_ARGUMENT)."""
    from coordinator.config import with_changes
    from flexfl.exchange import Join

    cfg = live_config(rounds=2, n_devices=4, min_devices=3, deadline_s=5.0)
    _train(cfg)
    resumed = with_changes(cfg, run={"rounds": 4, "resume_wait_s": 60.0})
    engine = Fleet(resumed, resume=True)  # nobody reconnects: it waits for its fleet
    try:
        e = engine.coordinator.engine
        assert not e.started and e.completed_round == 2
        reply = e.join(Join(device_id="dev-3", shard_index=3))
        assert reply.arrival and e.membership.pending_arrivals == ["dev-3"]
        e.leave("dev-0", "leaving while the coordinator waits")
        assert e.membership.pending_departures == ["dev-0"]
        assert "dev-0" in e.objective.sample_counts  # applied at a close
    finally:
        engine.close()


def test_a_torn_last_row_is_set_aside_and_the_rerun_rounds_row_is_whole(live_config, caplog):
    from coordinator.config import with_changes

    cfg = live_config(rounds=2, n_devices=3, min_devices=3, deadline_s=5.0)
    first = _train(cfg)
    metrics = first.coordinator.out_dir / "metrics.jsonl"
    fragment = '{"round": 3, "participants": ["dev-0", "de'  # a crash mid-write: no newline
    with open(metrics, "a", encoding="utf-8") as f:
        f.write(fragment)
    with caplog.at_level(logging.WARNING, logger="coordinator.resume"):
        _train(with_changes(cfg, run={"rounds": 3}), resume=True)
    assert [r.round for r in read_metrics(metrics)] == [1, 2, 3]  # round 3's row was not glued to it
    assert (metrics.parent / "metrics.jsonl.torn").read_text() == fragment + "\n"
    assert "1 torn line(s)" in caplog.text

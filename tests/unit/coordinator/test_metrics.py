"""Metrics files: the tail a running coordinator's readers follow, and read_metrics's rules it shares."""

from __future__ import annotations

import json

from coordinator.metrics import MetricsTail, MetricsWriter, read_metrics


def _line(k: int, **extra) -> str:
    return json.dumps({"round": k, **extra}) + "\n"


def test_the_tail_returns_complete_rows_and_waits_for_a_line_still_being_written(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.rows() == []  # no file yet
    path.write_text(_line(1) + "{torn by a crash\n" + _line(2) + '{"round": 3, "s"')
    assert [r["round"] for r in tail.rows()] == [1, 2]
    with open(path, "a", encoding="utf-8") as f:
        f.write(': {}}\n' + _line(4))
    assert [r["round"] for r in tail.rows()] == [1, 2, 3, 4]
    assert tail.rows() == read_metrics(path)


def test_the_tail_starts_over_when_a_resumed_coordinator_rewrites_the_file(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_line(k, run="first") for k in range(1, 6)))
    tail = MetricsTail(path)
    assert len(tail.rows()) == 5
    # Resumed from the checkpoint of round 3: rows 4 and 5 go (a new, shorter file), and run again.
    MetricsWriter.rewrite(path, read_metrics(path)[:3])
    assert [r["round"] for r in tail.rows()] == [1, 2, 3]
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(_line(k, run="2nd") for k in (4, 5, 6)))
    assert [(r["round"], r["run"]) for r in tail.rows()] == [
        (1, "first"), (2, "first"), (3, "first"), (4, "2nd"), (5, "2nd"), (6, "2nd")]
    path.unlink()
    assert tail.rows() == []

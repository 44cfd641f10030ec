"""Metrics files: the tail a running coordinator's readers follow, and read_metrics's rules it shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.metrics import MetricsTail, MetricsWriter, read_metrics
from coordinator.rules.round_record import RoundRecordError

# a row of a real live run (tests/unit/coordinator/test_round_record.py says how it was made)
ROW = json.loads(Path(__file__).with_name("data").joinpath("live_metrics_6b186a0.jsonl").read_text().splitlines()[0])


def _line(k: int, **extra) -> str:
    return json.dumps(ROW | {"round": k, **extra}) + "\n"


def test_the_tail_returns_complete_rows_and_waits_for_a_line_still_being_written(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.rows() == []  # no file yet
    path.write_text(_line(1) + "{torn by a crash\n" + _line(2) + _line(3)[:20])
    assert [r.round for r in tail.rows()] == [1, 2]
    with open(path, "a", encoding="utf-8") as f:
        f.write(_line(3)[20:] + _line(4))  # the rest of row 3, then row 4
    assert [r.round for r in tail.rows()] == [1, 2, 3, 4]
    assert tail.rows() == read_metrics(path)


def test_the_tail_starts_over_when_a_resumed_coordinator_rewrites_the_file(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(_line(k, lr=1.0) for k in range(1, 6)))
    tail = MetricsTail(path)
    assert len(tail.rows()) == 5
    # Resumed from the checkpoint of round 3: rows 4 and 5 go (a new, shorter file), and run again.
    MetricsWriter.rewrite(path, [r.to_json() for r in read_metrics(path)[:3]])
    assert [r.round for r in tail.rows()] == [1, 2, 3]
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(_line(k, lr=2.0) for k in (4, 5, 6)))
    assert [(r.round, r.lr) for r in tail.rows()] == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0), (5, 2.0), (6, 2.0)]
    path.unlink()
    assert tail.rows() == []


def test_the_tail_reads_each_byte_once_and_a_new_row_from_where_it_stopped(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_line(1) + _line(2))
    tail = MetricsTail(path)
    assert len(tail.rows()) == 2 and tail.offset == path.stat().st_size
    # Bytes already read are not parsed again: garbling them in place (same size, same file) is not seen.
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(b"x" * 10)
        f.seek(size)
        f.write(_line(3).encode())
    assert [r.round for r in tail.rows()] == [1, 2, 3]
    assert tail.offset == path.stat().st_size


def test_a_row_that_is_not_a_round_record_names_its_file_and_line(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_line(1) + _line(2, s={"dev-0": "many"}))
    with pytest.raises(RoundRecordError, match=rf"{path}:2: field 's': at key 'dev-0': expected an integer"):
        read_metrics(path)
    with pytest.raises(RoundRecordError, match=rf"{path}:2: field 's'"):
        MetricsTail(path).rows()

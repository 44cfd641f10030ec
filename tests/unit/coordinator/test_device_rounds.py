"""Each device's newest closed round and its link, as Status shows them (coordinator/device_rounds.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.device_rounds import DeviceRounds
from coordinator.rules.round_record import LiveRound, RoundRecord
from flexfl.exchange import DeviceRound


def _row(tau: int, s: dict[str, int], *, bytes_in: dict[str, int], upload_s: dict[str, float],
         reasons: dict[str, str]) -> RoundRecord:
    live = LiveRound(time=0.0, close_reason="deadline", bytes_out={d: 900 for d in s}, bytes_in=bytes_in,
                     train_s={d: 0.5 for d in bytes_in}, local_loss={}, rejected={}, round_s=1.0,
                     aggregate_eval_s=0.1, overhead_s=None, previous_upload_s=upload_s)
    return RoundRecord(round=tau, lr=0.1, participants=tuple(s), devices=tuple(s), s=s, p={}, coefficients={},
                       discarded=False, test_acc=0.5, test_loss=1.0, stop_reason=reasons, live=live)


def test_a_device_shows_its_newest_round_and_the_rate_of_its_previous_update_over_the_time_it_measured():
    rounds = DeviceRounds()
    rounds.note(_row(1, {"a": 5, "b": 0}, bytes_in={"a": 4000, "b": 60}, upload_s={},
                     reasons={"a": "complete", "b": "compute"}))
    assert rounds.last_round("a") == DeviceRound(round_id=1, s=5, stop_reason="complete", bytes_in=4000,
                                                 bytes_out=900, train_s=0.5)
    assert rounds.upload_bytes_per_s("a") is None  # no upload measured before its first
    # Round 2: a reports 0.5 s for round 1's upload (4000 bytes, a delta); b's round 1 upload had no delta.
    rounds.note(_row(2, {"a": 2, "b": 3}, bytes_in={"a": 4000, "b": 4000}, upload_s={"a": 0.5, "b": 0.01},
                     reasons={"a": "upload", "b": "compute"}))
    assert rounds.upload_bytes_per_s("a") == pytest.approx(8000.0)
    assert rounds.upload_bytes_per_s("b") is None  # 60 bytes without a delta say nothing of its link
    # Round 3: a missed its deadline (no update taken): its round shows it, its link stays what it was.
    rounds.note(_row(3, {"a": 0, "b": 3}, bytes_in={"b": 4000}, upload_s={"b": 0.25},
                     reasons={"a": "missed", "b": "compute"}))
    assert rounds.last_round("a") == DeviceRound(round_id=3, s=0, stop_reason="missed", bytes_in=0, bytes_out=900,
                                                 train_s=0.0)
    assert rounds.upload_bytes_per_s("a") == pytest.approx(8000.0)
    assert rounds.upload_bytes_per_s("b") == pytest.approx(16000.0)
    # Round 4: a's update follows a missed round: its estimate was not measured on a known update.
    rounds.note(_row(4, {"a": 1, "b": 3}, bytes_in={"a": 4000, "b": 4000}, upload_s={"a": 2.0, "b": 0.25},
                     reasons={"a": "upload", "b": "compute"}))
    assert rounds.upload_bytes_per_s("a") == pytest.approx(8000.0)
    assert rounds.last_round("z") is None and rounds.upload_bytes_per_s("z") is None


def test_a_simulated_row_is_not_a_live_device_round():
    rounds = DeviceRounds()
    row = _row(1, {"a": 5}, bytes_in={"a": 1}, upload_s={}, reasons={})
    rounds.note(replace(row, live=None))
    assert rounds.last_round("a") is None

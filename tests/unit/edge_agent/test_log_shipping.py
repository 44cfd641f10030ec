"""The agent's log buffer: bounded (oldest first out, counted), kept until sent, sent in batches, never a loop."""

from __future__ import annotations

import logging

import pytest

from edge_agent.log_shipping import BATCH_LINES, LogBuffer, ship
from flexfl.exchange import LogKept, LogLine


@pytest.fixture
def logger():
    """A logger of its own with a LogBuffer attached (removed after the test)."""
    lg = logging.getLogger("test.log_shipping")
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    buffer = LogBuffer(max_records=5)
    lg.addHandler(buffer)
    yield lg, buffer
    lg.removeHandler(buffer)


def test_the_buffer_keeps_info_and_above_and_drops_the_oldest_when_full(logger):
    lg, buffer = logger
    lg.debug("not kept")
    for i in range(7):
        lg.info("line %d", i)
    lines, dropped = buffer.take()
    assert [x.message for x in lines] == [f"line {i}" for i in range(2, 7)] and dropped == 2
    assert all(x.level == "INFO" and x.logger == "test.log_shipping" for x in lines)


def test_a_traceback_travels_with_its_record(logger):
    lg, buffer = logger
    try:
        raise ValueError("boom")
    except ValueError:
        lg.exception("it failed")
    (line,), _ = buffer.take()
    assert line.level == "ERROR" and line.message.startswith("it failed\nTraceback")
    assert "ValueError: boom" in line.message


def test_records_stay_until_a_send_succeeds(logger):
    lg, buffer = logger
    for i in range(3):
        lg.warning("w%d", i)
    assert ship(buffer, lambda lines, dropped: None) is False
    assert len(buffer) == 3  # nothing lost by a failed send
    got: list[list[LogLine]] = []
    assert ship(buffer, lambda lines, dropped: got.append(lines) or LogKept(kept=len(lines), dropped=dropped))
    assert [x.message for x in got[0]] == ["w0", "w1", "w2"] and len(buffer) == 0


def test_ship_sends_in_batches_and_a_send_that_logs_cannot_keep_it_going():
    buffer = LogBuffer(max_records=10_000)
    lg = logging.getLogger("test.log_shipping.batches")
    lg.propagate = False
    lg.addHandler(buffer)
    try:
        for i in range(2 * BATCH_LINES + 1):
            lg.info("%d", i)
        sizes: list[int] = []

        def send(lines, dropped):
            sizes.append(len(lines))
            lg.info("sent a batch")  # a record made while sending: waits for the next ship()
            return LogKept(kept=len(lines), dropped=0)

        assert ship(buffer, send)
        # As many batches as the buffer held at the start: the records of the first two sends ride with the third,
        # the third's waits for the next ship().
        assert sizes == [BATCH_LINES, BATCH_LINES, 3]
        assert [x.message for x in buffer.take()[0]] == ["sent a batch"]
    finally:
        lg.removeHandler(buffer)


def test_the_dropped_count_is_sent_once(logger):
    lg, buffer = logger
    for i in range(6):
        lg.info("%d", i)
    sent: list[int] = []
    assert ship(buffer, lambda lines, dropped: sent.append(dropped) or LogKept(kept=len(lines), dropped=dropped))
    assert sent == [1] and buffer.take() == ([], 0)

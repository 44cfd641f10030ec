"""One deadline per device: offering the model, taking an update and closing the round follow deadline_for."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from coordinator.open_round import OpenRound, check_open, check_report, with_grace
from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Federation
from flexfl.errors import UpdateRejected, WrongRoundState
from flexfl.exchange import UpdateReport
from flexfl.vocabulary import StopReason

OPENED, DEADLINE = 100.0, 10.0


def _round(participants=("a", "b")) -> OpenRound:
    fed = Federation(rules=RulesConfig(), dataset="synthetic", params={"w": torch.zeros(2)})
    fed.apply_events(arrivals=[Arrival(d, 10) for d in participants])
    opening = fed.open(1)
    return OpenRound(round_id=1, lr=opening.lr, opened_at=OPENED, deadline_s=DEADLINE, opening=opening,
                     participants=list(participants), params=fed.params, summed=fed.start_sum(opening))


def test_a_device_has_until_its_delivery_plus_deadline_and_grace_else_until_the_opening_plus_deadline():
    r = _round()
    assert with_grace(DEADLINE) == pytest.approx(10.5) and with_grace(1.0) == pytest.approx(1.2)  # 5 %, >= 0.2 s
    assert r.deadline_for("a") == OPENED + DEADLINE  # not delivered yet
    assert r.offers_model_to("a", now=OPENED + DEADLINE - 0.01)
    assert not r.offers_model_to("a", now=OPENED + DEADLINE)  # too late to start: no model handed over
    r.mark_delivered("a", 100, now=OPENED + 4.0)
    assert r.deadline_for("a") == OPENED + 4.0 + 10.5
    assert not r.offers_model_to("a", now=OPENED + 5.0)  # once per round


def test_the_round_closes_at_the_last_deadline_of_a_device_it_waits_for():
    r = _round()
    assert r.closes_at() == OPENED + DEADLINE  # nobody has the model: the opening's deadline
    r.mark_delivered("a", 100, now=OPENED + 1.0)
    r.mark_delivered("b", 100, now=OPENED + 3.0)
    assert r.closes_at() == r.deadline_for("b") == OPENED + 3.0 + 10.5
    r.answered("b")
    assert r.closes_at() == r.deadline_for("a") == OPENED + 1.0 + 10.5  # b answered: a's deadline counts


def test_an_update_after_its_devices_deadline_or_for_a_round_not_open_is_a_state_error():
    r = _round()
    r.mark_delivered("a", 100, now=OPENED)
    r.check_update("a", 1, now=r.deadline_for("a"))  # at the deadline: still taken
    with pytest.raises(WrongRoundState, match="the deadline of device 'a' has passed"):
        r.check_update("a", 1, now=r.deadline_for("a") + 0.01)
    with pytest.raises(WrongRoundState, match="device 'b' has not received round 1's model"):
        r.check_update("b", 1, now=OPENED)
    with pytest.raises(WrongRoundState, match="device 'z' does not take part in round 1"):
        r.check_update("z", 1, now=OPENED)
    with pytest.raises(WrongRoundState, match=r"round 2 is not open \(open round: 1\)"):
        r.check_update("a", 2, now=OPENED)
    with pytest.raises(WrongRoundState, match=r"round 1 is not open \(open round: None\)"):
        check_open(None, 1)


def test_each_device_of_a_closed_round_has_a_stop_reason_the_agents_or_the_coordinators() -> None:
    r = _round(participants=("a", "b", "c"))
    for d in ("a", "b"):
        r.mark_delivered(d, 100, now=OPENED)
    r.take("a", UpdateReport(round_id=1, updates_completed=7, stop_reason=StopReason.UPLOAD),
           {"w": torch.ones(2).numpy()}, bytes_in=10, now=OPENED + 1.0)
    # a: its agent's reason; b took the model and sent nothing in time; c never took it; z is not in the round
    assert r.stop_reasons(["a", "b", "c", "z"]) == {"a": StopReason.UPLOAD, "b": StopReason.MISSED,
                                                    "c": StopReason.OFFLINE, "z": StopReason.OFFLINE}


def test_a_stop_reason_that_contradicts_s_is_refused_and_an_older_agents_unknown_is_not() -> None:
    E = 20
    check_report(UpdateReport(round_id=1, updates_completed=E, stop_reason=StopReason.COMPLETE), required_updates=E)
    check_report(UpdateReport(round_id=1, updates_completed=7, stop_reason=StopReason.UNKNOWN), required_updates=E)
    with pytest.raises(UpdateRejected, match="stop_reason = complete contradicts updates_completed = 7"):
        check_report(UpdateReport(round_id=1, updates_completed=7, stop_reason=StopReason.COMPLETE),
                     required_updates=E)
    with pytest.raises(UpdateRejected, match="stop_reason = compute contradicts updates_completed = 20"):
        check_report(UpdateReport(round_id=1, updates_completed=E, stop_reason=StopReason.COMPUTE),
                     required_updates=E)


def test_a_round_is_deserted_when_every_participant_left_before_sending_an_update() -> None:
    r = _round()
    assert replace(r, participants=[]).deserted()  # nobody took part (all departed before it opened)
    r.left.add("a")
    assert not r.deserted()  # b may still answer, or count as s = 0 at its deadline
    r.left.add("b")
    assert r.deserted()
    stayed = _round()
    stayed.mark_delivered("a", 10, now=OPENED)
    stayed.take("a", UpdateReport(round_id=1, updates_completed=0), {}, bytes_in=10, now=OPENED + 1)
    stayed.left.update({"a", "b"})  # a answered s = 0, then left: the round happened
    assert not stayed.deserted()


def test_a_devices_state_in_the_round_follows_its_model_its_deadline_and_its_answer():
    r = _round(participants=("a", "b", "c", "d"))
    assert {d: r.state_of(d, now=OPENED) for d in "abcdz"} == {"a": "pending", "b": "pending", "c": "pending",
                                                                  "d": "pending", "z": ""}
    assert r.state_of("a", now=OPENED + DEADLINE + 0.01) == "late"  # never took its model: out of the round
    for d in "abc":
        r.mark_delivered(d, 100, now=OPENED + 1.0)
    r.take("b", UpdateReport(round_id=1, updates_completed=3), {"w": torch.ones(2).numpy()}, bytes_in=50,
           now=OPENED + 2.0)
    r.left.add("c")
    now = OPENED + 2.0
    assert [r.state_of(d, now=now) for d in "abcd"] == ["training", "answered", "left", "pending"]
    assert r.state_of("a", now=r.deadline_for("a") + 0.01) == "late"
    r.closed = True
    assert r.state_of("a", now=now) == ""

"""The round the live coordinator has open: who takes part, each device's deadline, what arrived.

A device's time runs from the delivery of its model (proto/fleet.proto: deadline_s counts
from receipt), so each has a deadline of its own: `deadline_for`, the one rule that offering
the model, taking an update and closing the round all follow. Not thread-safe by itself: the
round engine holds its lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from coordinator.rules.round import RoundOpening, RoundSum
from flexfl.errors import UpdateRejected, WrongRoundState
from flexfl.exchange import Delta, RoundState, UpdateReport
from flexfl.vocabulary import StopReason

MAX_REJECTIONS_KEPT = 32  # reasons per device and round in the metrics row


def with_grace(deadline_s: float) -> float:
    """A device's deadline from its model's delivery, with grace for the gap between "handed to
    gRPC" and "received by the device" (5 %, at least 0.2 s)."""
    return deadline_s + max(0.2, 0.05 * deadline_s)


def check_report(report: UpdateReport, *, required_updates: int) -> None:
    """Refuse (UpdateRejected) a device's report whose numbers cannot be: s outside 0..E, a time or loss not
    finite, a stop reason that contradicts s (complete is s = E, and s = E is complete)."""
    E = required_updates
    if not 0 <= report.updates_completed <= E:
        raise UpdateRejected(f"updates_completed = {report.updates_completed} is outside 0..E (E = {E})")
    why = report.stop_reason
    if why is not StopReason.UNKNOWN and (why is StopReason.COMPLETE) != (report.updates_completed == E):
        raise UpdateRejected(f"stop_reason = {why} contradicts updates_completed = {report.updates_completed} "
                             f"(E = {E}): complete means s = E")
    for name in ("train_s", "previous_upload_s", "local_loss"):
        value = getattr(report, name)
        if not np.isfinite(value):
            raise UpdateRejected(f"header field {name} is not finite ({value})")


@dataclass
class Update:
    """What the round keeps of an accepted update (its delta went into the round's sum)."""

    s: int
    samples_used: int
    train_s: float
    local_loss: float
    bytes_in: int
    previous_upload_s: float = 0.0  # the device's own measure of its previous upload (0: none yet)
    arrived_after_s: float = 0.0  # from the model's delivery to this update's arrival
    stop_reason: StopReason = StopReason.UNKNOWN  # the agent's (edge_agent.deadline.why_stopped)


@dataclass
class OpenRound:
    round_id: int
    lr: float
    opened_at: float  # time.monotonic()
    deadline_s: float  # run.deadline_s: what devices are told
    opening: RoundOpening
    participants: list[str]
    params: Mapping[str, torch.Tensor]  # the model sent (replaced, never changed, by the close)
    summed: RoundSum  # the accepted updates, summed as they arrive
    delivered: dict[str, float] = field(default_factory=dict)
    updates: dict[str, Update] = field(default_factory=dict)
    bytes_out: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, list[str]] = field(default_factory=dict)  # every reason, in order (capped per device)
    left: set[str] = field(default_factory=set)  # participants that departed during the round
    gave_up_waiting: bool = False  # for a scripted event (run.expected_*) that did not happen
    closed: bool = False
    pull_wakeups: int = 0  # parked PullRound calls woken while this round was open

    def __post_init__(self) -> None:
        self.taking_part = frozenset(self.participants)  # O(1) membership for every pull and push
        self.waiting = set(self.participants)  # neither answered nor left: the round waits for these

    def deadline_for(self, device_id: str) -> float:
        """When `device_id`'s time in this round ends (time.monotonic()).

        Once its model is delivered: the delivery plus deadline_s and grace (with_grace);
        until then, the opening plus deadline_s, after which its model is no longer offered.
        """
        delivered = self.delivered.get(device_id)
        if delivered is None:
            return self.opened_at + self.deadline_s
        return delivered + with_grace(self.deadline_s)

    def closes_at(self) -> float:
        """When the round closes unless every participant answers (or leaves) first: the last
        deadline of a device it still waits for, and no sooner than deadline_s after opening."""
        return max([self.opened_at + self.deadline_s, *(self.deadline_for(d) for d in self.waiting)])

    def wait_for_close(self, cond: threading.Condition, stop: threading.Event, *,
                       held: Callable[[float], bool]) -> str | None:
        """Wait (holding `cond`, the engine's) until every participant answered (or left) or the
        round's last deadline passed (closes_at), and held(now) is false; returns why ("all
        answered", "deadline"), None when stopped first.

        `held`: a scripted event of this round is still to come (Membership.scripted_events_due).
        Pushes notify `cond` only when the last participant answers; deadlines are read again
        on every wake-up.
        """
        while not stop.is_set():
            now = time.monotonic()
            holding = held(now)
            if not self.waiting and not holding:
                return "all answered"
            limit = self.closes_at()
            if now >= limit and not holding:
                return "deadline"
            cond.wait(timeout=0.05 if holding else limit - now)  # held: joins and leaves are polled
        return None

    def deserted(self) -> bool:
        """Every participant left before sending an update (or none took part): nobody could train in it.

        Such a round does not count as one of run.rounds (the engine waits, as for an empty
        objective); a round where a device stayed and sent nothing by its deadline does.
        """
        return not self.updates and self.left >= self.taking_part

    def offers_model_to(self, device_id: str, *, now: float) -> bool:
        """`device_id` should be handed this round's model now."""
        return (not self.closed and device_id in self.taking_part and device_id not in self.left
                and device_id not in self.delivered and now < self.deadline_for(device_id))

    def check_update(self, device_id: str, round_id: int, *, now: float) -> None:
        """Refuse (WrongRoundState) an update this round cannot take now."""
        check_open(self, round_id)
        if device_id not in self.taking_part:
            raise WrongRoundState(f"device {device_id!r} does not take part in round {self.round_id}")
        if device_id in self.updates:
            raise WrongRoundState(f"device {device_id!r} already sent its update for round {self.round_id}")
        if device_id not in self.delivered:
            raise WrongRoundState(f"device {device_id!r} has not received round {self.round_id}'s model")
        if now > self.deadline_for(device_id):
            raise WrongRoundState(f"round {self.round_id}: the deadline of device {device_id!r} has passed")

    def take(self, device_id: str, report: UpdateReport, delta: Delta, *, bytes_in: int, now: float) -> None:
        """Add an update (checked: check_update, check_report) to the round's sum and keep its account."""
        s = int(report.updates_completed)
        self.summed.add(device_id, s=s, delta=delta)  # one model-sized multiply-add; the delta is not kept
        self.updates[device_id] = Update(s=s, samples_used=int(report.samples_used), train_s=float(report.train_s),
                                         local_loss=float(report.local_loss), bytes_in=bytes_in,
                                         previous_upload_s=float(report.previous_upload_s),
                                         arrived_after_s=now - self.delivered[device_id],
                                         stop_reason=report.stop_reason)

    def stop_reasons(self, devices: Iterable[str]) -> dict[str, StopReason]:
        """Why each device's s is what it is, once the round has closed (edge_agent.deadline.StopReason).

        A taken update: the reason its agent gave. No update taken: MISSED when the device's
        model was delivered (its update came late, was refused or never came), else OFFLINE
        (it never took the model: not connected, departed, or not in the round).
        """
        return {d: self.updates[d].stop_reason if d in self.updates
                else StopReason.MISSED if d in self.delivered else StopReason.OFFLINE for d in devices}

    def state_of(self, device_id: str, *, now: float) -> RoundState:
        """`device_id`'s part in this round now (Status): none, its model pending, training, late, answered, left."""
        if self.closed or device_id not in self.taking_part:
            return RoundState.NONE
        if device_id in self.left:
            return RoundState.LEFT
        if device_id in self.updates:
            return RoundState.ANSWERED
        if now > self.deadline_for(device_id):
            return RoundState.LATE
        return RoundState.TRAINING if device_id in self.delivered else RoundState.PENDING

    def mark_delivered(self, device_id: str, nbytes: int, *, now: float) -> None:
        """The model is fully handed to `device_id`: its deadline starts now."""
        if not self.closed:
            self.delivered[device_id] = now
            self.bytes_out[device_id] = self.bytes_out.get(device_id, 0) + nbytes

    def answered(self, device_id: str) -> bool:
        """`device_id` answered or left; True when it was the last one the round waited for."""
        self.waiting.discard(device_id)
        return not self.waiting

    def note_rejection(self, device_id: str, reason: str) -> None:
        """Keep a refused update's reason for the metrics row (s = 0 unless a valid one follows)."""
        if self.closed or device_id not in self.taking_part:
            return
        # A device may retry many times in one round: keep the metrics row bounded.
        reasons = self.rejected.setdefault(device_id, [])
        if len(reasons) < MAX_REJECTIONS_KEPT:
            reasons.append(reason)
        elif len(reasons) == MAX_REJECTIONS_KEPT:
            reasons.append("(further rejections in this round not recorded)")


def check_open(r: OpenRound | None, round_id: int) -> OpenRound:
    """`r` if it is round `round_id` and open; else WrongRoundState (an update stale or early)."""
    if r is None or r.closed or round_id != r.round_id:
        open_id = r.round_id if r is not None and not r.closed else None
        raise WrongRoundState(f"round {round_id} is not open (open round: {open_id}); stale or early update")
    return r

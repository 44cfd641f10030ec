"""The agent's deadline rule: start one more local update only while it and the upload still fit.

A device has `deadline_s` from receiving the model. Before each local update (the first
one included) it asks `may_start_update`: does the time left cover one more update plus the
upload plus a safety margin? If not, it stops and uploads the s updates it has (s = 0 when
not even the first one fits). Both durations are what the agent measured so far
(`Estimates`), not a prediction:
- one update: a running mean over rounds; after each round with s > 0, the round's mean
  time per update is averaged in with weight 1/2. It is not updated within a round.
- the upload: the last one measured. A round that sends no update (s = 0) measures nothing,
  so it multiplies the estimate by UNMEASURED_UPLOAD_DECAY instead: an estimate inflated by
  one slow stretch of link would otherwise keep the device at s = 0 for good.
Before its first measurement each counts as 0 s.

The emulated slow device (participation.min_update_s, edge_agent.device_round) is not part of the
rule: it only makes updates last longer, which the rule sees through the clock and the
update estimate like any slow update.

Why the round ended where it did (`why_stopped`, sent with the update and kept in the
coordinator's metrics row per device): s = E is "complete"; when the budget said no, the
reason is "upload" if the E - s updates still to do would have fitted in the time left had
the upload cost nothing (time left >= (E - s) * update estimate + margin), else "compute"
(even a free upload would not have let it finish). It answers "what kept this device from
E?" with the one thing that, removed, would have let it finish. The simpler "upload if the
upload estimate exceeds the time spent training" blamed the CPU of a device with the same
CPU as a complete one and a slower link: with E = 1000 on the emulated fleet, the 0.25-CPU
device at 8 Mbit/s trained 1.1 s and expected a 0.83 s upload, and the same CPU unshaped
completed E in 1.4 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flexfl.vocabulary import AGENT_REASONS, StopReason
from trace_recorder.deadline import budget_reason

# Factor applied to the upload estimate in each round that sends no update (nothing to
# measure): a device kept idle by a slow stretch of link tries again within a few rounds.
UNMEASURED_UPLOAD_DECAY = 0.5


# The vocabulary (flexfl.exchange) is the closed form's too (trace_recorder.deadline), so that a timeline's simulated
# reasons and a live run's compare one to one; importers of the agent's rule find it here too.
__all__ = ["AGENT_REASONS", "UNMEASURED_UPLOAD_DECAY", "Estimates", "Refusal", "RoundBudget", "StopReason",
           "UpdateGate", "may_start_update", "why_stopped"]


@dataclass(frozen=True)
class Refusal:
    """The budget's no to one more update: the time left then, and the update estimate and margin it weighed."""

    time_left_s: float
    update_s: float | None
    margin_s: float


def why_stopped(*, s: int, E: int, refusal: Refusal | None, agent_stopping: bool = False) -> StopReason:
    """Why a round that completed `s` of `E` updates ended there (the rule: the module docstring).

    `refusal`: the budget said no to the next update (None: it never did); `agent_stopping`: the
    agent stopped training to shut down. Short of E with neither, the round's cap (its
    participation trace or forced schedule) was reached.
    """
    if s >= E:
        return StopReason.COMPLETE
    if agent_stopping:
        return StopReason.STOPPED
    if refusal is None:
        return StopReason.TRACE
    return budget_reason(time_left_s=refusal.time_left_s, remaining_s=(E - s) * (refusal.update_s or 0.0),
                         margin_s=refusal.margin_s)


def may_start_update(*, time_left_s: float, update_s: float | None, upload_s: float | None,
                     margin_s: float) -> bool:
    """True when `time_left_s` covers one more local update, the upload and the safety margin.

    `update_s` and `upload_s` are the estimates so far; None (not measured yet) counts as 0.
    An update that fits exactly still starts.
    """
    return time_left_s >= (update_s or 0.0) + (upload_s or 0.0) + margin_s


@dataclass
class Estimates:
    """What the agent has measured so far: one local update and one upload, in seconds (None: not yet)."""

    update_s: float | None = None
    upload_s: float | None = None

    def measured_updates(self, *, updates: int, seconds: float) -> None:
        """A round did `updates` local updates in `seconds`: average its per-update time in (weight 1/2)."""
        if updates:
            per_update = seconds / updates
            self.update_s = per_update if self.update_s is None else 0.5 * self.update_s + 0.5 * per_update

    def measured_upload(self, seconds: float) -> None:
        """An upload with an update in it took `seconds`."""
        self.upload_s = seconds

    def upload_failed(self, seconds: float) -> None:
        """An upload with an update in it failed after `seconds` (refused, late, timed out): the upload
        needs at least that, so the estimate rises to it but never falls. Taking the time as a
        measurement made a refusal before the body was read (0.00 s) the estimate, and the next
        update came in late; ignoring it left a device that is late from its first round (a slow link,
        no upload measured yet) late for good, since only a failed upload says how slow the link is."""
        self.upload_s = max(self.upload_s or 0.0, seconds)

    def sent_no_update(self) -> None:
        """The round's upload carried no update (s = 0): nothing measured, the upload estimate decays."""
        if self.upload_s:
            self.upload_s *= UNMEASURED_UPLOAD_DECAY

    def after_upload(self, *, carried_update: bool, taken: bool, seconds: float) -> None:
        """Account for a round's upload that took `seconds`: measured, failed, or (no update in it) unmeasured."""
        if carried_update and taken:
            self.measured_upload(seconds)
        elif carried_update:
            self.upload_failed(seconds)
        else:
            # An empty (s = 0) push measures nothing, so an estimate too long for the deadline
            # would never be measured again and one slow stretch of link would idle the device
            # for good (seen in the soak). Each unmeasured round shrinks it until it tries again.
            self.sent_no_update()


@dataclass(frozen=True)
class RoundBudget:
    """One round's deadline on this device: `may_start_update` against a clock."""

    deadline_at: float  # the clock's reading at the deadline (receipt of the model + deadline_s)
    estimates: Estimates
    margin_s: float
    clock: Callable[[], float] = time.monotonic

    def allows_another_update(self) -> bool:
        """Whether the next local update may start now."""
        return self.refusal() is None

    def refusal(self) -> Refusal | None:
        """None when the next local update may start now; else what the rule weighed in saying no."""
        left = self.deadline_at - self.clock()
        update_s = self.estimates.update_s
        if may_start_update(time_left_s=left, update_s=update_s, upload_s=self.estimates.upload_s,
                            margin_s=self.margin_s):
            return None
        return Refusal(time_left_s=left, update_s=update_s, margin_s=self.margin_s)


class UpdateGate:
    """One round's answer to "may the next local update start?" (train_local's `keep_going`), and why it said no.

    No when the agent is stopping; else, with a `budget`, what the budget says (None: forced
    participation, which ignores time: tests, no deadline pressure). `on_boundary(done)` runs
    first at each boundary between updates (the emulated slow device's padding), so that the
    rule sees that time through its clock. After the round, `why_stopped` gives the reason.
    """

    def __init__(self, *, budget: RoundBudget | None, stopping: Callable[[], bool],
                 on_boundary: Callable[[int], None] | None = None) -> None:
        self._budget, self._stopping, self._on_boundary = budget, stopping, on_boundary
        self.refusal: Refusal | None = None  # the budget's no to the next update, if it said one
        self.agent_stopping = False  # the agent stopped training to shut down

    def __call__(self, done: int) -> bool:
        """Whether update number `done` + 1 may start now (`done` updates are finished)."""
        if self._on_boundary is not None:
            self._on_boundary(done)
        if self._stopping():
            self.agent_stopping = True
            return False
        if self._budget is None:
            return True
        self.refusal = self._budget.refusal()
        return self.refusal is None

    @property
    def said_no(self) -> bool:
        """The last question was answered no: the round ended at a boundary, not at its cap."""
        return self.refusal is not None or self.agent_stopping

    def why_stopped(self, *, s: int, E: int) -> StopReason:
        """Why the round ended at `s` of `E` updates (why_stopped, with what this gate saw)."""
        return why_stopped(s=s, E=E, refusal=self.refusal, agent_stopping=self.agent_stopping)

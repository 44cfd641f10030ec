"""The agent's deadline rule under a fake clock: s = 0, 0 < s < E and s = E, the estimates it uses, and why
a round stopped where it did."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_agent.deadline import (
    UNMEASURED_UPLOAD_DECAY,
    Estimates,
    Refusal,
    RoundBudget,
    UpdateGate,
    may_start_update,
    why_stopped,
)
from edge_agent.trainer import train_local
from flexfl.vocabulary import StopReason
from workloads.datasets import ArrayDataset
from workloads.models import build_model

E = 5
UPDATE_S = 1.0  # what one local update takes on the fake clock (and what the agent has measured)
UPLOAD_S = 0.5
MARGIN_S = 0.25  # binary fractions: "fits exactly" is exact in floating point


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def train_under_deadline(deadline_s: float, estimates: Estimates, *, update_s: float = UPDATE_S,
                         refusals: list[Refusal] | None = None) -> tuple[int, list[float]]:
    """Run train_local for up to E updates, each taking `update_s` of fake time, stopped by the round's gate.

    Returns s and the time left at each check (so a test can see which checks ran); the
    budget's refusal, if it said no, is appended to `refusals`.
    """
    s, asked, gate = train_with_gate(deadline_s, estimates, update_s=update_s)
    if gate.refusal is not None and refusals is not None:
        refusals.append(gate.refusal)
    return s, asked


def train_with_gate(deadline_s: float, estimates: Estimates, *, update_s: float = UPDATE_S,
                    stopping: bool = False, forced: bool = False) -> tuple[int, list[float], UpdateGate]:
    """train_local for up to E updates under the agent's UpdateGate on a fake clock: s, the time left
    at each check, and the gate (which remembers why it said no)."""
    clock = FakeClock()
    received = clock.now
    budget = RoundBudget(deadline_at=received + deadline_s, estimates=estimates, margin_s=MARGIN_S, clock=clock)
    asked: list[float] = []

    def updates_took_their_time(done: int) -> None:
        clock.now = received + done * update_s  # the `done` updates so far took their time
        asked.append(budget.deadline_at - clock.now)
        assert budget.allows_another_update() == (budget.refusal() is None)

    gate = UpdateGate(budget=None if forced else budget, stopping=lambda: stopping,
                      on_boundary=updates_took_their_time)
    rng = np.random.default_rng(0)
    data = ArrayDataset(x=rng.normal(size=(32, 8)).astype(np.float32), y=rng.integers(0, 2, size=32))
    torch.manual_seed(0)
    model = build_model("logreg", in_features=8, num_classes=2)
    result = train_local(model, data, updates=E, lr=0.1, batch_size=8, rng=np.random.default_rng(1),
                         keep_going=gate)
    return result.updates_completed, asked, gate


@pytest.mark.parametrize("deadline_s, expected_s", [
    (1.5, 0),  # 1.5 s left < 1 + 0.5 + 0.25: not even the first update starts
    (3.6, 2),  # after 2 updates 1.6 s are left: too little for a third and the upload
    (6.0, E),  # after 4 updates 2.0 s are left: the fifth fits, and E is the cap
], ids=["s=0", "0<s<E", "s=E"])
def test_the_agent_starts_an_update_only_while_it_and_the_upload_fit(deadline_s: float, expected_s: int) -> None:
    s, asked = train_under_deadline(deadline_s, Estimates(update_s=UPDATE_S, upload_s=UPLOAD_S))
    assert s == expected_s
    # The rule was asked before every update that ran and, short of E, once more to stop.
    assert len(asked) == min(expected_s + 1, E)
    assert asked[-1] == pytest.approx(deadline_s - (len(asked) - 1) * UPDATE_S)


def test_an_update_that_fits_exactly_still_starts() -> None:
    need = UPDATE_S + UPLOAD_S + MARGIN_S
    estimates = Estimates(update_s=UPDATE_S, upload_s=UPLOAD_S)
    assert train_under_deadline(4 * UPDATE_S + need, estimates)[0] == E
    assert train_under_deadline(4 * UPDATE_S + need - 0.01, estimates)[0] == E - 1
    assert may_start_update(time_left_s=need, update_s=UPDATE_S, upload_s=UPLOAD_S, margin_s=MARGIN_S)
    assert not may_start_update(time_left_s=need - 1e-9, update_s=UPDATE_S, upload_s=UPLOAD_S, margin_s=MARGIN_S)


def test_before_any_measurement_only_the_margin_is_kept() -> None:
    # A first round knows neither duration (both count as 0): updates start until less than
    # the margin is left, here at 0 s left after 3 updates of 1 s in a 3 s round.
    s, asked = train_under_deadline(3.0, Estimates())
    assert s == 3
    assert asked == [3.0, 2.0, 1.0, 0.0]


def test_the_update_estimate_is_a_running_mean_over_rounds_and_ignores_rounds_without_updates() -> None:
    est = Estimates()
    est.measured_updates(updates=0, seconds=5.0)  # s = 0: nothing to divide by, nothing learnt
    assert est.update_s is None
    est.measured_updates(updates=4, seconds=2.0)
    assert est.update_s == 0.5
    est.measured_updates(updates=2, seconds=3.0)  # 1.5 s per update this round
    assert est.update_s == pytest.approx(0.5 * 0.5 + 0.5 * 1.5)


def test_a_round_without_an_update_shrinks_the_upload_estimate_until_the_device_fits_again() -> None:
    est = Estimates(update_s=UPDATE_S)
    est.sent_no_update()
    assert est.upload_s is None  # nothing measured yet: nothing to shrink
    est.measured_upload(16.0)  # one slow stretch of link
    rounds_idle = 0
    while not may_start_update(time_left_s=3.0, update_s=est.update_s, upload_s=est.upload_s, margin_s=MARGIN_S):
        est.sent_no_update()
        rounds_idle += 1
    assert est.upload_s == 16.0 * UNMEASURED_UPLOAD_DECAY ** rounds_idle
    assert rounds_idle == 4  # 16 -> 8 -> 4 -> 2 -> 1 s: 1 + 1 + 0.25 fits in 3 s


def test_a_failed_upload_raises_the_estimate_to_its_time_and_never_lowers_it() -> None:
    est = Estimates(update_s=UPDATE_S)
    est.measured_upload(0.5)
    est.upload_failed(0.0)  # refused before the body was read: says nothing about the link
    assert est.upload_s == 0.5
    est.upload_failed(3.7)  # late or timed out after 3.7 s: the upload needs at least this
    assert est.upload_s == 3.7
    est.upload_failed(1.0)
    assert est.upload_s == 3.7
    first = Estimates()  # late in its first round, before any upload was measured: it learns the link
    first.upload_failed(1.6)
    assert first.upload_s == 1.6


@pytest.mark.parametrize("deadline_s, update_s, upload_s, expected", [
    (1.5, 1.0, 0.5, (0, StopReason.COMPUTE)),  # 5 updates of 1 s could not fit in 1.5 s even with a free upload
    (3.6, 1.0, 0.5, (2, StopReason.COMPUTE)),  # 1.6 s left, the 3 updates still to do need 3 s + margin
    (6.0, 1.0, 0.5, (E, StopReason.COMPLETE)),
    (3.0, 0.25, 4.0, (0, StopReason.UPLOAD)),  # the upload alone overruns; 5 x 0.25 s + margin would fit
    (4.0, 0.5, 2.0, (3, StopReason.UPLOAD)),  # 2.5 s left after 3 updates: the other 2 fit, not with the upload
], ids=["s=0 compute", "0<s<E compute", "s=E complete", "s=0 upload", "0<s<E upload"])
def test_a_round_stopped_by_the_budget_says_whether_its_cpu_or_its_upload_kept_it_from_E(
        deadline_s: float, update_s: float, upload_s: float, expected: tuple[int, StopReason]) -> None:
    refusals: list[Refusal] = []
    s, asked = train_under_deadline(deadline_s, Estimates(update_s=update_s, upload_s=upload_s), update_s=update_s,
                                    refusals=refusals)
    assert (s, why_stopped(s=s, E=E, refusal=refusals[-1] if refusals else None)) == expected
    assert len(refusals) == (s < E)  # the budget said no once, and only short of E
    if refusals:
        assert refusals[0] == Refusal(time_left_s=asked[-1], update_s=update_s, margin_s=MARGIN_S)


def test_upload_is_the_reason_exactly_when_the_remaining_updates_would_have_fitted_without_it() -> None:
    fits = Refusal(time_left_s=2 * UPDATE_S + MARGIN_S, update_s=UPDATE_S, margin_s=MARGIN_S)
    assert why_stopped(s=E - 2, E=E, refusal=fits) is StopReason.UPLOAD  # exactly fits: the upload took the room
    short = Refusal(time_left_s=2 * UPDATE_S + MARGIN_S - 0.125, update_s=UPDATE_S, margin_s=MARGIN_S)
    assert why_stopped(s=E - 2, E=E, refusal=short) is StopReason.COMPUTE
    # Nothing measured yet (a first round): the budget stops only inside the margin, which is compute.
    first = Refusal(time_left_s=MARGIN_S / 2, update_s=None, margin_s=MARGIN_S)
    assert why_stopped(s=3, E=E, refusal=first) is StopReason.COMPUTE


def test_a_round_the_budget_did_not_stop_was_capped_by_its_trace_or_stopped_by_the_agent() -> None:
    assert why_stopped(s=3, E=E, refusal=None) is StopReason.TRACE  # the trace's draw (or forced schedule) was 3
    assert why_stopped(s=0, E=E, refusal=None) is StopReason.TRACE  # a draw of 0: the budget was never asked
    some = Refusal(time_left_s=0.0, update_s=UPDATE_S, margin_s=MARGIN_S)
    assert why_stopped(s=3, E=E, refusal=None, agent_stopping=True) is StopReason.STOPPED
    assert why_stopped(s=E, E=E, refusal=some, agent_stopping=True) is StopReason.COMPLETE  # s = E says it all


@pytest.mark.parametrize("deadline_s, expected_s, why", [
    (1.5, 0, StopReason.COMPUTE),  # not even one update: the 5 updates would not have fitted a free upload either
    (3.6, 2, StopReason.COMPUTE),  # 1.6 s left for 3 more updates of 1 s
    (5.5, 4, StopReason.UPLOAD),  # 1.5 s left: the last update (+ margin) fits, the upload with it does not
    (6.0, E, StopReason.COMPLETE),
], ids=["s=0", "0<s<E compute", "0<s<E upload", "s=E"])
def test_the_gate_remembers_why_the_round_stopped_where_it_did(deadline_s: float, expected_s: int,
                                                               why: StopReason) -> None:
    s, _, gate = train_with_gate(deadline_s, Estimates(update_s=UPDATE_S, upload_s=UPLOAD_S))
    assert (s, gate.why_stopped(s=s, E=E)) == (expected_s, why)
    assert (gate.refusal is None) == (s == E)  # s = E: the budget never said no
    assert not gate.agent_stopping


def test_the_gate_says_no_to_an_agent_that_is_stopping_and_forced_participation_ignores_time() -> None:
    s, asked, gate = train_with_gate(60.0, Estimates(update_s=UPDATE_S, upload_s=UPLOAD_S), stopping=True)
    assert (s, len(asked), gate.why_stopped(s=s, E=E)) == (0, 1, StopReason.STOPPED)
    # Forced: no budget, so a deadline that would allow nothing still lets all E updates run.
    s, asked, gate = train_with_gate(0.0, Estimates(update_s=UPDATE_S, upload_s=UPLOAD_S), forced=True)
    assert (s, len(asked), gate.refusal, gate.why_stopped(s=s, E=E)) == (E, E, None, StopReason.COMPLETE)


def test_after_an_upload_the_estimate_is_measured_raised_or_decayed_by_what_the_push_was() -> None:
    est = Estimates(upload_s=2.0)
    est.after_upload(carried_update=True, taken=True, seconds=0.5)  # taken: measured, even when shorter
    assert est.upload_s == 0.5
    est.after_upload(carried_update=True, taken=False, seconds=0.25)  # refused: at least as long, never lower
    assert est.upload_s == 0.5
    est.after_upload(carried_update=True, taken=False, seconds=3.0)
    assert est.upload_s == 3.0
    est.after_upload(carried_update=False, taken=True, seconds=0.01)  # no update in it: nothing measured, decays
    assert est.upload_s == 3.0 * UNMEASURED_UPLOAD_DECAY

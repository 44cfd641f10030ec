"""The deadline rule in closed form: s = 0, 0 < s < E, s = E, offline, and the link that is too slow."""

from __future__ import annotations

import pytest

from edge_agent.deadline import Refusal, why_stopped
from flexfl.errors import ConfigError
from flexfl.vocabulary import StopReason
from trace_recorder.deadline import DeadlineOutcome, updates_before_deadline
from trace_recorder.timeline import OFFLINE, Conditions

# 100 kB model: 800 kbit, so 8 s over 100 kbit/s and 0.1 s over 8000 kbit/s.
MODEL_BYTES = 100_000
FAST_LINK = Conditions(cpu_share=1.0, up_kbit_s=8000, down_kbit_s=8000, online=True)


def _s(conditions: Conditions, *, E: int = 20, deadline_s: float = 2.0, update_s: float = 0.1,
       margin_s: float = 0.05) -> DeadlineOutcome:
    return updates_before_deadline(conditions, E=E, deadline_s=deadline_s, update_s=update_s,
                                   model_bytes=MODEL_BYTES, margin_s=margin_s)


def test_s_is_e_when_every_update_and_the_upload_fit() -> None:
    # room = 2.0 - 0.05 - 0.1 (down) - 0.1 (up) = 1.75 s: 17 updates of 0.1 s; E = 10 caps it.
    assert _s(FAST_LINK, E=10) == DeadlineOutcome(10, StopReason.COMPLETE)


def test_s_between_0_and_e_counts_the_whole_updates_that_leave_room_for_the_upload() -> None:
    # room 1.75 s, updates of 0.1 / 0.5 = 0.2 s: 8 whole updates (8.75 would need a ninth).
    half = Conditions(cpu_share=0.5, up_kbit_s=8000, down_kbit_s=8000, online=True)
    assert _s(half) == DeadlineOutcome(8, StopReason.COMPUTE)
    assert _s(FAST_LINK) == DeadlineOutcome(17, StopReason.COMPUTE)  # full share: 17 of E = 20


def test_s_short_of_e_says_upload_when_e_updates_would_fit_without_it() -> None:
    # E = 10 updates of 0.1 s need 1 s of the 2.0 - 0.1 (down) - 0.05 s; a 1 s upload leaves room for 8.
    slow_up = Conditions(cpu_share=1.0, up_kbit_s=800, down_kbit_s=8000, online=True)
    assert _s(slow_up, E=10) == DeadlineOutcome(8, StopReason.UPLOAD)
    assert _s(slow_up, E=19) == DeadlineOutcome(8, StopReason.COMPUTE)  # 1.9 s: not even with a free upload


@pytest.mark.parametrize("up_kbit_s", [800, 2000, 8000])
@pytest.mark.parametrize("cpu_share", [0.3, 1.0])
def test_the_closed_forms_reason_is_the_agents_at_its_refusal(up_kbit_s: float, cpu_share: float) -> None:
    """The agent, stepped with these steady times, stops at the same s and gives the same reason."""
    E, deadline_s, margin_s = 12, 2.0, 0.05
    conditions = Conditions(cpu_share=cpu_share, up_kbit_s=up_kbit_s, down_kbit_s=8000, online=True)
    outcome = _s(conditions, E=E, deadline_s=deadline_s, margin_s=margin_s)
    per_update_s, down_s, up_s = 0.1 / cpu_share, 0.1, 8 * MODEL_BYTES / 1000 / up_kbit_s
    s, clock = 0, down_s  # the coordinator's clock: the download is inside the deadline
    refusal = None
    while s < E:
        left = deadline_s - clock
        if left < per_update_s + up_s + margin_s:
            refusal = Refusal(time_left_s=left, update_s=per_update_s, margin_s=margin_s)
            break
        s, clock = s + 1, clock + per_update_s
    assert (s, why_stopped(s=s, E=E, refusal=refusal)) == tuple(outcome)


def test_an_exact_fit_counts_the_last_update() -> None:
    # room = 0.6 - 0 - 0.1 - 0.1 = 0.4 s, computed as 0.39999999999999997: still 8 updates of 0.05 s.
    assert _s(FAST_LINK, deadline_s=0.6, update_s=0.05, margin_s=0.0).s == 8


def test_s_is_0_when_the_upload_fits_but_not_one_update() -> None:
    slow_cpu = Conditions(cpu_share=0.01, up_kbit_s=8000, down_kbit_s=8000, online=True)  # 10 s per update
    assert _s(slow_cpu) == DeadlineOutcome(0, StopReason.COMPUTE)
    no_cpu = Conditions(cpu_share=0.0, up_kbit_s=8000, down_kbit_s=8000, online=True)
    assert _s(no_cpu) == DeadlineOutcome(0, StopReason.COMPUTE)


def test_s_is_0_when_not_even_the_upload_fits() -> None:
    slow_up = Conditions(cpu_share=1.0, up_kbit_s=100, down_kbit_s=8000, online=True)  # 8 s upload
    assert _s(slow_up) == DeadlineOutcome(0, StopReason.UPLOAD)
    slow_down = Conditions(cpu_share=1.0, up_kbit_s=8000, down_kbit_s=100, online=True)  # 8 s download
    assert _s(slow_down) == DeadlineOutcome(0, StopReason.UPLOAD)
    cut = Conditions(cpu_share=1.0, up_kbit_s=0, down_kbit_s=8000, online=True)
    assert _s(cut) == DeadlineOutcome(0, StopReason.UPLOAD)


def test_s_is_0_offline_whatever_the_other_conditions() -> None:
    assert _s(OFFLINE) == DeadlineOutcome(0, StopReason.OFFLINE)
    assert _s(Conditions(cpu_share=1.0, up_kbit_s=8000, down_kbit_s=8000, online=False)) == (0, StopReason.OFFLINE)


def test_the_margin_is_kept_free() -> None:
    # room without margin 1.8 s: 18 updates; the agent's 0.05 s margin costs the 18th.
    assert _s(FAST_LINK, margin_s=0.0).s == 18
    assert _s(FAST_LINK, margin_s=0.05).s == 17


@pytest.mark.parametrize("kwargs, match", [
    ({"E": 0}, "E >= 1"),
    ({"deadline_s": 0.0}, "deadline_s"),
    ({"update_s": float("nan")}, "update_s"),
    ({"margin_s": -0.1}, "margin_s"),
])
def test_bad_parameters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _s(FAST_LINK, **kwargs)


@pytest.mark.parametrize("cpu_share", [0.05, 0.3, 0.77, 1.0])
@pytest.mark.parametrize("up_kbit_s", [150.0, 900.0, 8000.0])
@pytest.mark.parametrize("deadline_s", [1.0, 3.7, 9.0])
def test_the_closed_form_is_the_agents_rule_stepped_with_steady_times(cpu_share: float, up_kbit_s: float,
                                                                      deadline_s: float) -> None:
    """The agent's own rule (edge_agent.deadline.may_start_update), asked before each update with the
    steady times the closed form assumes, stops at the same s: the two cannot drift apart."""
    from edge_agent.deadline import may_start_update

    E, update_s, margin_s = 20, 0.1, 0.05
    conditions = Conditions(cpu_share=cpu_share, up_kbit_s=up_kbit_s, down_kbit_s=8000, online=True)
    download_s = 8 * MODEL_BYTES / 1000 / conditions.down_kbit_s
    upload_s = 8 * MODEL_BYTES / 1000 / up_kbit_s
    per_update_s = update_s / cpu_share
    s, time_left_s = 0, deadline_s - download_s
    while s < E and may_start_update(time_left_s=time_left_s + 1e-12, update_s=per_update_s, upload_s=upload_s,
                                     margin_s=margin_s):
        s, time_left_s = s + 1, time_left_s - per_update_s
    closed = _s(conditions, E=E, deadline_s=deadline_s, update_s=update_s, margin_s=margin_s)
    assert closed.s == s

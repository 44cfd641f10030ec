"""The deadline rule as arithmetic: how many local updates s a device completes under given conditions.

The live agent measures as it goes (the rule: edge_agent.deadline.may_start_update): after
receiving the model it starts another update only while `now + update + upload + margin <=
deadline`, with the update and upload times estimated from what it measured before; the
coordinator's deadline clock starts when it hands the model to gRPC, so the download is
inside it too (traces/README.md, "Recording a set"). With a device's conditions known (a timeline) and
its times steady, that rule has a closed form, used by the simulator and meant for the
live side's predictions alike:

    download_s   = 8 * model_bytes / (1000 * down_kbit_s)
    upload_s     = 8 * model_bytes / (1000 * up_kbit_s)
    per_update_s = update_s / cpu_share               (update_s: one update at cpu_share 1)
    room_s       = deadline_s - download_s - margin_s - upload_s
    s            = min(E, floor(room_s / per_update_s))    if online and room_s >= 0, else 0

What the closed form leaves out, on purpose: the agent's first round (no estimates yet),
time-varying conditions inside a round (the simulator takes the round's start), protobuf
and gRPC framing on top of the raw float32 payload, and contention between devices.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from flexfl.errors import ConfigError
from flexfl.vocabulary import StopReason
from trace_recorder.timeline import Conditions

# Absorbs float rounding where updates fit exactly (0.6 - 0.2 = 0.39999999999999997: 7.99... updates of 0.05 s).
_EXACT_FIT = 1e-9


def budget_reason(*, time_left_s: float, remaining_s: float, margin_s: float) -> StopReason:
    """Why the budget said no to an update (s < E): "upload" if the updates still to do (`remaining_s`
    of compute) would have fitted in the time left had the upload cost nothing, else "compute"
    (edge_agent.deadline's docstring gives the reasoning and the measurement behind it)."""
    return StopReason.UPLOAD if time_left_s >= remaining_s + margin_s - _EXACT_FIT else StopReason.COMPUTE


class DeadlineOutcome(NamedTuple):
    s: int
    why: StopReason


class WorkTimes(NamedTuple):
    """What a round's work takes a device under steady conditions: the model's way down, one local update, the
    update's way up (seconds; math.inf where the link or the CPU share is 0)."""

    download_s: float
    per_update_s: float
    upload_s: float

    def finish_s(self, updates: int) -> float:
        """Seconds from the model's sending to the update's arrival, with `updates` local updates."""
        return self.download_s + (updates * self.per_update_s if updates else 0.0) + self.upload_s


def work_times(conditions: Conditions, *, update_s: float, model_bytes: int) -> WorkTimes | None:
    """The module docstring's download_s, per_update_s and upload_s under `conditions`; None when offline."""
    if not conditions.online:
        return None
    kbit = 8 * model_bytes / 1000
    down_s, up_s = (kbit / rate if rate > 0 else (math.inf if kbit else 0.0)
                    for rate in (conditions.down_kbit_s, conditions.up_kbit_s))
    per_update_s = update_s / conditions.cpu_share if conditions.cpu_share > 0 else math.inf
    return WorkTimes(down_s, per_update_s, up_s)


def updates_before_deadline(conditions: Conditions, *, E: int, deadline_s: float, update_s: float,
                            model_bytes: int, margin_s: float) -> DeadlineOutcome:
    """s: the whole local updates that fit before the deadline with the upload still fitting, capped at E.

    `update_s` is one local update's compute time at cpu_share 1, `model_bytes` what is
    downloaded and uploaded, `margin_s` what the agent keeps free before the deadline
    (edge_agent.config.AgentConfig.safety_margin_s). The formulas: the module docstring.
    """
    if E < 1:
        raise ConfigError(f"need E >= 1, got {E}")
    for name, value in (("deadline_s", deadline_s), ("update_s", update_s), ("margin_s", margin_s)):
        if not math.isfinite(value) or value < 0 or (value == 0 and name != "margin_s"):
            raise ConfigError(f"{name} must be a finite number > 0{' (or 0)' if name == 'margin_s' else ''}, got "
                              f"{value}")
    if model_bytes < 0:
        raise ConfigError(f"model_bytes must be >= 0, got {model_bytes}")
    times = work_times(conditions, update_s=update_s, model_bytes=model_bytes)
    if times is None:
        return DeadlineOutcome(0, StopReason.OFFLINE)
    down_s, per_update_s, up_s = times
    room_s = deadline_s - margin_s - down_s - up_s
    if room_s < 0:  # the link alone overruns the deadline
        return DeadlineOutcome(0, StopReason.UPLOAD)
    if conditions.cpu_share == 0:
        return DeadlineOutcome(0, StopReason.COMPUTE)
    s = min(E, math.floor(room_s / per_update_s + _EXACT_FIT))
    if s == E:
        return DeadlineOutcome(s, StopReason.COMPLETE)
    # The agent's reason at its refusal: the time left after s updates against the E - s still to do
    return DeadlineOutcome(s, budget_reason(time_left_s=deadline_s - down_s - s * per_update_s,
                                            remaining_s=(E - s) * per_update_s, margin_s=margin_s))

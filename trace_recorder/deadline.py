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
from enum import StrEnum
from typing import NamedTuple

from flexfl.errors import ConfigError
from trace_recorder.timeline import Conditions

# Absorbs float rounding where updates fit exactly (0.6 - 0.2 = 0.39999999999999997: 7.99... updates of 0.05 s).
_EXACT_FIT = 1e-9


class Why(StrEnum):
    """Why a device's s is what it is."""

    COMPLETE = "complete"  # s = E
    OUT_OF_TIME = "out of time"  # s < E: one more update would leave no time for the upload
    LINK_TOO_SLOW = "link too slow"  # download plus upload alone overrun the deadline: s = 0
    OFFLINE = "offline"  # s = 0


class DeadlineOutcome(NamedTuple):
    s: int
    why: Why


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
    if not conditions.online:
        return DeadlineOutcome(0, Why.OFFLINE)
    kbit = 8 * model_bytes / 1000
    transfer_s = sum(kbit / rate if rate > 0 else (math.inf if kbit else 0.0)
                     for rate in (conditions.down_kbit_s, conditions.up_kbit_s))
    room_s = deadline_s - margin_s - transfer_s
    if room_s < 0:
        return DeadlineOutcome(0, Why.LINK_TOO_SLOW)
    if conditions.cpu_share == 0:
        return DeadlineOutcome(0, Why.OUT_OF_TIME)
    s = min(E, math.floor(room_s * conditions.cpu_share / update_s + _EXACT_FIT))
    return DeadlineOutcome(s, Why.COMPLETE if s == E else Why.OUT_OF_TIME)

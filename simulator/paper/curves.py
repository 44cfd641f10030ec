"""Measures on per-round curves: recovery after an arrival (Table 4), crossing after a departure (Table 5).

Round numbering follows the engine: a device that arrives during round A trains from
round A + 1 (the paper's tau_0 = A + 1: "joins at tau_0"); a device that departs at
round D trained in D and the objective shifts at D (the paper's tau_0 = D). Values are
indexed by round: `curve[r]` is the evaluation after round r closed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Recovery:
    """Rounds trained with the newcomer until the curve is back at the baseline (None: not within the run)."""

    rounds: int | None
    baseline: float
    horizon: int  # rounds available after the arrival


def rounds_to_recover(curve: Mapping[int, float], *, first_round: int, baseline: float,
                      higher_is_better: bool) -> Recovery:
    """Rounds from `first_round` (the first one the newcomer trains in) until `curve` reaches `baseline`.

    1 when the first round's evaluation already reaches it (the paper's smallest count);
    accuracy reaches it from below (>=), loss from above (<=). NaN never reaches anything.
    """
    rounds = sorted(r for r in curve if r >= first_round)
    for r in rounds:
        v = curve[r]
        if math.isfinite(v) and (v >= baseline if higher_is_better else v <= baseline):
            return Recovery(rounds=r - first_round + 1, baseline=baseline, horizon=len(rounds))
    return Recovery(rounds=None, baseline=baseline, horizon=len(rounds))


@dataclass(frozen=True)
class Crossing:
    """Rounds after the departure until the exclude curve is at or below the include curve."""

    rounds: int | None  # None: they did not cross within the run
    excluded_worse_at_first: bool  # the objective shift raised the loss first, as the paper expects
    horizon: int


def rounds_until_cross(include: Mapping[int, float], exclude: Mapping[int, float], *, departure_round: int) -> Crossing:
    """First round r > departure_round with exclude[r] <= include[r], as r - departure_round.

    Losses; rounds present in both curves only. 1 when excluding is already no worse one
    round after the shift.
    """
    rounds = sorted(r for r in include if r > departure_round and r in exclude)
    first_worse = bool(rounds) and exclude[rounds[0]] > include[rounds[0]]
    for r in rounds:
        if math.isfinite(exclude[r]) and math.isfinite(include[r]) and exclude[r] <= include[r]:
            return Crossing(rounds=r - departure_round, excluded_worse_at_first=first_worse, horizon=len(rounds))
    return Crossing(rounds=None, excluded_worse_at_first=first_worse, horizon=len(rounds))

"""The simulated clock: how long a device's work takes, and when a simulated round opens and closes.

A simulation counts rounds; the questions of issue 36 (sync or async, time to an accuracy) need
seconds. Two things give a simulation seconds, both from what a device's work costs:

- **Device times** (`work_times(shard, round_index)`, a trace_recorder.deadline.WorkTimes: the
  model's way down, one local update, the way up), from the run's source of s:
  - a device timeline (simulator.timeline_source.TimelineParticipation): the device's conditions
    at the round's start, through trace_recorder.deadline.work_times, the arithmetic of the
    deadline rule that also gives its s (one rule for both);
  - a trace set with a deadline D (simulator.participation.TraceParticipation): a device that
    completed s of E local updates within D is taken to have spent D on them: D / s per update,
    the transfers folded into it (a fraction says nothing about them apart), so E updates take
    D E / s. At s = E that is an upper bound (a trace records no faster than "all in time"); at
    s = 0 the round says nothing about its speed: None, the device is absent that round.
    D is the set's recorded deadline (a recorded set's manifest) or [clock] deadline_s
    (`flexfl sim run --deadline-s`; the paper's calibrated set has none of its own).
- **Round times** (RoundClock): a synchronous round lasts its deadline. Round tau opens at
  (tau - 1) x round_s and closes deadline_s later; round_s, the time between round starts, is the
  deadline unless a timeline run says otherwise (`--round-s`). The close is the record's clock_s.
  Under [clock] wait_all (FedAvg waiting for everyone, `--wait-all`: simulator.participation.WaitForAll)
  a round has no deadline: it opens when the one before it closed, every participant that can work
  does E updates, and it closes when the last of them arrives (plan_task: a timeline's conditions
  at the opening second, or E updates at the speed of the trace's round-tau fraction).
  The server's aggregation and evaluation take no simulated time (as the timeline's rounds
  assume: simulator.timeline_source).

Without a deadline there is no clock: records have clock_s None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from flexfl.errors import ConfigError
from trace_recorder.deadline import WorkTimes


@dataclass(frozen=True)
class ClockConfig:
    """[clock]: the deadline a trace set's fractions were completed in, for the simulated clock, in seconds (None, or a
    SimConfig without [clock]: the set's own recorded deadline, or no clock; a timeline run's deadline is its own,
    --deadline-s), and whether rounds wait for all their participants instead of closing at the deadline."""

    deadline_s: float | None = None
    # FedAvg waiting for everyone (simulator.participation.WaitForAll): every participant that can work does all E
    # local updates, and a round lasts until the last one's update arrives; the deadline only says what a trace's
    # fraction took (D / s per update) and how long an offline device waits before trying again.
    wait_all: bool = False
    # The run ends at its first round (server step) that closes at or after this simulated second; [run] rounds
    # stays the cap. None: rounds alone. Runs compared on time (sync against async) get the same horizon so.
    until_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("deadline_s", "until_s"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ConfigError(f"clock.{name} must be a finite number of seconds > 0, got {value}")

    def ended(self, clock_s: float | None) -> bool:
        """Whether a run whose last row closed at `clock_s` has reached until_s (never without a clock or a horizon)."""
        return self.until_s is not None and clock_s is not None and clock_s >= self.until_s


@dataclass(frozen=True)
class RoundClock:
    """When synchronous rounds open and close on the simulated clock (the module docstring)."""

    deadline_s: float
    round_s: float | None = None  # seconds between round starts; None: the deadline

    def __post_init__(self) -> None:
        for name in ("deadline_s", "round_s"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ConfigError(f"the clock's {name} must be a finite number of seconds > 0, got {value}")

    @property
    def every_s(self) -> float:
        return self.round_s if self.round_s is not None else self.deadline_s

    def opens_s(self, round_index: int) -> float:
        """Simulated seconds at round `round_index`'s opening (round 1 opens at 0)."""
        return (round_index - 1) * self.every_s

    def closes_s(self, round_index: int) -> float:
        """Simulated seconds at round `round_index`'s close: its opening plus the deadline."""
        return self.opens_s(round_index) + self.deadline_s


@dataclass(frozen=True)
class WaitAllClock(RoundClock):
    """Rounds without a deadline ([clock] wait_all): round 1 opens at 0, each later one when the one before it closed,
    and a round closes when its last participant's update arrives. The closes are set as rounds are drawn
    (simulator.participation.WaitForAll); deadline_s and every_s stay the base clock's (a trace's fraction, an
    offline device's wait)."""

    closes: dict[int, float] = field(default_factory=dict, compare=False)

    def opens_s(self, round_index: int) -> float:
        return 0.0 if round_index == 1 else self.closes_s(round_index - 1)

    def closes_s(self, round_index: int) -> float:
        try:
            return self.closes[round_index]
        except KeyError:
            raise ConfigError(f"round {round_index} has not been drawn yet: a round that waits for all its "
                              "participants closes when they arrive, and the next one opens then") from None


@dataclass(frozen=True)
class TaskPlan:
    """What one task of an asynchronous run's device does: s local updates, arriving `duration_s` after its pull."""

    s: int
    duration_s: float


@runtime_checkable
class TimedParticipation(Protocol):
    """A source of s that also knows what devices' work costs, and so gives the run a clock."""

    @property
    def clock(self) -> RoundClock | None:
        """The run's round clock (None: the source knows no deadline)."""
        ...

    def work_times(self, shard: int, round_index: int) -> WorkTimes | None:
        """Device `shard`'s times in round `round_index` (None: absent, or nothing known of its speed)."""
        ...


@runtime_checkable
class TaskSource(Protocol):
    """A source of s that plans a device's work from any second, not only from a round's start (a timeline in
    seconds: simulator.timeline_source.TimelineParticipation.task_at)."""

    def task_at(self, shard: int, at_s: float, *, budget: bool) -> TaskPlan | None:
        """Device `shard`'s work started at `at_s`: E updates, or with `budget` what fits the deadline."""
        ...


def clock_of(participation: object) -> RoundClock | None:
    """The round clock of a run's source of s, or None (a source without times: a fixed table)."""
    return participation.clock if isinstance(participation, TimedParticipation) else None


def plan_task(participation: object, clock: RoundClock, *, shard: int, ordinal: int, at_s: float, E: int,
              budget: bool) -> TaskPlan | None:
    """Device `shard`'s task number `ordinal` started at second `at_s`: E updates (with `budget`: what fits the
    deadline) and the time until they arrive; None: unavailable. A TaskSource plans it from the second; any other
    source of s draws the task's s as its round `ordinal` (`participation.draw`) and times it as a fraction of the
    clock's deadline (times_from_fraction)."""
    if isinstance(participation, TaskSource):
        return participation.task_at(shard, at_s, budget=budget)
    s = participation.draw(shard, ordinal)  # type: ignore[attr-defined]
    times = times_from_fraction(s, deadline_s=clock.deadline_s)
    if times is None:
        return None
    done = s if budget else E
    return TaskPlan(s=done, duration_s=times.finish_s(done))


def times_from_fraction(s: int, *, deadline_s: float) -> WorkTimes | None:
    """A trace's device times (the module docstring): D / s per update, no separate transfer; None at s = 0."""
    if s <= 0:
        return None
    return WorkTimes(download_s=0.0, per_update_s=deadline_s / s, upload_s=0.0)

"""Where a simulated run's s come from: the Participation protocol and its sources.

Sources: FixedParticipation (a given table, e.g. a live run's s), TraceParticipation (each
device draws from a trace, as live agents do), SharedDraws (one TraceParticipation that paired
runs share) and simulator.timeline_source.TimelineParticipation (the deadline rule over a device
timeline, which also knows why each s is what it is); WaitForAll turns any source with a clock
into rounds without a deadline (FedAvg waiting for everyone).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from flexfl.errors import ConfigError
from flexfl.vocabulary import StopReason
from simulator.clock import RoundClock, TaskSource, WaitAllClock, clock_of, plan_task, times_from_fraction
from simulator.sim_config import SimConfig
from trace_recorder.deadline import WorkTimes
from trace_recorder.format import TraceSet
from trace_recorder.sampler import TraceSampler, assign_traces


@dataclass(frozen=True)
class RoundDraws:
    """The s of the devices asked for, in their order, and why each stopped where the source knows (else None)."""

    s: list[int]
    why: list[str] | None = None


class Participation(Protocol):
    """What the engine asks of a source of s (simulator.run_state.RunState); callers may bring their own
    (trace_recorder.fidelity.experiment's AfterStart: a live run's s, then the traces')."""

    @property
    def trace_names(self) -> Sequence[str]:
        """What device k follows (SimResult.trace_assignment, run.json); empty where nothing is followed."""
        ...

    def draw(self, shard: int, round_index: int) -> int:
        """The s of device `shard` (its shard index) in round `round_index` (from 1)."""
        ...


@runtime_checkable
class ExplainedParticipation(Participation, Protocol):
    """A source that also knows why each s is what it is (a timeline's deadline rule): rows' "stop_reason"."""

    def round_draws(self, shards: Sequence[int], round_index: int) -> RoundDraws:
        """The s of devices `shards` in round `round_index`, and why each stopped where it did."""
        ...


def round_draws(participation: Participation, shards: Sequence[int], round_index: int) -> RoundDraws:
    """The s of devices `shards` in round `round_index`, with the reasons where the source knows them."""
    if isinstance(participation, ExplainedParticipation):
        return participation.round_draws(shards, round_index)
    return RoundDraws(s=[participation.draw(k, round_index) for k in shards])


class FixedParticipation:
    """A given s per device per round (cycled), e.g. to replay a live run: schedule[round][shard]."""

    trace_names: Sequence[str] = ()

    def __init__(self, schedule, *, E: int) -> None:
        arr = np.asarray(schedule, dtype=np.int64)
        if arr.ndim != 2 or arr.size == 0:
            raise ConfigError(f"schedule must be a non-empty [rounds][devices] table, got shape {arr.shape}")
        if arr.min() < 0 or arr.max() > E:
            raise ConfigError(f"schedule values must lie in 0..E (E = {E})")
        self._schedule = arr

    def draw(self, shard: int, round_index: int) -> int:
        return int(self._schedule[(round_index - 1) % len(self._schedule), shard])


class TraceParticipation:
    """Each device follows a trace (assign_traces) and draws s from it (TraceSampler).

    `assignment` fixes the trace (index into the first num_traces) device k follows, e.g. a
    recorded set's own device -> trace map (trace_recorder.fidelity.experiment); None: assign_traces' draw.
    """

    def __init__(self, traces: TraceSet, cfg: SimConfig, *, assignment: Sequence[int] | None = None) -> None:
        chosen = traces.first(cfg.traces.num_traces)
        E = cfg.rules.required_updates
        if assignment is None:
            assignment = [int(j) for j in assign_traces(cfg.partition.n_devices, n_traces=len(chosen), seed=cfg.seed)]
        elif len(assignment) != cfg.partition.n_devices or not all(0 <= j < len(chosen) for j in assignment):
            raise ConfigError(f"trace assignment {list(assignment)} must give each of {cfg.partition.n_devices} "
                              f"devices a trace index in 0..{len(chosen) - 1}")
        self.samplers = [TraceSampler(chosen[j], E=E, seed=cfg.seed, device_index=k,
                                      sampling=cfg.rules.trace_sampling, s_rule=cfg.rules.s_rule)
                         for k, j in enumerate(assignment)]
        self.trace_names = [s.trace.name for s in self.samplers]
        # [clock] deadline_s, or the set's own
        deadline_s = (cfg.clock.deadline_s if cfg.clock else None) or traces.manifest.deadline_s
        self.clock = RoundClock(deadline_s) if deadline_s else None

    def draw(self, shard: int, round_index: int) -> int:
        return self.samplers[shard].draw(round_index)

    def work_times(self, shard: int, round_index: int) -> WorkTimes | None:
        """The device's times as its draw gives them (simulator.clock: D / s per update); None without a clock."""
        if self.clock is None:
            return None
        return times_from_fraction(self.draw(shard, round_index), deadline_s=self.clock.deadline_s)


class SharedDraws:
    """A TraceParticipation that paired runs in lock-step share: each (device, round) is drawn once."""

    def __init__(self, participation: TraceParticipation) -> None:
        self.participation = participation
        self.trace_names = participation.trace_names
        self.clock = participation.clock
        self._round, self._s = 0, dict[int, int]()

    def draw(self, shard: int, round_index: int) -> int:
        if round_index != self._round:
            self._round, self._s = round_index, {}
        if shard not in self._s:
            self._s[shard] = self.participation.draw(shard, round_index)
        return self._s[shard]

    def work_times(self, shard: int, round_index: int) -> WorkTimes | None:
        if self.clock is None:
            return None
        return times_from_fraction(self.draw(shard, round_index), deadline_s=self.clock.deadline_s)


class WaitForAll:
    """Rounds without a deadline over a source with a clock: FedAvg waiting for everyone ([clock] wait_all,
    `flexfl sim run --wait-all`).

    In round tau every participant the source lets work at all does E local updates (s = E, stop
    reason complete); one it does not (offline in its timeline, s = 0 in its trace's round-tau
    draw, a CPU share or link of 0) has s = 0 (offline, or trace). The round opens when round
    tau - 1 closed and closes when its last update arrives: the opening plus the longest of the
    participants' times for E updates (simulator.clock.plan_task: a timeline's conditions at the
    opening second; a trace's round-tau fraction s_tau of the deadline D read as D / s_tau per
    update, so E updates take D E / s_tau). A round where nobody can work lasts the base clock's
    every_s. Any strategy then aggregates complete updates only, which is FedAvg for Schemes A, B
    and C alike.
    """

    def __init__(self, inner: Participation, *, E: int) -> None:
        base = clock_of(inner)
        if base is None:
            raise ConfigError("rounds that wait for all their participants (--wait-all) need the simulated clock, and "
                              "this source of s gives none: a trace set needs a deadline (a recorded set's own, or "
                              "--deadline-s SECONDS) or use a timeline (--timeline FILE --deadline-s SECONDS)")
        self.inner, self.E, self.base = inner, E, base
        self.trace_names = inner.trace_names
        self.clock = WaitAllClock(deadline_s=base.deadline_s, round_s=base.round_s)

    def round_draws(self, shards: Sequence[int], round_index: int) -> RoundDraws:
        """s (E or 0) of devices `shards` in round `round_index`; sets the round's close on the clock."""
        at = self.clock.opens_s(round_index)
        plans = [plan_task(self.inner, self.base, shard=k, ordinal=round_index, at_s=at, E=self.E, budget=False)
                 for k in shards]
        works = [p is not None and p.s > 0 and math.isfinite(p.duration_s) for p in plans]
        absent = StopReason.OFFLINE if isinstance(self.inner, TaskSource) else StopReason.TRACE
        durations = [p.duration_s for p, w in zip(plans, works) if w and p is not None]
        self.clock.closes[round_index] = at + (max(durations) if durations else self.base.every_s)
        return RoundDraws(s=[self.E if w else 0 for w in works],
                          why=[str(StopReason.COMPLETE if w else absent) for w in works])

    def draw(self, shard: int, round_index: int) -> int:
        """Device `shard`'s s in round `round_index` (E or 0), without setting the round's close."""
        plan = plan_task(self.inner, self.base, shard=shard, ordinal=round_index,
                         at_s=self.clock.opens_s(round_index), E=self.E, budget=False)
        return self.E if plan is not None and plan.s > 0 and math.isfinite(plan.duration_s) else 0

    def work_times(self, shard: int, round_index: int) -> WorkTimes | None:
        """What E updates of device `shard` take from round `round_index`'s opening, folded into one time per update
        (the transfers included); None: it cannot work that round."""
        plan = plan_task(self.inner, self.base, shard=shard, ordinal=round_index,
                         at_s=self.clock.opens_s(round_index), E=self.E, budget=False)
        if plan is None or plan.s <= 0 or not math.isfinite(plan.duration_s):
            return None
        return WorkTimes(download_s=0.0, per_update_s=plan.duration_s / self.E, upload_s=0.0)

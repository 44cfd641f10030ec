"""Where a simulated run's s come from: the Participation protocol and its sources.

Sources: FixedParticipation (a given table, e.g. a live run's s), TraceParticipation (each
device draws from a trace, as live agents do), SharedDraws (one TraceParticipation that paired
runs share) and simulator.timeline_source.TimelineParticipation (the deadline rule over a device
timeline, which also knows why each s is what it is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from flexfl.errors import ConfigError
from simulator.clock import RoundClock, times_from_fraction
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
        deadline_s = cfg.clock.deadline_s if cfg.clock else traces.manifest.deadline_s  # [clock], else the set's
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

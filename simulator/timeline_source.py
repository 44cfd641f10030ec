"""s from a device timeline instead of a trace set (`flexfl sim run --timeline FILE`).

A trace set gives each device a distribution of s to draw from (trace_recorder.sampler). A
timeline gives each device its conditions over time (trace_recorder.timeline), and its s in
round tau is what the agent's deadline rule completes under the conditions at the round's
start (trace_recorder.deadline.updates_before_deadline): no randomness, so s is a pure
function of (device, round) as with traces.

- Devices: simulated device k is `dev-k` (workloads.partition_spec.device_id, the ids `flexfl live`
  gives its agents and the importers give theirs) and follows that device's rows; devices of
  the timeline beyond the simulation's are not used.
- Time: a `start_round` timeline is read at round id tau; a `start_s` one at
  (tau - 1) * round_s seconds, round_s defaulting to the deadline (a live round lasts its
  deadline when its slowest device uses all of it; evaluation between rounds is left out).
- Cost: update_s (one local update at cpu_share 1), or sample_s times the samples of one
  update (the batch size for E in steps, the device's n_k for E in epochs); the model's
  float32 parameters are what goes down and up (the wire's payload, without its framing);
  the agent's safety margin (edge_agent.config.AgentConfig.safety_margin_s) is kept free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.rules.config import RulesConfig
from edge_agent.config import AgentConfig
from flexfl.config import to_dict
from flexfl.errors import ConfigError
from flexfl.vocabulary import Unit
from simulator.clock import RoundClock, TaskPlan
from simulator.participation import RoundDraws
from simulator.sim_config import SimConfig
from trace_recorder.deadline import DeadlineOutcome, WorkTimes, updates_before_deadline, work_times
from trace_recorder.timeline import Timeline, TimeUnit, describe_names, read_timeline
from workloads.partition_spec import PartitionSpec, device_id


@dataclass(frozen=True)
class TimelineRun:
    """How a simulation reads a timeline: the round's deadline and what a device's work costs."""

    path: str
    deadline_s: float
    update_s: float | None = None  # one local update at cpu_share 1, seconds
    sample_s: float | None = None  # or one training sample at cpu_share 1, seconds
    round_s: float | None = None  # seconds between round starts (start_s timelines); None: deadline_s
    margin_s: float = AgentConfig.safety_margin_s

    def __post_init__(self) -> None:
        if (self.update_s is None) == (self.sample_s is None):
            raise ConfigError("a timeline run needs what one update costs at full CPU share: --update-s SECONDS "
                              "(per update) or --sample-s SECONDS (per training sample), one of them")
        for name in ("deadline_s", "update_s", "sample_s", "round_s"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ConfigError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
        if not math.isfinite(self.margin_s) or self.margin_s < 0:
            raise ConfigError(f"margin_s must be a finite number >= 0, got {self.margin_s}")

    @property
    def seconds_per_round(self) -> float:
        return self.round_s if self.round_s is not None else self.deadline_s


def model_bytes(cfg: SimConfig) -> int:
    """Bytes of the model's float32 parameters: what a device downloads and uploads each round."""
    from workloads.federated import initial_model

    _, params = initial_model(cfg.partition.dataset, seed=cfg.seed)
    return sum(int(p.numel()) * 4 for p in params.values())


def samples_per_update(cfg: SimConfig, sample_counts: Sequence[int]) -> list[int]:
    """Training samples in one local update, per device: the batch size (E in steps) or n_k (E in epochs)."""
    if cfg.rules.unit is Unit.EPOCH:
        return [int(n) for n in sample_counts]
    return [cfg.rules.batch_size_for(cfg.partition.dataset)] * len(sample_counts)


class TimelineParticipation:
    """s per device and round from a timeline and the deadline rule; a participation source for run_simulation."""

    def __init__(self, timeline: Timeline, cfg: SimConfig, run: TimelineRun, *, sample_counts: Sequence[int],
                 model_bytes: int) -> None:
        n = cfg.partition.n_devices
        names = [device_id(k) for k in range(n)]
        missing = [name for name in names if name not in timeline.devices]
        if missing:
            raise ConfigError(f"{run.path}: no rows for {', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''} "
                              f"(the simulation has {n} devices {device_id(0)}..{device_id(n - 1)}; the timeline has "
                              f"{describe_names(list(timeline.devices))})")
        if len(sample_counts) != n:
            raise ConfigError(f"sample_counts has {len(sample_counts)} devices, the partition {n}")
        self.timeline, self.run, self.names = timeline, run, names
        self.E = cfg.rules.required_updates
        self.model_bytes = model_bytes
        if run.update_s is not None:
            self.update_s = [run.update_s] * n
        else:
            assert run.sample_s is not None  # TimelineRun checks one of the two is given
            self.update_s = [run.sample_s * k for k in samples_per_update(cfg, sample_counts)]
        self.trace_names = [f"timeline {name}" for name in names]  # SimResult.trace_assignment, run.json
        self.clock = RoundClock(run.deadline_s, run.round_s)

    def time_of(self, round_index: int) -> float:
        """Where round `round_index` (from 1) reads the timeline: its round id or its start in seconds."""
        if self.timeline.unit is TimeUnit.ROUND:
            return round_index
        return (round_index - 1) * self.run.seconds_per_round

    def outcome(self, shard: int, round_index: int) -> DeadlineOutcome:
        """s and why, for device `shard` in round `round_index`."""
        conditions = self.timeline.conditions_at(self.names[shard], self.time_of(round_index))
        return updates_before_deadline(conditions, E=self.E, deadline_s=self.run.deadline_s,
                                       update_s=self.update_s[shard], model_bytes=self.model_bytes,
                                       margin_s=self.run.margin_s)

    def draw(self, shard: int, round_index: int) -> int:
        return self.outcome(shard, round_index).s

    def work_times(self, shard: int, round_index: int) -> WorkTimes | None:
        """Device `shard`'s download, per-update and upload times under the conditions at the round's start (None:
        offline): the deadline rule's own arithmetic (trace_recorder.deadline.work_times)."""
        conditions = self.timeline.conditions_at(self.names[shard], self.time_of(round_index))
        return work_times(conditions, update_s=self.update_s[shard], model_bytes=self.model_bytes)

    def task_at(self, shard: int, at_s: float, *, budget: bool) -> TaskPlan | None:
        """An asynchronous task of device `shard` started at second `at_s` (simulator.async_run): E updates, or with
        `budget` the deadline rule's s within the deadline, and the time they take under the conditions then; None:
        offline, nothing fits the budget, or no CPU share."""
        if self.timeline.unit is TimeUnit.ROUND:
            raise ConfigError(f"{self.run.path}: an asynchronous run reads a timeline in seconds (start_s, end_s); "
                              "this one counts rounds")
        conditions = self.timeline.conditions_at(self.names[shard], at_s)
        times = work_times(conditions, update_s=self.update_s[shard], model_bytes=self.model_bytes)
        if times is None:
            return None
        s = self.E
        if budget:
            s = updates_before_deadline(conditions, E=self.E, deadline_s=self.run.deadline_s,
                                        update_s=self.update_s[shard], model_bytes=self.model_bytes,
                                        margin_s=self.run.margin_s).s
        duration_s = times.finish_s(s)
        return TaskPlan(s=s, duration_s=duration_s) if s > 0 and math.isfinite(duration_s) else None

    def round_draws(self, shards: Sequence[int], round_index: int) -> RoundDraws:
        """s and why (rows' "stop_reason", as a live run's rows record it) for devices `shards`."""
        outcomes = [self.outcome(k, round_index) for k in shards]
        return RoundDraws(s=[o.s for o in outcomes], why=[str(o.why) for o in outcomes])

    def rounds_covered(self) -> int:
        """Rounds that start before the timeline ends (after it, every device is offline)."""
        if self.timeline.unit is TimeUnit.ROUND:
            return max(0, math.ceil(self.timeline.end) - 1)
        return math.ceil(self.timeline.end / self.run.seconds_per_round)


def timeline_participation(cfg: SimConfig, run: TimelineRun, *, sample_counts: Sequence[int]) -> TimelineParticipation:
    """Read `run.path` and make the participation source for `cfg`."""
    return TimelineParticipation(read_timeline(Path(run.path)), cfg, run, sample_counts=sample_counts,
                                 model_bytes=model_bytes(cfg))


def sim_run_argv(*, partition: PartitionSpec, rules: RulesConfig, rounds: int, seed: int, run: TimelineRun,
                 arrivals: Sequence[tuple[int, int]] = (), departures: Sequence[tuple[int, int]] = ()) -> list[str]:
    """`flexfl sim run` with the flags that make its config this one (e.g. a live run's) over `run`'s timeline.

    Every [partition] and [rules] value that differs from sim run's default is given by the flag
    that sets it (found on the flags' own parsers, so a new flag needs nothing here); `arrivals`
    and `departures` are (device, round) pairs (--arrive / --depart); the strategy is --scheme.
    """
    base = SimConfig()
    argv = ["flexfl", "sim", "run", "--timeline", run.path, "--deadline-s", f"{run.deadline_s:g}"]
    for name in ("update_s", "sample_s", "round_s"):
        value = getattr(run, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", f"{value:g}"]
    argv += _flags_for({"partition": to_dict(partition), "rules": to_dict(rules)},
                       {"partition": to_dict(base.partition), "rules": to_dict(base.rules)})
    argv += ["--scheme", rules.aggregation.name]
    if rules.aggregation.proximal_mu:
        argv += ["--mu", f"{rules.aggregation.proximal_mu:g}"]
    if rounds != base.rounds:
        argv += ["--rounds", str(rounds)]
    if seed != base.seed:
        argv += ["--seed", str(seed)]
    argv += [arg for k, r in arrivals for arg in ("--arrive", f"{k}@{r}")]
    argv += [arg for k, r in departures for arg in ("--depart", f"{k}@{r}")]
    return argv


def _flags_for(values: dict[str, dict[str, Any]], defaults: dict[str, dict[str, Any]]) -> list[str]:
    """The partition and rules flags (workloads.cli, coordinator.cli) that set `values` where not `defaults`."""
    import argparse

    from coordinator.cli import add_rules_flags
    from flexfl.config import FLAG_PREFIX
    from workloads.cli import add_partition_flags

    parser = argparse.ArgumentParser(add_help=False)
    add_partition_flags(parser)
    add_rules_flags(parser, scheme=False)
    out: list[str] = []
    for action in parser._actions:
        table, _, key = action.dest.removeprefix(FLAG_PREFIX).partition(".")
        if not action.dest.startswith(FLAG_PREFIX) or key == "mu":  # mu goes with --scheme fedprox
            continue
        value = values.get(table, {}).get(key)
        if value is None or value == defaults.get(table, {}).get(key):
            continue
        if action.nargs == 0:  # --iid / --non-iid, --fast-reboot / --no-fast-reboot: the one that sets value
            if action.const == value:
                out.append(action.option_strings[0])
        else:
            out += [action.option_strings[0], f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def sim_run_hint(command: Sequence[str], *, update_s: float, device_rounds: int) -> str:
    """The line `flexfl live --emulate --timeline` prints after its run: the measured cost and the matching sim run."""
    import shlex

    return (f"timeline: one local update took {update_s:.3g} s at cpu_share 1 (median of {device_rounds} "
            f"device-rounds, train_s / s x cpu_share): `{shlex.join(command)}` derives s from the same timeline")

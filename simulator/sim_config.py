"""What determines a simulation run: SimConfig and its tables ([traces], [schedule]), read and compared.

With its seed a SimConfig determines a run exactly (simulator.engine); `runs_alike` says when a
saved config means the same run (sweeps reuse finished runs, checkpoints resume).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar

from coordinator.rules.config import RulesConfig
from flexfl.config import Moved, coerce_enums, plugin_path_field
from flexfl.errors import ConfigError
from flexfl.run_spec import RunSpec
from flexfl.vocabulary import DeparturePolicy
from simulator.clock import ClockConfig
from simulator.paper_numbers import DEFAULT_PARTITION
from simulator.trainers.trainer_kind import ROW_KINDS, TrainerKind, cache_trainer_available
from trace_recorder import PAPER_TRACE_SET
from trace_recorder.traces_table import TracesConfig
from workloads.partition_spec import PartitionSpec

DEFAULT_TRACE_SET = PAPER_TRACE_SET


class ExtraTest(StrEnum):
    """Test sets evaluated every round beside the objective's (rows' "extra_tests").

    start: the holdouts of the devices present at round 0 (an arrival's paper baseline on
    the old test set); active: the holdouts of the devices that still train (an included
    departed device's data left out).
    """

    START = "start"
    ACTIVE = "active"


@dataclass(frozen=True)
class ArrivalEvent:
    """Device `device` (its shard index) is absent until it arrives in round `round`.

    It joins the objective at the close of that round (the test set gains its holdout from
    that round's evaluation) and trains from the next round on, with fast-reboot.
    """

    device: int
    round: int


@dataclass(frozen=True)
class DepartureEvent:
    """Device `device` trains in round `round` and leaves at its close, under `policy` (default: rules')."""

    device: int
    round: int
    policy: DeparturePolicy | None = None


@dataclass(frozen=True)
class ScheduleConfig:
    """[schedule]: arrivals and departures ([[schedule.arrivals]] device = 3, round = 30)."""

    arrivals: tuple[ArrivalEvent, ...] = ()
    departures: tuple[DepartureEvent, ...] = ()

    def __post_init__(self) -> None:
        for d in self.departures:
            coerce_enums(d)

    def check(self, n_devices: int, rounds: int) -> None:
        seen: set[int] = set()
        for kind, events in (("arrival", self.arrivals), ("departure", self.departures)):
            for e in events:
                if not 0 <= e.device < n_devices:
                    raise ConfigError(f"schedule: {kind} of device {e.device}, outside 0..{n_devices - 1}")
                if not 1 <= e.round <= rounds:
                    raise ConfigError(f"schedule: {kind} of device {e.device} at round {e.round}, outside 1..{rounds}")
        for e in self.arrivals:
            if e.device in seen:
                raise ConfigError(f"schedule: device {e.device} arrives twice")
            seen.add(e.device)
        left: set[int] = set()
        for e in self.departures:
            if e.device in left:
                raise ConfigError(f"schedule: device {e.device} departs twice")
            left.add(e.device)
            arrival = next((a.round for a in self.arrivals if a.device == e.device), 0)
            if e.round <= arrival:
                raise ConfigError(f"schedule: device {e.device} departs at round {e.round}, not after its arrival "
                                  f"at round {arrival}")


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a simulation run (with the seed, it determines it exactly).

    Its [run] table (rounds, seed: flexfl.run_spec.RunSpec) is every program's; runs saved
    before it, with rounds and seed at the top level, still read (MOVED_KEYS), as the same runs."""

    MOVED_KEYS: ClassVar[dict[str, Moved]] = {"rounds": Moved("run.rounds"), "seed": Moved("run.seed")}

    partition: PartitionSpec = DEFAULT_PARTITION
    rules: RulesConfig = field(default_factory=RulesConfig)
    traces: TracesConfig = field(default_factory=TracesConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    # [clock]: the simulated clock's deadline for a trace set (simulator.clock); None (left out of files, so runs saved
    # before it read back byte-equal): a recorded set's own deadline, or no clock
    clock: ClockConfig | None = None
    # seed: initial model, trace assignment, s draws, minibatches (the partition has its own)
    run: RunSpec = field(default_factory=lambda: RunSpec(rounds=200))
    trainer: TrainerKind = TrainerKind.AUTO
    extra_tests: tuple[ExtraTest, ...] = ()
    plugin_path: str | None = plugin_path_field()  # a folder put on sys.path for the plug-ins named here

    def __post_init__(self) -> None:
        coerce_enums(self)
        object.__setattr__(self, "extra_tests", tuple(ExtraTest(t) for t in self.extra_tests))
        self.rules.check_for(self.partition.dataset)
        if self.rules.plugin_model and self.trainer in ROW_KINDS:
            raise ConfigError(f"trainer = {self.trainer.value!r} has kernels for the built-in models only; the plug-in "
                              f"model {self.rules.model!r} trains with trainer = 'plain' (or 'auto', which picks it)")
        self.schedule.check(self.partition.n_devices, self.rounds)

    @property
    def rounds(self) -> int:
        return self.run.rounds

    @property
    def seed(self) -> int:
        return self.run.seed

    def with_run(self, **changes: Any) -> SimConfig:
        """This config with [run] keys changed: cfg.with_run(seed=3, rounds=10)."""
        return replace(self, run=replace(self.run, **changes))

    def in_effect(self) -> SimConfig:
        """This config with the rules' constants of departure policies its departures never use
        at a fixed value (RulesConfig.in_effect): equal for configs that run alike."""
        used = {d.policy or self.rules.departure_policy for d in self.schedule.departures}
        return replace(self, rules=self.rules.in_effect(used))

    @property
    def trainer_kind(self) -> TrainerKind:
        if self.trainer is not TrainerKind.AUTO:
            return self.trainer
        if self.rules.plugin_model:
            return TrainerKind.PLAIN  # the row trainers' kernels are the built-in models'
        return TrainerKind.CACHE if cache_trainer_available() else TrainerKind.FAST

    @property
    def batched(self) -> bool:
        """Trained by a row trainer (cache or fast), which paired runs share; not the plain per-device loop."""
        return self.trainer_kind in ROW_KINDS


def runs_alike(saved: object, cfg: SimConfig) -> bool:
    """A saved config (a dict as flexfl.config.to_dict wrote it) means `cfg` if it reads back
    equal where a run uses it (SimConfig.in_effect): fields added since, at their defaults,
    and the constants of departure policies the run never uses do not count; older forms
    (rounds and seed at the top level, scheme beside a strategy) read as the same run."""
    from flexfl.config import from_dict

    if not isinstance(saved, dict):
        return False
    rules = saved.get("rules")
    if isinstance(rules, dict) and rules.get("strategy") is not None and "scheme" in rules:
        # Written before [rules] took scheme or strategy, not both: scheme = "C" beside the strategy
        saved = {**saved, "rules": {k: v for k, v in rules.items() if k != "scheme"}}
    try:
        return from_dict(SimConfig, saved, where="saved run").in_effect() == cfg.in_effect()
    except (ConfigError, TypeError):
        return False

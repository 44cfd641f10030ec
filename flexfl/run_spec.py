"""The table a run's config shares across programs: [run] (length, seed, deadline).

One owner for the keys that a coordinator file, a `flexfl live` file, a `flexfl sim run` file and
a campaign's base config share (docs/config.md): RunSpec for a simulation (rounds, seed),
DeadlineRunSpec for a run with devices (also deadline_s), which the coordinator's RunConfig
extends with its own keys ([traces], the traces devices follow, is trace_recorder.traces_table's).
Each program sets its own defaults through its config's field
default (a live run: 30 rounds of 2 s; the coordinator: 100 of 10 s; a simulation: 200 rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

from flexfl.errors import ConfigError


@dataclass(frozen=True)
class RunSpec:
    """[run] of every program: how many rounds, and the seed of the initial model, minibatches and trace draws."""

    rounds: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ConfigError(f"run.rounds must be >= 1, got {self.rounds}")


@dataclass(frozen=True)
class DeadlineRunSpec(RunSpec):
    """[run] of a run with devices (coordinator, `flexfl live`): also each round's deadline."""

    deadline_s: float = 10.0  # per round, from the moment a device has the model

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.deadline_s > 0:
            raise ConfigError(f"run.deadline_s must be > 0, got {self.deadline_s}")

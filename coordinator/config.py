"""Coordinator configuration: dataclass defaults < TOML file < command-line flags.

Tables: [server] (how devices reach it), [partition] (the data split, sent to every agent),
[rules] (the experiment's rules, shared with the simulator), [run] (this run's length,
seed and deadlines: flexfl.run_spec's keys and the coordinator's own) and [output]; and
plugin_path, a folder put on sys.path for the plug-ins that
[partition] dataset, [rules] model or strategy name. Read and written with flexfl.config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from coordinator.rules.config import RulesConfig
from flexfl.config import NOT_IN_FILE, coerce_enums, load_config, path_field, plugin_path_field
from flexfl.errors import ConfigError
from flexfl.files import read_secret
from flexfl.net import split_host_port
from flexfl.run_spec import DeadlineRunSpec
from workloads.partition_spec import PartitionSpec


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:50051"
    fleet_token_file: str = path_field()
    fleet_token: str = field(default="", metadata=NOT_IN_FILE)  # given in code (tests); never in a file
    tls_cert: str = path_field()
    tls_key: str = path_field()
    tls_client_ca: str = path_field()
    max_update_mib: float = 64.0
    pull_wait_s: float = 5.0  # longest a pull (PullRound or a Session's) is held before answering WAIT
    # Each device's share of output.dir/agent_logs/ (coordinator/agent_logs.py): an agent logs one line, ~190
    # bytes, a round at INFO (make demo: 5.6 KB for 30 rounds), so 16 MiB holds ~80,000 rounds; past it the
    # device's lines are dropped, and counted.
    max_agent_log_mib: float = 16.0

    def __post_init__(self) -> None:
        split_host_port(self.listen, what="server.listen", allow_port_zero=True)  # port 0: pick a free one
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("server.tls_cert and server.tls_key must be given together")
        if not self.max_update_mib > 0 or not self.pull_wait_s > 0 or not self.max_agent_log_mib >= 0:
            raise ConfigError("server.max_update_mib and server.pull_wait_s must be > 0, server.max_agent_log_mib "
                              ">= 0 (0: keep no device logs)")

    def token(self) -> str:
        if self.fleet_token_file:
            return read_secret(Path(self.fleet_token_file), what="server.fleet_token_file",
                               if_missing=f"`flexfl token --out {self.fleet_token_file}` makes one")
        if self.fleet_token:
            return self.fleet_token
        raise ConfigError("server.fleet_token_file is required: every device must present the fleet token "
                          "(`flexfl token --out FILE` makes one)")


class OnEmpty(StrEnum):
    """What the coordinator does when no device is left to train (every one departed)."""

    WAIT = "wait"  # pause before the next round until a device joins; the run then goes on
    STOP = "stop"  # end the run: one line, a checkpoint, exit code 3 (`--resume` waits for devices)


@dataclass(frozen=True)
class RunConfig(DeadlineRunSpec):
    """[run] of a coordinator: the keys every program's [run] has (flexfl.run_spec), and the coordinator's own."""

    min_devices: int = 1  # a run starts once this many devices joined
    start_grace_s: float = 0.0  # after min_devices joined, wait this long for more before round 1
    # Devices that join before round `founding_rounds` has closed found the objective with the
    # first ones (no fast-reboot boost, no shift: no update has been applied yet, or hardly
    # any); later joins are arrivals. Devices in expected_arrivals are always arrivals. 0: off.
    founding_rounds: int = 1
    on_empty: OnEmpty = OnEmpty.WAIT
    resume_wait_s: float = 30.0  # after --resume, wait this long at most for min_devices to reconnect
    # Scripted experiments ({device id: round}): round R is not closed before the device has
    # joined during it, or (once it uploaded) announced its departure; at most expected_wait_s.
    expected_arrivals: dict[str, int] = field(default_factory=dict)
    expected_departures: dict[str, int] = field(default_factory=dict)
    expected_wait_s: float = 120.0
    evaluate: bool = True  # test the global model after each round; false only to benchmark the rest

    def __post_init__(self) -> None:
        super().__post_init__()
        coerce_enums(self)
        if self.min_devices < 1:
            raise ConfigError(f"run.min_devices must be >= 1, got {self.min_devices}")
        if not 0 <= self.founding_rounds <= self.rounds:
            raise ConfigError(f"run.founding_rounds must be in 0..run.rounds ({self.rounds}), got "
                              f"{self.founding_rounds}")
        if not self.expected_wait_s > 0:
            raise ConfigError(f"run.expected_wait_s must be > 0, got {self.expected_wait_s}")
        for name in ("expected_arrivals", "expected_departures"):
            for device, rnd in getattr(self, name).items():
                if not 1 <= rnd <= self.rounds:
                    raise ConfigError(f"run.{name}: {device} = {rnd} is outside the rounds 1..{self.rounds}")


@dataclass(frozen=True)
class OutputConfig:
    dir: str = path_field("coordinator-out")  # metrics.jsonl, checkpoint.pt


@dataclass(frozen=True)
class CoordinatorConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    partition: PartitionSpec = field(default_factory=PartitionSpec)
    rules: RulesConfig = field(default_factory=RulesConfig)
    run: RunConfig = field(default_factory=RunConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    plugin_path: str | None = plugin_path_field()  # a folder put on sys.path for the plug-ins named here

    def __post_init__(self) -> None:
        self.rules.check_for(self.partition.dataset)

    @property
    def eta0(self) -> float:
        return self.rules.eta0_for(self.partition.dataset)

    @property
    def batch_size(self) -> int:
        return self.rules.batch_size_for(self.partition.dataset)


def load_coordinator_config(path: Path | None, *, overrides: dict[str, Any] | None = None) -> CoordinatorConfig:
    """Read a TOML config (if any) and apply {table: {key: value}} overrides from flags."""
    return load_config(CoordinatorConfig, path, overrides=overrides)


def with_changes(cfg: CoordinatorConfig, **tables: dict[str, Any]) -> CoordinatorConfig:
    """A copy with fields of some tables changed: with_changes(cfg, run={"rounds": 5})."""
    return replace(cfg, **{name: replace(getattr(cfg, name), **values) for name, values in tables.items()})

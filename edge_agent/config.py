"""Edge agent configuration: dataclass defaults < TOML file < command-line flags.

The agent learns the data partition from the coordinator when it joins and trains on its
`shard_index` of it. An optional [partition] table pins the partition this device expects:
the coordinator then refuses the device if its own differs. When the coordinator's dataset
or model is a plug-in, this device imports it too: installed, or from `plugin_path`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexfl.proto.channel import TlsFiles

from flexfl.config import NOT_IN_FILE, load_config, path_field, plugin_path_field
from flexfl.errors import ConfigError
from flexfl.files import read_secret
from flexfl.net import split_host_port
from workloads.partition_spec import PartitionSpec


@dataclass(frozen=True)
class ParticipationConfig:
    """How this device takes part beyond its own speed (experiments, tests, benchmarks)."""

    trace: str = path_field()  # "FOLDER:NAME": cap s each round by a draw from that trace (trace_recorder.sampler)
    forced_updates: tuple[int, ...] = ()  # tests: s per round (cycled); empty = deadline-driven
    no_train: bool = False  # benchmarks: skip SGD, report s = E with a zero delta
    min_update_s: float = 0.0  # emulate a slower device: each local update takes at least this long
    join_in_round: int = 0  # scripted arrival: join once round N is open (takes effect at its close); 0 = at once
    leave_after_round: int = 0  # scripted departure: announce it right after uploading round N; 0 = never

    def __post_init__(self) -> None:
        if self.trace and ":" not in self.trace:
            raise ConfigError(f"participation.trace must be FOLDER:NAME, got {self.trace!r}")
        if self.min_update_s < 0 or self.join_in_round < 0 or self.leave_after_round < 0:
            raise ConfigError("participation.min_update_s, join_in_round and leave_after_round must be >= 0")
        if any(v < 0 for v in self.forced_updates):
            raise ConfigError(f"participation.forced_updates must be >= 0, got {list(self.forced_updates)}")


@dataclass(frozen=True)
class AgentConfig:
    coordinator: str = "127.0.0.1:50051"  # HOST:PORT; the agent always dials out (works behind NAT)
    device_id: str = "device-0"
    shard_index: int = 0  # this device's shard of the coordinator's partition
    fleet_token_file: str = path_field()
    fleet_token: str = field(default="", metadata=NOT_IN_FILE)  # given in code (tests); never in a file
    tls_ca: str = path_field()
    tls_client_cert: str = path_field()
    tls_client_key: str = path_field()
    tls_server_name: str = ""  # override the name checked in the server certificate
    announce_departure: bool = True
    pull_wait_s: float = 5.0
    rpc_timeout_s: float = 60.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    give_up_after_s: float = 0.0  # exit with an error after this long without reaching the coordinator; 0 = never
    safety_margin_s: float = 0.05  # kept free before the deadline on top of the estimates
    # After a run finishes, wait for the coordinator's next run and join it (a fleet's agent service, which
    # campaigns run one run after another on); False: exit once training finished. Written only when True.
    serve_runs: bool = field(default=False, metadata={"written_when": True})
    # Send this agent's log records (INFO and above) to the coordinator after each round and at the end, so that the
    # run's folder keeps them (agent_logs/<device id>.log). Written only when False.
    send_log: bool = field(default=True, metadata={"written_when": False})
    partition: PartitionSpec | None = None
    participation: ParticipationConfig = field(default_factory=ParticipationConfig)
    # A folder put on sys.path: the coordinator's plug-ins (its dataset and model) must import here too.
    plugin_path: str | None = plugin_path_field()

    def __post_init__(self) -> None:
        split_host_port(self.coordinator, what="coordinator")
        if self.give_up_after_s < 0:
            raise ConfigError(f"give_up_after_s must be >= 0 (0: never give up), got {self.give_up_after_s}")
        if self.shard_index < 0:
            raise ConfigError(f"shard_index must be >= 0, got {self.shard_index}")
        if self.partition is not None and self.shard_index >= self.partition.n_devices:
            raise ConfigError(f"shard_index {self.shard_index} is outside the partition's "
                              f"0..{self.partition.n_devices - 1}")

    def tls_files(self) -> TlsFiles | None:
        """The TLS files to dial the coordinator with (None: plaintext, no tls_ca)."""
        if not self.tls_ca:
            return None
        return TlsFiles(ca=self.tls_ca, client_cert=self.tls_client_cert, client_key=self.tls_client_key,
                        server_name=self.tls_server_name)

    def token(self) -> str:
        if self.fleet_token_file:
            # An agent joins a fleet that exists: a new token here alone would be refused by its coordinator.
            return read_secret(Path(self.fleet_token_file), what="fleet_token_file",
                               if_missing="copy the coordinator's fleet token here (`flexfl token --out "
                                          f"{self.fleet_token_file}` makes a new one, for a new fleet: its "
                                          "coordinator then needs the same file)")
        if not self.fleet_token:
            raise ConfigError("fleet_token_file is required: the coordinator refuses devices without the fleet token "
                              "(`flexfl token --out FILE` makes one)")
        return self.fleet_token


def load_agent_config(path: Path | None, *, overrides: dict[str, Any] | None = None) -> AgentConfig:
    """Read the TOML file (if any); `overrides` may hold top-level keys and a 'participation' dict."""
    return load_config(AgentConfig, path, overrides=overrides)

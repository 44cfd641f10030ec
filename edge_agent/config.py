"""Edge agent configuration: dataclass defaults < TOML file < command-line flags."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from flexfl.errors import ConfigError
from flexfl.files import read_secret, read_toml


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "synthetic"
    iid: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    n_devices: int = 10
    data_seed: int = 0
    total_samples: int = 0
    sizes: str = "pareto"
    shard_index: int = 0


@dataclass(frozen=True)
class ParticipationConfig:
    trace: str = ""  # "FOLDER:NAME": cap s each round by a draw from that trace
    trace_sampling: str = "iid"  # iid | replay
    forced_updates: tuple[int, ...] = ()  # tests/benchmarks: s per round (cycled); empty = deadline-driven
    no_train: bool = False  # benchmarks: skip SGD, report s = E with a zero delta
    min_update_s: float = 0.0  # emulate a slower device: each local update takes at least this long


@dataclass(frozen=True)
class AgentConfig:
    coordinator: str = "127.0.0.1:50051"
    device_id: str = "device-0"
    fleet_token_file: str = ""
    fleet_token: str = ""
    tls_ca: str = ""
    tls_client_cert: str = ""
    tls_client_key: str = ""
    tls_server_name: str = ""  # override the name checked in the server certificate
    announce_departure: bool = True
    pull_wait_s: float = 5.0
    rpc_timeout_s: float = 60.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    safety_margin_s: float = 0.05  # kept free before the deadline on top of the estimates
    data: DataConfig = field(default_factory=DataConfig)
    participation: ParticipationConfig = field(default_factory=ParticipationConfig)
    base_dir: str = "."

    def path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else Path(self.base_dir) / p

    def token(self) -> str:
        if self.fleet_token_file:
            return read_secret(self.path(self.fleet_token_file), what="fleet_token_file")
        if not self.fleet_token:
            raise ConfigError("fleet_token_file is required: the coordinator refuses devices without the fleet token")
        return self.fleet_token


def _typed(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; valid: {sorted(known)}")
    defaults = cls()
    out = {}
    for key, value in values.items():
        default = getattr(defaults, key)
        if isinstance(default, tuple):
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
                raise ConfigError(f"{where}.{key}: expected a list of integers, got {value!r}")
            value = tuple(value)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif type(default) is not type(value) and not isinstance(default, (DataConfig, ParticipationConfig)):
            raise ConfigError(f"{where}.{key}: expected {type(default).__name__}, got {value!r}")
        out[key] = value
    return out


def load_agent_config(path: Path | None, *, overrides: dict[str, Any] | None = None) -> AgentConfig:
    """Read the TOML file (if any); `overrides` may hold top-level keys and 'data'/'participation' dicts."""
    raw: dict[str, Any] = {}
    base = "."
    if path is not None:
        raw = read_toml(path)
        base = str(Path(path).resolve().parent)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict):
            raw.setdefault(key, {}).update({k: v for k, v in value.items() if v is not None})
        elif value is not None:
            raw[key] = value
    where = str(path or "agent config")
    data = DataConfig(**_typed(DataConfig, raw.pop("data", {}), f"{where}: [data]"))
    part = ParticipationConfig(**_typed(ParticipationConfig, raw.pop("participation", {}), f"{where}: [participation]"))
    top = _typed(AgentConfig, raw, where)
    cfg = AgentConfig(**top, data=data, participation=part, base_dir=base)
    if ":" not in cfg.coordinator:
        raise ConfigError(f"{where}: coordinator must be HOST:PORT, got {cfg.coordinator!r}")
    if cfg.participation.trace_sampling not in ("iid", "replay"):
        raise ConfigError(f"{where}: participation.trace_sampling must be iid or replay")
    return cfg

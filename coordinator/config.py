"""Coordinator configuration: dataclass defaults < TOML file < command-line flags."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from coordinator.aggregation import Scheme
from coordinator.participation import DeparturePolicy
from flexfl.errors import ConfigError
from flexfl.files import read_secret, read_toml
from workloads.federated import DEFAULTS


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:50051"
    fleet_token_file: str = ""
    fleet_token: str = ""  # inline token (tests, `flexfl live`); the file wins when both are set
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    max_update_mib: float = 64.0
    pull_wait_s: float = 5.0  # longest a PullRound call is held before answering WAIT


@dataclass(frozen=True)
class TrainingConfig:
    dataset: str = "synthetic"
    iid: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    n_devices: int = 10
    data_seed: int = 0
    total_samples: int = 0  # 0: the dataset's default
    sizes: str = "pareto"  # sample counts per device: pareto (paper default) or equal
    rounds: int = 100
    required_updates: int = 20
    deadline_s: float = 10.0
    scheme: str = "C"
    departure_policy: str = "exclude"
    fast_reboot_boost: float = 3.0
    fast_reboot_decay_power: float = 2.0
    min_devices: int = 1
    start_grace_s: float = 0.0  # after min_devices joined, wait this long for more before round 1
    resume_wait_s: float = 30.0  # after --resume, wait this long at most for min_devices to reconnect
    eta0: float = 0.0  # 0: the paper's value
    batch_size: int = 0  # 0: the paper's value
    unit: str = "step"
    seed: int = 0

    @property
    def resolved_eta0(self) -> float:
        return self.eta0 or DEFAULTS[self.dataset].eta0

    @property
    def resolved_batch_size(self) -> int:
        return self.batch_size or DEFAULTS[self.dataset].batch_size


@dataclass(frozen=True)
class OutputConfig:
    dir: str = "coordinator-out"


@dataclass(frozen=True)
class CoordinatorConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    base_dir: str = "."  # relative paths in the file resolve against the file's folder

    def path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else Path(self.base_dir) / p

    def validate(self) -> CoordinatorConfig:
        t = self.training
        if t.dataset not in DEFAULTS:
            raise ConfigError(f"training.dataset: unknown {t.dataset!r}; choose one of {sorted(DEFAULTS)}")
        try:
            Scheme(t.scheme)
            DeparturePolicy(t.departure_policy)
        except ValueError as exc:
            raise ConfigError(f"training: {exc}") from None
        for name in ("rounds", "required_updates", "n_devices", "min_devices"):
            if getattr(t, name) < 1:
                raise ConfigError(f"training.{name} must be >= 1, got {getattr(t, name)}")
        if not t.deadline_s > 0:
            raise ConfigError(f"training.deadline_s must be > 0, got {t.deadline_s}")
        if t.unit not in ("step", "epoch"):
            raise ConfigError(f"training.unit must be 'step' or 'epoch', got {t.unit!r}")
        if bool(self.server.tls_cert) != bool(self.server.tls_key):
            raise ConfigError("server.tls_cert and server.tls_key must be given together")
        if not (self.server.fleet_token or self.server.fleet_token_file):
            raise ConfigError("server.fleet_token_file is required: every device must present the fleet token")
        return self

    def token(self) -> str:
        if self.server.fleet_token_file:
            return read_secret(self.path(self.server.fleet_token_file), what="server.fleet_token_file")
        return self.server.fleet_token


_SECTIONS = {"server": ServerConfig, "training": TrainingConfig, "output": OutputConfig}


def _section(cls: type, values: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = set(values) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; valid: {sorted(known)}")
    out = {}
    for key, value in values.items():
        default = getattr(cls(), key)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: expected true/false, got {value!r}")
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(default) is not type(value):
            raise ConfigError(f"{where}.{key}: expected {type(default).__name__}, got {value!r}")
        out[key] = value
    return cls(**out)


def load_config(path: Path | None, *, overrides: dict[str, dict[str, Any]] | None = None) -> CoordinatorConfig:
    """Read a TOML config (if any) and apply {section: {key: value}} overrides from flags."""
    raw: dict[str, Any] = {}
    base = "."
    if path is not None:
        raw = read_toml(path)
        base = str(Path(path).resolve().parent)
    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"{path}: unknown sections {sorted(unknown)}; valid: {sorted(_SECTIONS)}")
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    parts = {name: _section(cls, raw.get(name, {}), f"{path or 'config'}: [{name}]") for name, cls in _SECTIONS.items()}
    return CoordinatorConfig(**parts, base_dir=base).validate()


def with_training(cfg: CoordinatorConfig, **changes: Any) -> CoordinatorConfig:
    """A copy with training fields changed (tests, `flexfl live`)."""
    return replace(cfg, training=replace(cfg.training, **changes)).validate()

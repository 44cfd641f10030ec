"""Recording profiles (what load each trace is recorded under) and inventories (on which hosts).

A profile is a TOML file; the committed one, `trace_recorder/paper_profile.toml`, follows
the paper's protocol (Section 5.1): five traces under a CPU competitor of 0/30/50/70/90 %,
three under high/medium/low upload bandwidth, MNIST MLP with E = 20 and batch size 10.
An inventory is a TOML file naming real hosts for `flexfl traces record --inventory FILE`;
its format is in `traces/README.md` ("Recording a set").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flexfl.proto.channel import TlsFiles

from coordinator.rules.config import RulesConfig
from flexfl.config import NOT_IN_FILE, load_config, path_field, to_dict
from flexfl.errors import ConfigError
from flexfl.vocabulary import Scheme
from trace_recorder import DEFAULT_PROFILE
from trace_recorder.manifest import NAME_RE
from workloads.partition_spec import Dataset, PartitionSpec, Sizes

STATISTICS = ("max", "p95", "p90", "median")


@dataclass(frozen=True)
class DeadlineRule:
    """deadline = factor x statistic(time from model delivery to update arrival) of the unloaded devices.

    Measured over warm-up rounds run with a generous deadline (every device completes all
    E updates then); the first `skip_rounds` (cold start) are ignored.
    """

    warmup_rounds: int = 20
    skip_rounds: int = 2
    statistic: str = "p90"  # max | p95 | p90 | median
    factor: float = 1.1
    warmup_deadline_s: float = 60.0

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ConfigError(f"deadline.statistic must be one of {', '.join(STATISTICS)}, got {self.statistic!r}")
        if not self.factor >= 1.0:
            raise ConfigError(f"deadline.factor must be >= 1, got {self.factor}")
        if self.warmup_rounds <= self.skip_rounds or self.skip_rounds < 0:
            raise ConfigError("deadline.warmup_rounds must exceed skip_rounds >= 0")


@dataclass(frozen=True)
class Emulation:
    """The emulated device's budget (ignored with an inventory of real hosts)."""

    cpu_quota: float = 0.1  # CPUs per device (cgroup v1 cfs quota)
    cfs_period_us: int = 20_000
    stress_ng_method: str = "int8"  # "" = stress-ng's default mix (see loadgen.fleet.start_loadgen)
    competitor_nice: int = 0  # stress-ng's nice; 0 = the agent's priority
    shape_download: bool = False  # also limit the coordinator->device direction to the trace's rate

    def __post_init__(self) -> None:
        if not self.cpu_quota > 0:
            raise ConfigError(f"emulation.cpu_quota must be > 0, got {self.cpu_quota}")


@dataclass(frozen=True)
class TraceCondition:
    name: str
    cpu_load_pct: float = 0.0
    bandwidth: str = ""  # a key of [bandwidth_kbit], "" = unshaped

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ConfigError(f"trace name {self.name!r} is not a plain name (letters, digits, _ . -)")
        if not 0 <= self.cpu_load_pct <= 100:
            raise ConfigError(f"trace {self.name}: cpu_load_pct must be in 0..100, got {self.cpu_load_pct}")

    @property
    def unloaded(self) -> bool:
        return self.cpu_load_pct == 0 and not self.bandwidth


def _recording_rules() -> RulesConfig:
    # Plain FedAvg weights accepting incomplete work: the scheme does not change timing.
    return RulesConfig(scheme=Scheme.B)


@dataclass(frozen=True)
class Profile:
    """[partition] n_devices is set by the recorder (one device per trace or inventory host)."""

    name: str
    rounds: int
    description: str = ""
    partition: PartitionSpec = field(default_factory=lambda: PartitionSpec(dataset=Dataset.MNIST, sizes=Sizes.EQUAL))
    rules: RulesConfig = field(default_factory=_recording_rules)
    seed: int = 0  # the coordinator's run.seed (model, minibatches)
    deadline: DeadlineRule = field(default_factory=DeadlineRule)
    emulation: Emulation = field(default_factory=Emulation)
    bandwidth_kbit: dict[str, int] = field(default_factory=dict)
    traces: tuple[TraceCondition, ...] = ()
    path: str = field(default="", metadata=NOT_IN_FILE)

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ConfigError(f"name must be a plain name (letters, digits, _ . -), got {self.name!r}")
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")
        if not self.traces:
            raise ConfigError("no [[traces]]")
        if len({t.name for t in self.traces}) != len(self.traces):
            raise ConfigError("duplicate trace names")
        bad = {k: v for k, v in self.bandwidth_kbit.items() if v < 1}
        if bad:
            raise ConfigError(f"[bandwidth_kbit] rates must be positive (kbit/s), got {bad}")
        for t in self.traces:
            if t.bandwidth and t.bandwidth not in self.bandwidth_kbit:
                raise ConfigError(f"trace {t.name}: bandwidth {t.bandwidth!r} is not a key of [bandwidth_kbit] "
                                  f"({', '.join(self.bandwidth_kbit) or 'none'})")

    def rate_kbit(self, trace: TraceCondition) -> int | None:
        return self.bandwidth_kbit[trace.bandwidth] if trace.bandwidth else None

    def select(self, names: tuple[str, ...] | list[str]) -> Profile:
        """The same profile restricted to the traces `names`, in that order."""
        by_name = {t.name: t for t in self.traces}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ConfigError(f"profile {self.path or self.name} has no trace {', '.join(missing)} "
                              f"(has: {', '.join(by_name)})")
        return replace(self, traces=tuple(by_name[n] for n in names))

    def condition(self, trace: TraceCondition) -> dict[str, Any]:
        """The manifest's `conditions` entry for a trace (before measurements are added)."""
        out: dict[str, Any] = {"cpu_load_pct": trace.cpu_load_pct}
        if trace.bandwidth:
            out["bandwidth"] = trace.bandwidth
            out["up_kbit"] = self.rate_kbit(trace)
        return out

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def load_profile(path: Path | None = None) -> Profile:
    """Read and validate a profile TOML (default: the committed paper profile)."""
    path = Path(path or DEFAULT_PROFILE)
    return replace(load_config(Profile, path), path=str(path))


# ---- inventories ----------------------------------------------------------------------------


@dataclass(frozen=True)
class InventoryDevice:
    device_id: str  # as the agent joins (the ansible inventory name by default)
    trace: str  # the profile trace this host records
    loadgen: str  # ZeroMQ endpoint of its loadgen daemon, e.g. tcp://192.168.1.21:5601
    iface: str = ""  # interface to shape; "" = the daemon's --iface
    loadgen_server_key: str = path_field()  # the daemon's CURVE public key file (server.key); "" = no CURVE


@dataclass(frozen=True)
class Inventory:
    coordinator_listen: str
    fleet_token_file: str = path_field()
    devices: tuple[InventoryDevice, ...] = ()
    n_devices: int = 0  # partition size the agents were provisioned with; 0 = number of devices
    loadgen_timeout_s: float = 5.0
    loadgen_client_key: str = path_field()  # this controller's CURVE keypair (NAME.key_secret); "" = no CURVE
    # The recording coordinator's TLS, as [server] of a coordinator file: provisioned agents dial with TLS by default
    # (credentials_tls_enabled), so a coordinator without it never sees them join. Empty: plaintext.
    tls_cert: str = path_field()
    tls_key: str = path_field()
    tls_client_ca: str = path_field()  # mutual TLS: each agent presents the certificate of its device id
    # How this machine asks that coordinator for its Status: the CA of its certificate, and under mutual TLS a
    # device's certificate and key (flexfl status's --tls-* flags).
    watch_tls_ca: str = path_field()
    watch_tls_client_cert: str = path_field()
    watch_tls_client_key: str = path_field()
    path: str = field(default="", metadata=NOT_IN_FILE)

    def __post_init__(self) -> None:
        if not self.devices:
            raise ConfigError("no [[devices]]")
        if not self.coordinator_listen or not self.fleet_token_file:
            raise ConfigError("coordinator_listen and fleet_token_file are required")
        if len({d.device_id for d in self.devices}) != len(self.devices) or \
                len({d.trace for d in self.devices}) != len(self.devices):
            raise ConfigError("every device needs its own device_id and its own trace")
        without = [d.device_id for d in self.devices if not d.loadgen_server_key]
        if self.loadgen_client_key and without:
            raise ConfigError(f"loadgen_client_key is set, so every device needs its loadgen_server_key "
                              f"(missing for {', '.join(without)})")
        if not self.loadgen_client_key and len(without) < len(self.devices):
            raise ConfigError("devices have a loadgen_server_key but loadgen_client_key is not set")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key must be given together")
        if bool(self.tls_cert) != bool(self.watch_tls_ca):
            raise ConfigError("tls_cert and watch_tls_ca go together: a coordinator with TLS is watched over TLS "
                              "(watch_tls_ca: the CA that signed its certificate)")
        if self.tls_client_ca and not self.watch_tls_client_cert:
            raise ConfigError("tls_client_ca (mutual TLS) needs watch_tls_client_cert and watch_tls_client_key: "
                              "the coordinator answers Status calls only from a certificate it trusts")

    def server_tls(self) -> dict[str, str]:
        """The recording coordinator's [server] TLS keys (empty: plaintext)."""
        return {"tls_cert": self.tls_cert, "tls_key": self.tls_key, "tls_client_ca": self.tls_client_ca}

    def watch_tls(self) -> TlsFiles | None:
        """The TLS files for this machine's Status calls (None: plaintext)."""
        if not self.watch_tls_ca:
            return None
        return TlsFiles(ca=self.watch_tls_ca, client_cert=self.watch_tls_client_cert,
                        client_key=self.watch_tls_client_key)

    def loadgen_server_keys(self) -> dict[str, Path]:
        """Each device's loadgen endpoint -> its daemon's public key file (empty without CURVE)."""
        return {d.loadgen: Path(d.loadgen_server_key) for d in self.devices if d.loadgen_server_key}


def load_inventory(path: Path) -> Inventory:
    return replace(load_config(Inventory, path), path=str(path))

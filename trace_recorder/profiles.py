"""Recording profiles (what load each trace is recorded under) and inventories (on which hosts).

A profile is a TOML file; the committed one, `trace_recorder/paper_profile.toml`, follows
the paper's protocol (Section 5.1): five traces under a CPU competitor of 0/30/50/70/90 %,
three under high/medium/low upload bandwidth, MNIST MLP with E = 20 and batch size 10.
An inventory is a TOML file naming real hosts for `flexfl traces record --inventory FILE`;
its format is in `traces/README.md` ("Recording a set").
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from flexfl.errors import ConfigError
from trace_recorder.manifest import NAME_RE

DEFAULT_PROFILE = Path(__file__).resolve().parent / "paper_profile.toml"
STATISTICS = ("max", "p95", "p90", "median")


@dataclass(frozen=True)
class Workload:
    dataset: str = "mnist"
    iid: bool = False
    sizes: str = "equal"
    required_updates: int = 20  # E
    batch_size: int = 10
    eta0: float = 0.0  # 0: the paper's
    scheme: str = "B"  # plain FedAvg weights, accepting incomplete work; irrelevant to timing
    data_seed: int = 0
    seed: int = 0


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


@dataclass(frozen=True)
class Emulation:
    """The emulated device's budget (ignored with an inventory of real hosts)."""

    cpu_quota: float = 0.1  # CPUs per device (cgroup v1 cfs quota)
    cfs_period_us: int = 20_000
    stress_ng_method: str = "int8"  # "" = stress-ng's default mix (see loadgen.fleet.start_loadgen)
    competitor_nice: int = 0  # stress-ng's nice; 0 = the agent's priority
    shape_download: bool = False  # also limit the coordinator->device direction to the trace's rate


@dataclass(frozen=True)
class TraceCondition:
    name: str
    cpu_load_pct: float = 0.0
    bandwidth: str = ""  # a key of [bandwidth_kbit], "" = unshaped

    @property
    def unloaded(self) -> bool:
        return self.cpu_load_pct == 0 and not self.bandwidth


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    rounds: int
    workload: Workload = field(default_factory=Workload)
    deadline: DeadlineRule = field(default_factory=DeadlineRule)
    emulation: Emulation = field(default_factory=Emulation)
    bandwidth_kbit: dict[str, int] = field(default_factory=dict)
    traces: tuple[TraceCondition, ...] = ()
    path: str = ""

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
        d = asdict(self)
        d["traces"] = [asdict(t) for t in self.traces]
        return d


def load_profile(path: Path | None = None) -> Profile:
    """Read and validate a profile TOML (default: the committed paper profile)."""
    path = Path(path or DEFAULT_PROFILE)
    raw = _read_toml(path)
    where = str(path)
    known = {"name", "description", "rounds", "workload", "deadline", "emulation", "bandwidth_kbit", "traces"}
    _no_unknown(raw, known, where)
    try:
        name, description, rounds = raw["name"], raw.get("description", ""), raw["rounds"]
    except KeyError as exc:
        raise ConfigError(f"{where}: missing key {exc}") from None
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{where}: name must be a plain name (letters, digits, _ . -), got {name!r}")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ConfigError(f"{where}: rounds must be an integer >= 1, got {rounds!r}")
    workload = _section(Workload, raw.get("workload", {}), f"{where}: [workload]")
    rule = _section(DeadlineRule, raw.get("deadline", {}), f"{where}: [deadline]")
    emulation = _section(Emulation, raw.get("emulation", {}), f"{where}: [emulation]")
    rates = raw.get("bandwidth_kbit", {})
    if not isinstance(rates, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                              for v in rates.values()):
        raise ConfigError(f"{where}: [bandwidth_kbit] must map level names to positive integers (kbit/s)")
    traces = []
    for i, t in enumerate(raw.get("traces", [])):
        cond = _section(TraceCondition, t, f"{where}: [[traces]] #{i + 1}", required=("name",))
        if not NAME_RE.match(cond.name):
            raise ConfigError(f"{where}: [[traces]] #{i + 1}: name {cond.name!r} is not a plain name")
        if not 0 <= cond.cpu_load_pct <= 100:
            raise ConfigError(f"{where}: trace {cond.name}: cpu_load_pct must be in 0..100")
        if cond.bandwidth and cond.bandwidth not in rates:
            raise ConfigError(f"{where}: trace {cond.name}: bandwidth {cond.bandwidth!r} is not a key of "
                              f"[bandwidth_kbit] ({', '.join(rates) or 'none'})")
        traces.append(cond)
    if not traces:
        raise ConfigError(f"{where}: no [[traces]]")
    if len({t.name for t in traces}) != len(traces):
        raise ConfigError(f"{where}: duplicate trace names")
    _check(workload, rule, emulation, where)
    return Profile(name=name, description=description, rounds=rounds, workload=workload, deadline=rule,
                   emulation=emulation, bandwidth_kbit=dict(rates), traces=tuple(traces), path=str(path))


def _check(w: Workload, rule: DeadlineRule, e: Emulation, where: str) -> None:
    if w.required_updates < 1 or w.batch_size < 1:
        raise ConfigError(f"{where}: [workload] required_updates and batch_size must be >= 1")
    if rule.statistic not in STATISTICS:
        raise ConfigError(f"{where}: [deadline] statistic must be one of {', '.join(STATISTICS)}")
    if not rule.factor >= 1.0 or not math.isfinite(rule.factor):
        raise ConfigError(f"{where}: [deadline] factor must be >= 1, got {rule.factor}")
    if rule.warmup_rounds <= rule.skip_rounds or rule.skip_rounds < 0:
        raise ConfigError(f"{where}: [deadline] warmup_rounds must exceed skip_rounds >= 0")
    if not e.cpu_quota > 0:
        raise ConfigError(f"{where}: [emulation] cpu_quota must be > 0")


# ---- inventories ----------------------------------------------------------------------------


@dataclass(frozen=True)
class InventoryDevice:
    device_id: str  # as the agent joins (the ansible inventory name by default)
    trace: str  # the profile trace this host records
    loadgen: str  # ZeroMQ endpoint of its loadgen daemon, e.g. tcp://192.168.1.21:5601
    iface: str = ""  # interface to shape; "" = the daemon's --iface
    loadgen_server_key: str = ""  # the daemon's CURVE public key file (server.key); "" = no CURVE


@dataclass(frozen=True)
class Inventory:
    coordinator_listen: str
    fleet_token_file: str
    devices: tuple[InventoryDevice, ...]
    n_devices: int = 0  # partition size the agents were provisioned with; 0 = number of devices
    loadgen_timeout_s: float = 5.0
    loadgen_client_key: str = ""  # this controller's CURVE keypair (NAME.key_secret); "" = no CURVE
    path: str = ""

    def loadgen_server_keys(self) -> dict[str, Path]:
        """Each device's loadgen endpoint -> its daemon's public key file (empty without CURVE)."""
        return {d.loadgen: Path(d.loadgen_server_key) for d in self.devices if d.loadgen_server_key}


def load_inventory(path: Path) -> Inventory:
    raw = _read_toml(path)
    where = str(path)
    _no_unknown(raw, {"coordinator_listen", "fleet_token_file", "n_devices", "loadgen_timeout_s",
                      "loadgen_client_key", "devices"}, where)
    devices = tuple(_section(InventoryDevice, d, f"{where}: [[devices]] #{i + 1}",
                             required=("device_id", "trace", "loadgen"))
                    for i, d in enumerate(raw.get("devices", [])))
    if not devices:
        raise ConfigError(f"{where}: no [[devices]]")
    for key in ("coordinator_listen", "fleet_token_file"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{where}: {key} is required (a string)")
    if len({d.device_id for d in devices}) != len(devices) or len({d.trace for d in devices}) != len(devices):
        raise ConfigError(f"{where}: every device needs its own device_id and its own trace")
    client_key = raw.get("loadgen_client_key", "")
    if not isinstance(client_key, str):
        raise ConfigError(f"{where}: loadgen_client_key: expected str, got {client_key!r}")
    without = [d.device_id for d in devices if not d.loadgen_server_key]
    if client_key and without:
        raise ConfigError(f"{where}: loadgen_client_key is set, so every device needs its loadgen_server_key "
                          f"(missing for {', '.join(without)})")
    if not client_key and len(without) < len(devices):
        raise ConfigError(f"{where}: devices have a loadgen_server_key but loadgen_client_key is not set")

    def resolve(p: str) -> str:  # relative to the inventory's folder, like the ansible credentials
        return p if not p or Path(p).is_absolute() else str(Path(path).resolve().parent / p)

    devices = tuple(replace(d, loadgen_server_key=resolve(d.loadgen_server_key)) for d in devices)
    return Inventory(coordinator_listen=raw["coordinator_listen"], fleet_token_file=resolve(raw["fleet_token_file"]),
                     devices=devices, n_devices=int(raw.get("n_devices", 0)),
                     loadgen_timeout_s=float(raw.get("loadgen_timeout_s", 5.0)),
                     loadgen_client_key=resolve(client_key), path=str(path))


# ---- TOML helpers -----------------------------------------------------------------------------


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _no_unknown(raw: dict[str, Any], known: set[str], where: str) -> None:
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; valid: {sorted(known)}")


def _section(cls: type, values: Any, where: str, *, required: tuple[str, ...] = ()) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a table")
    names = {f.name: f for f in fields(cls)}
    _no_unknown(values, set(names), where)
    missing = [k for k in required if k not in values]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    out = {}
    for key, value in values.items():
        default = names[key].default
        expected = str if default is MISSING else type(default)  # fields without a default are names
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not expected:
            raise ConfigError(f"{where}: {key}: expected {expected.__name__}, got {value!r}")
        out[key] = value
    return cls(**out)

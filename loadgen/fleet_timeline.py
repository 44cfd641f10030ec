"""A device timeline applied to the emulated fleet: each device's CPU quota, link rates and link state over time.

The timeline (trace_recorder.timeline) gives conditions; this module turns them into what the
fleet sets (`Settings`) and changes only what differs from what is in force, through the
fleet's own methods (loadgen.fleet: cgroup quota, tbf on each side of the link, link state):

- cpu_share: a share of the device's full compute, and on the fleet a device's full compute is
  its configured CPUs (`full_cpus`, `[emulate] cpu` of `flexfl live`): cpu_share 0.5 of a
  0.25-CPU device is a 0.125-CPU quota. A device without a quota (full_cpus None) counts as one
  full core, the most a one-thread agent uses; there cpu_share 1 sets no quota. The kernel
  takes no quota under 1 ms per period (loadgen.fleet.least_quota_cpus: 0.1 CPU at the fleet's
  10 ms period): a share below it gets that least quota, and `clamped` says which rows do.
- up_kbit_s, down_kbit_s: tbf rates on the device's egress (its upload) and on the coordinator
  side's egress towards it (its download), rounded to whole kbit/s; tbf has no rate 0, so a
  rate under 1 kbit/s gets 1 (a 0.8 MB model then needs hours: the device misses every round).
- online: 0 takes the device's link down inside its namespace (loadgen.fleet.set_online): it
  reaches nothing, the coordinator counts it offline (never took the model) or missed (took it,
  sent nothing in time), and its agent reconnects once the link is back. While a device is
  offline its quota and rates stay as they were: nothing runs that they would limit.

Time is the timeline's unit: a round id for `start_round` timelines, seconds for `start_s`
ones; the caller says which time it is (flexfl.app.live_conditions follows the coordinator).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flexfl.errors import ConfigError, ReportError
from trace_recorder.availability import device_names
from trace_recorder.timeline import Conditions, Timeline, TimeUnit, describe_names

log = logging.getLogger(__name__)

LEAST_RATE_KBIT = 1  # tbf's least rate (loadgen.bandwidth.set_rate takes whole kbit/s >= 1)


@dataclass(frozen=True)
class Settings:
    """What the fleet sets on one device. cpu_quota in CPUs (None: no quota); rates in kbit/s (None: unshaped)."""

    cpu_share: float  # the timeline's, for the record; cpu_quota is what it became
    cpu_quota: float | None
    up_kbit: int | None
    down_kbit: int | None
    online: bool

    def record(self) -> dict[str, float | int | bool | None]:
        """The settings as conditions.jsonl and the report hold them (keys: RECORD_KEYS)."""
        return dict(zip(RECORD_KEYS, (self.cpu_share, self.cpu_quota, self.up_kbit, self.down_kbit, self.online)))


# A live run's record of the conditions it applied (`flexfl live --emulate --timeline`: written by
# flexfl.app.live_conditions.LiveTimeline, read by the report and the simulator's hint): RUN/conditions.jsonl,
# one JSON line per round at its opening (and one more whenever a second-clocked timeline changes
# inside a round): {"round": r, "time": unix s, "t_s": s since round 1 opened, "devices": {id: Settings.record()}}.
CONDITIONS_FILE = "conditions.jsonl"
POLL_S = 0.05  # how often `flexfl live` asks the coordinator for its open round while a timeline plays
RECORD_KEYS = ("cpu_share", "cpu_quota", "up_kbit_s", "down_kbit_s", "online")


# Before the timeline's first time the fleet runs its devices at full speed, unshaped and online
# (flexfl live holds conditions back until a device has joined: start-up is not what a run is about).
UNLIMITED = Settings(cpu_share=1.0, cpu_quota=None, up_kbit=None, down_kbit=None, online=True)


@dataclass(frozen=True)
class Change:
    """One setting of one device going from `old` to `new` (what: a Settings field)."""

    device: str
    what: str
    old: object
    new: object

    def __str__(self) -> str:
        """As the log says it: "dev-1 CPU quota 0.25 -> 0.05 CPU", "dev-2 online -> offline"."""
        if self.what == "online":
            return f"{self.device} {'online' if self.old else 'offline'} -> {'online' if self.new else 'offline'}"
        label, unit, none = _SHOWN[self.what]
        return f"{self.device} {label} {_value(self.old, unit, none)} -> {_value(self.new, unit, none)}"


_SHOWN = {"cpu_quota": ("CPU quota", "CPU", "none"), "up_kbit": ("upload", "kbit/s", "unshaped"),
          "down_kbit": ("download", "kbit/s", "unshaped")}


def _value(value: object, unit: str, none: str) -> str:
    return none if value is None else f"{value:g} {unit}"


def quota_cpus(cpu_share: float, *, full_cpus: float | None, least_cpus: float) -> tuple[float | None, bool]:
    """The quota for `cpu_share` of a device of `full_cpus` CPUs (None: no quota, one core), and whether
    the kernel's least quota `least_cpus` raised it."""
    if full_cpus is None and cpu_share >= 1:
        return None, False
    cpus = cpu_share * (1.0 if full_cpus is None else full_cpus)
    return (least_cpus, True) if cpus < least_cpus else (cpus, False)


def rate_kbit(kbit_s: float) -> tuple[int, bool]:
    """A timeline rate as tbf takes it (whole kbit/s), and whether it was raised to LEAST_RATE_KBIT."""
    rate = round(kbit_s)
    return (LEAST_RATE_KBIT, True) if rate < LEAST_RATE_KBIT else (rate, False)


def settings_for(conditions: Conditions, before: Settings, *, full_cpus: float | None,
                 least_cpus: float) -> Settings:
    """What the fleet sets for `conditions`; offline keeps `before`'s quota and rates (module docstring)."""
    if not conditions.online:
        return Settings(cpu_share=before.cpu_share, cpu_quota=before.cpu_quota, up_kbit=before.up_kbit,
                        down_kbit=before.down_kbit, online=False)
    quota, _ = quota_cpus(conditions.cpu_share, full_cpus=full_cpus, least_cpus=least_cpus)
    return Settings(cpu_share=conditions.cpu_share, cpu_quota=quota, up_kbit=rate_kbit(conditions.up_kbit_s)[0],
                    down_kbit=rate_kbit(conditions.down_kbit_s)[0], online=True)


def changes(device: str, old: Settings, new: Settings) -> list[Change]:
    """The settings that differ, in the order they are applied (link last when going offline, first when back).

    cpu_share alone is not a change: only the quota it becomes is set."""
    fields = ["cpu_quota", "up_kbit", "down_kbit"]
    order = ["online", *fields] if new.online else [*fields, "online"]
    return [Change(device, f, getattr(old, f), getattr(new, f)) for f in order if getattr(old, f) != getattr(new, f)]


class Fleet(Protocol):
    """The EmulatedFleet methods a timeline uses (loadgen.fleet owns every command)."""

    def set_cpu_quota(self, index: int, cpus: float | None) -> None: ...
    def set_upload(self, index: int, kbit: int | None) -> None: ...
    def set_download(self, index: int, kbit: int | None) -> None: ...
    def set_online(self, index: int, online: bool) -> None: ...


def check_devices(timeline: Timeline, names: Sequence[str], *, where: str) -> None:
    """A ConfigError unless `timeline` has rows for exactly the fleet's devices `names`."""
    extra = [d for d in timeline.devices if d not in names]
    missing = [d for d in names if d not in timeline.devices]
    if extra or missing:
        problem = "; ".join(p for p in (
            f"it names {', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''}, which the fleet does not have"
            if extra else "",
            f"it has no rows for {', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}" if missing else "",
        ) if p)
        raise ConfigError(f"{where}: {problem} (the fleet has {describe_names(list(names))}; the timeline "
                          f"{describe_names(list(timeline.devices))}; --devices sets the fleet's size)")


def clamp_warnings(timeline: Timeline, full_cpus: Sequence[float | None], *, least_cpus: float,
                   where: str) -> list[str]:
    """One line per device whose online rows ask for less than the fleet can set (module docstring)."""
    lines = []
    for i, (name, rows) in enumerate(timeline.devices.items()):
        online = [r for r in rows if r.conditions.online]
        low_cpu = [r for r in online if quota_cpus(r.conditions.cpu_share, full_cpus=full_cpus[i],
                                                   least_cpus=least_cpus)[1]]
        low_rate = [r for r in online if rate_kbit(r.conditions.up_kbit_s)[1] or rate_kbit(r.conditions.down_kbit_s)[1]]
        if low_cpu:
            full = full_cpus[i]
            reference = f"its {full:g} CPU" if full is not None else "one core (it has no quota)"
            lines.append(f"{where}: {name}: cpu_share {min(r.conditions.cpu_share for r in low_cpu):g} in "
                         f"{len(low_cpu)} row(s) (first from {low_cpu[0].start:g}) is below the kernel's least "
                         f"quota, {least_cpus:g} CPU = cpu_share {least_cpus / (full or 1.0):.3g} of {reference}: "
                         f"those rows get {least_cpus:g} CPU (a larger --emulate-cpu makes lower shares reachable)")
        if low_rate:
            lines.append(f"{where}: {name}: a rate under {LEAST_RATE_KBIT} kbit/s in {len(low_rate)} online row(s) "
                         f"(first from {low_rate[0].start:g}): tbf has no rate 0, those rows get "
                         f"{LEAST_RATE_KBIT} kbit/s")
    return lines


class FleetTimeline:
    """Applies a timeline to a fleet, changing only what differs; remembers what is in force per device."""

    def __init__(self, timeline: Timeline, *, full_cpus: Sequence[float | None], least_cpus: float,
                 where: str) -> None:
        names = device_names(len(full_cpus))
        check_devices(timeline, names, where=where)
        if not math.isfinite(least_cpus) or least_cpus <= 0:
            raise ConfigError(f"least_cpus must be a number > 0, got {least_cpus}")
        self.timeline, self.names, self.where = timeline, names, where
        self.full_cpus, self.least_cpus = list(full_cpus), least_cpus
        self.in_force: dict[str, Settings] = dict.fromkeys(names, UNLIMITED)

    def settings_at(self, index: int, t: float) -> Settings:
        """Device `index`'s settings at time `t` (a round id or seconds: the timeline's unit)."""
        name = self.names[index]
        return settings_for(self.timeline.conditions_at(name, t), self.in_force[name],
                            full_cpus=self.full_cpus[index], least_cpus=self.least_cpus)

    def apply(self, fleet: Fleet, t: float, *, devices: Sequence[int] | None = None) -> list[Change]:
        """Set each device's (all, or `devices`) conditions at time `t` where they differ from those in force."""
        done: list[Change] = []
        for i in range(len(self.names)) if devices is None else devices:
            name = self.names[i]
            new = self.settings_at(i, t)
            for change in changes(name, self.in_force[name], new):
                _apply(fleet, i, change)
                log.info("conditions at %s: %s", f"round {t:g}" if self.timeline.unit is TimeUnit.ROUND
                         else f"{t:.2f} s", change)
                done.append(change)
            self.in_force[name] = new
        return done


def _apply(fleet: Fleet, index: int, change: Change) -> None:
    new = change.new
    if change.what == "cpu_quota":
        fleet.set_cpu_quota(index, new)  # type: ignore[arg-type]
    elif change.what == "up_kbit":
        fleet.set_upload(index, new)  # type: ignore[arg-type]
    elif change.what == "down_kbit":
        fleet.set_download(index, new)  # type: ignore[arg-type]
    else:
        fleet.set_online(index, bool(new))


@dataclass(frozen=True)
class ConditionsLine:
    """One line of conditions.jsonl (CONDITIONS_FILE): the settings in force on each device at a time of a round."""

    round: int
    t_s: float  # seconds since round 1 opened
    devices: dict[str, dict[str, Any]]  # device id -> Settings.record()

    @classmethod
    def from_json(cls, obj: object, where: str) -> ConditionsLine:
        """The line's JSON object, checked; a ReportError naming `where` (file:line) and the field otherwise."""
        if not isinstance(obj, dict) or isinstance(obj.get("round"), bool) or not isinstance(obj.get("round"), int):
            raise ReportError(f"{where}: field 'round': expected a round id (an integer)")
        t_s = obj.get("t_s")
        if isinstance(t_s, bool) or not isinstance(t_s, int | float):
            raise ReportError(f"{where}: field 't_s': expected seconds since round 1 opened, got {t_s!r}")
        devices = obj.get("devices")
        if not isinstance(devices, dict):
            raise ReportError(f"{where}: field 'devices': expected an object of device id -> settings")
        for device, settings in devices.items():
            _check_settings(settings, where=f"{where}: field 'devices.{device}")
        return cls(round=obj["round"], t_s=t_s, devices=devices)


def read_conditions(path: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """conditions.jsonl as {round: {device: settings}}: those in force at each round's opening (its first line).

    A torn last line (a crash mid-write) is skipped; anything else off the schema is a ReportError
    naming the file, the line and the field."""
    return {r: line.devices for r, line in _openings(path).items()}


def seconds_per_round(path: Path) -> float | None:
    """The mean time from one round's opening to the next in a recorded run (None under two rounds):
    what `flexfl sim run --timeline` reads a timeline in seconds with (--round-s)."""
    starts = sorted((r, line.t_s) for r, line in _openings(path).items())
    if len(starts) < 2:
        return None
    (first, t0), (last, t1) = starts[0], starts[-1]
    return (t1 - t0) / (last - first)


def _openings(path: Path) -> dict[int, ConditionsLine]:
    """Each round's first line of conditions.jsonl, checked (read_conditions)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None
    out: dict[int, ConditionsLine] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ReportError(f"{path}:{number}: not a JSON object") from None
        line = ConditionsLine.from_json(obj, f"{path}:{number}")
        out.setdefault(line.round, line)
    return out


def _check_settings(settings: object, *, where: str) -> None:
    if not isinstance(settings, dict):
        raise ReportError(f"{where}': expected an object of settings")
    for key in RECORD_KEYS:
        value = settings.get(key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        ok = isinstance(value, bool) if key == "online" else number or (value is None and key != "cpu_share")
        if not ok:
            raise ReportError(f"{where}.{key}': expected {'true or false' if key == 'online' else 'a number'}, "
                              f"got {value!r}")

"""FLASH-style device state logs -> a timeline (`flexfl traces import-flash`).

The shape read here is that of FLASH's state traces (PKU-Chengxu/FLASH, data/state_traces.json,
read by models/timer.py): one JSON object, per device id an object whose 'messages' is text
with one state change per line,

    {"<uid>": {"guid": "...", "model": "<phone model>",
               "messages": "2020-01-02 08:00:00\\tscreen_lock\\n2020-01-02 08:00:05\\twifi\\n..."}}

each line a local time `YYYY-MM-DD HH:MM:SS`, a tab and a state: battery_charged_on,
battery_charged_off, wifi, 2g/3g/4g/5g/unknown (off WiFi), screen_on, screen_off,
screen_lock, screen_unlock, or a battery level like `57%`. Following FLASH (after Google's FL
system), a device is available while its screen is locked, it is charging and it is on WiFi.
Times count from the device's first message and the log repeats after its last one, as
FLASH's Timer replays it. Two differences from FLASH's Timer, on purpose: a window still open
at the last message ends there (FLASH drops it), and times keep their fractions of a second.
The logs hold availability only: compute and links come from a FedScale capacity file or
from constant values (trace_recorder.availability for the scaling).
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from datetime import datetime
from pathlib import Path
from typing import Any

from flexfl.errors import ConfigError, TraceFormatError
from trace_recorder.availability import (
    Availability,
    ComputeScaling,
    DeviceSpec,
    ImportResult,
    TraceClock,
    assemble,
    merge_windows,
)
from trace_recorder.importers.fedscale import capacities_from, choose, scaled_specs
from trace_recorder.manifest import shorten

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_OFF_WIFI = {"2g", "3g", "4g", "5g", "unknown"}
_FLASH_STREAM = 2


class UnusableLog(Exception):
    """A device whose log cannot be read (FLASH leaves such devices out too); the message says why."""


def parse_states(messages: str) -> Availability:
    """A device's availability windows from its state log (module docstring); UnusableLog when unusable."""
    charging = wifi = locked = False
    opened: float | None = None
    first: datetime | None = None
    previous: datetime | None = None
    windows: list[tuple[float, float]] = []
    seconds = 0.0
    for number, line in enumerate(messages.split("\n"), start=1):
        if not line.strip():
            continue
        parts = line.strip().split("\t")
        if len(parts) != 2:
            raise UnusableLog(f"message {number}: expected 'time<TAB>state', got {shorten(repr(line.strip()), 50)}")
        try:
            when = datetime.strptime(parts[0].strip(), TIME_FORMAT)
        except ValueError:
            raise UnusableLog(f"message {number}: time {shorten(repr(parts[0].strip()), 40)} is not "
                              f"{TIME_FORMAT}") from None
        if previous is not None and when < previous:
            raise UnusableLog(f"message {number}: time {parts[0].strip()} is before the previous message's")
        first = first or when
        previous = when
        seconds = (when - first).total_seconds()
        state = parts[1].strip().lower()
        if state == "battery_charged_on":
            charging = True
        elif state == "battery_charged_off":
            charging = False
        elif state == "wifi":
            wifi = True
        elif state in _OFF_WIFI:
            wifi = False
        elif state == "screen_lock":
            locked = True
        elif state == "screen_unlock":
            locked = False
        elif state in ("screen_on", "screen_off") or (state.endswith("%") and _is_number(state[:-1])):
            pass  # FLASH tracks them; its availability rule does not use them
        else:
            raise UnusableLog(f"message {number}: unknown state {shorten(repr(parts[1].strip()), 40)}")
        ready = locked and wifi and charging
        if ready and opened is None:
            opened = seconds
        elif not ready and opened is not None:
            windows.append((opened, seconds))
            opened = None
    if first is None or seconds == 0:
        raise UnusableLog("the log spans no time (fewer than two distinct message times)")
    if opened is not None:
        windows.append((opened, seconds))
    return merge_windows(windows, period_s=seconds)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_state_file(path: Path) -> tuple[dict[Hashable, Availability], list[str]]:
    """Every usable device's availability, and one line per device left out (with why)."""
    path = Path(path)
    try:
        data: Any = json.loads(path.read_bytes())
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise TraceFormatError(f"{path}: not JSON ({shorten(str(exc))})") from None
    if not isinstance(data, dict) or not data:
        raise TraceFormatError(f"{path}: expected a non-empty JSON object of device id -> "
                               f"{{'messages': ...}}, got {type(data).__name__}")
    usable: dict[Hashable, Availability] = {}
    skipped: list[str] = []
    for uid, entry in data.items():
        where = f"{path}: device {shorten(repr(uid))}"
        if not isinstance(entry, dict) or not isinstance(entry.get("messages"), str):
            raise TraceFormatError(f"{where}: field 'messages': expected an object with the state log as text")
        try:
            usable[uid] = parse_states(entry["messages"])
        except UnusableLog as why:
            skipped.append(f"{where}: {why}")
    return usable, skipped


def import_flash(states_path: Path, *, devices: int | None = None, seed: int = 0,
                 capacity_path: Path | None = None, constant: DeviceSpec | None = None,
                 scaling: ComputeScaling | None = None, clock: TraceClock | None = None) -> ImportResult:
    """A timeline from FLASH-style state logs: availability from them; compute and links from
    `capacity_path` (a FedScale client_device_capacity, scaled by `scaling`) or `constant`."""
    if (capacity_path is None) == (constant is None):
        raise ConfigError("FLASH's state logs hold availability only: give a FedScale capacity file (--capacity) or "
                          "constant conditions (--up-kbit-s, optionally --down-kbit-s and --cpu-share), one of them")
    scaling, clock = scaling or ComputeScaling(), clock or TraceClock()
    usable, skipped = parse_state_file(states_path)
    if not usable:
        raise TraceFormatError(f"{states_path}: no usable device log ({len(skipped)} left out; the first: "
                               f"{skipped[0]})")
    n = len(usable) if devices is None else devices
    if n < 1:
        raise ConfigError(f"--devices must be >= 1, got {n}")
    if n > len(usable):
        raise ConfigError(f"asked for {n} devices, {states_path} has {len(usable)} usable logs "
                          f"({len(skipped)} left out)")
    uids = choose(list(usable), n, seed=seed, stream=_FLASH_STREAM)
    sources = [f"state log {u!r}" for u in uids]
    availabilities = [usable[u] for u in uids]
    if constant is not None:
        return assemble([constant] * n, availabilities, sources=sources, clock=clock, reference_ms_per_sample=None,
                        skipped=skipped)
    assert capacity_path is not None  # one of the two, checked above
    capacities, cap_sources = capacities_from(capacity_path, n, seed=seed)
    specs, reference, capped = scaled_specs(capacities, scaling)
    return assemble(specs, availabilities, sources=[f"{s}, {c}" for s, c in zip(sources, cap_sources)], clock=clock,
                    reference_ms_per_sample=reference, capped=capped, skipped=skipped)

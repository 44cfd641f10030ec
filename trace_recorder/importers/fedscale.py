"""FedScale's device traces -> a timeline (`flexfl traces import-fedscale`).

FedScale (SymbioticLab/FedScale, benchmark/dataset/data/device_info/) ships two pickled dicts:

    client_device_capacity  {client_id: {'computation': ms_per_sample, 'communication': kbit_per_s}}
    client_behave_trace     {client_id: {'duration': s, 'active': [t, ...], 'inactive': [t, ...],
                                         'finish_time': s, 'model': str}}

In the second, a client is available from active[i] to inactive[i] (seconds), and the trace
repeats every finish_time seconds (FedScale's ClientMetadata.is_active reads it at
cur_time % finish_time); 'duration' and 'model' are not used here. FedScale pairs the two
files independently (capacity by client id, availability by position), so this importer
draws its devices from each file independently too, with one seed. Both files are read with
the restricted unpickler (trace_recorder.importers.plain_pickle): a pickle can run code.
Scaling to the run's model and clock: trace_recorder.availability.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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
from trace_recorder.importers.plain_pickle import load_plain_pickle
from trace_recorder.manifest import shorten

# Independent streams for the two files' draws.
_CAPACITY_STREAM, _BEHAVE_STREAM = 0, 1


@dataclass(frozen=True)
class Capacity:
    ms_per_sample: float  # FedScale's 'computation': inference latency of its model, ms per sample
    kbit_s: float  # FedScale's 'communication'


def _number(value: Any, *, where: str, field: str, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0 \
            or (positive and value == 0):
        raise TraceFormatError(f"{where}: field '{field}': value {shorten(repr(value))} is not a "
                               f"{'positive' if positive else 'non-negative'} finite number")
    return float(value)


def _entries(data: Any, *, path: Path, what: str) -> dict[Hashable, dict]:
    if not isinstance(data, dict) or not data:
        raise TraceFormatError(f"{path}: expected {what} as a non-empty dict of client id -> dict, "
                               f"got {type(data).__name__}{' (empty)' if isinstance(data, dict) else ''}")
    for cid, entry in data.items():
        if not isinstance(entry, dict):
            raise TraceFormatError(f"{path}: client {shorten(repr(cid))}: expected a dict, got {type(entry).__name__}")
    return data


def parse_capacity(data: Any, *, path: Path) -> dict[Hashable, Capacity]:
    """client_device_capacity's entries, each checked ('computation' > 0 ms/sample, 'communication' > 0 kbit/s)."""
    out = {}
    for cid, entry in _entries(data, path=path, what="client_device_capacity").items():
        where = f"{path}: client {shorten(repr(cid))}"
        for key in ("computation", "communication"):
            if key not in entry:
                raise TraceFormatError(f"{where}: field '{key}': missing (keys: {', '.join(map(repr, entry))})")
        out[cid] = Capacity(
            ms_per_sample=_number(entry["computation"], where=where, field="computation", positive=True),
            kbit_s=_number(entry["communication"], where=where, field="communication", positive=True))
    return out


def parse_behave(data: Any, *, path: Path) -> dict[Hashable, Availability]:
    """client_behave_trace's entries as availability windows repeating every finish_time seconds."""
    out = {}
    for cid, entry in _entries(data, path=path, what="client_behave_trace").items():
        where = f"{path}: client {shorten(repr(cid))}"
        for key in ("active", "inactive", "finish_time"):
            if key not in entry:
                raise TraceFormatError(f"{where}: field '{key}': missing (keys: {', '.join(map(repr, entry))})")
        period = _number(entry["finish_time"], where=where, field="finish_time", positive=True)
        times = {}
        for key in ("active", "inactive"):
            if not isinstance(entry[key], list | tuple):
                raise TraceFormatError(f"{where}: field '{key}': expected a list of times, got "
                                       f"{type(entry[key]).__name__}")
            times[key] = [_number(t, where=where, field=f"{key}[{i}]", positive=False)
                          for i, t in enumerate(entry[key])]
        if len(times["active"]) != len(times["inactive"]):
            raise TraceFormatError(f"{where}: field 'inactive': {len(times['inactive'])} times for "
                                   f"{len(times['active'])} active times (they pair up)")
        for i, (a, b) in enumerate(zip(times["active"], times["inactive"])):
            if b < a:
                raise TraceFormatError(f"{where}: field 'inactive[{i}]': {b:g} is before active[{i}] = {a:g}")
        out[cid] = merge_windows(list(zip(times["active"], times["inactive"])), period_s=period)
    return out


def _id_order(ids: Sequence[Hashable]) -> list[Hashable]:
    # Numeric ids in numeric order, others after them as text: a stable order whatever the keys are.
    return sorted(ids, key=lambda c: (0, c, "") if isinstance(c, int | float) and not isinstance(c, bool)
                  else (1, 0, repr(c)))


def choose(ids: Sequence[Hashable], n: int, *, seed: int, stream: int) -> list[Hashable]:
    """n of `ids`: all of them in id order when n is all, else a seeded draw without replacement."""
    ordered = _id_order(ids)
    if n > len(ordered):
        raise ConfigError(f"asked for {n} devices, the trace has {len(ordered)}")
    if n == len(ordered):
        return ordered
    picks = np.random.default_rng([seed, stream]).choice(len(ordered), size=n, replace=False)
    return [ordered[i] for i in picks]


def import_fedscale(capacity_path: Path, behave_path: Path | None, *, devices: int | None = None, seed: int = 0,
                    scaling: ComputeScaling | None = None, clock: TraceClock | None = None) -> ImportResult:
    """Read FedScale's files (restricted unpickler) and make a timeline of `devices` devices (default: all pairs)."""
    scaling, clock = scaling or ComputeScaling(), clock or TraceClock()
    capacity = parse_capacity(load_plain_pickle(capacity_path), path=Path(capacity_path))
    behave = parse_behave(load_plain_pickle(behave_path), path=Path(behave_path)) if behave_path else None
    available = min(len(capacity), len(behave)) if behave is not None else len(capacity)
    n = available if devices is None else devices
    if n < 1:
        raise ConfigError(f"--devices must be >= 1, got {n}")
    cap_ids = choose(list(capacity), n, seed=seed, stream=_CAPACITY_STREAM)
    behave_ids = choose(list(behave), n, seed=seed, stream=_BEHAVE_STREAM) if behave is not None else [None] * n
    sources = [f"capacity client {c!r}" + (f", behave client {b!r}" if behave is not None else
                                            ", always online (no behave trace)") for c, b in zip(cap_ids, behave_ids)]
    specs, reference, capped = scaled_specs([capacity[c] for c in cap_ids], scaling)
    return assemble(specs, [behave[b] for b in behave_ids] if behave is not None else [None] * n, sources=sources,
                    clock=clock, reference_ms_per_sample=reference, capped=capped)


def scaled_specs(capacities: Sequence[Capacity], scaling: ComputeScaling) -> tuple[list[DeviceSpec], float, int]:
    """Each device's cpu_share (scaled to the run's model) and link rates; the reference ms/sample; how many capped."""
    shares, reference, capped = scaling.shares([c.ms_per_sample for c in capacities])
    specs = [DeviceSpec(cpu_share=share, up_kbit_s=c.kbit_s, down_kbit_s=c.kbit_s)
             for c, share in zip(capacities, shares)]
    return specs, reference, capped


def capacities_from(path: Path, n: int, *, seed: int) -> tuple[list[Capacity], list[str]]:
    """n devices' compute and links from a client_device_capacity file (for importers of other availability traces)."""
    capacity = parse_capacity(load_plain_pickle(path), path=Path(path))
    ids = choose(list(capacity), n, seed=seed, stream=_CAPACITY_STREAM)
    return [capacity[c] for c in ids], [f"capacity client {c!r}" for c in ids]

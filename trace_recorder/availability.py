"""From a public trace's availability windows to timeline rows: the clock and the cost scaling importers share.

Public traces give, per device, windows of a repeating period during which it can train
(FedScale's active/inactive times, FLASH's idle-charging-on-WiFi spans), and a compute speed
in the trace's own model (FedScale: ms per sample). An importer maps both onto a run:

- Time: run second t reads the trace at `start_s + t * time_scale`, wrapped at the device's
  period (both FedScale and FLASH replay a trace from its start when it ends), for
  0 <= t < horizon_s. time_scale > 1 compresses the trace (3600: an hour of the trace per
  second of the run).
- Compute: a device's training time per sample of the run's model is
  `ms_per_sample * model_cost_ratio`. The default ratio, 3, is FedScale's own: its ms/sample
  are inference latencies and it counts training (forward plus backward) as 3 times that
  (fedscale/cloud/internal/client_metadata.py, get_completion_time, augmentation_factor = 3.0);
  multiply by the run's model's cost per sample over the trace's model's where known.
  cpu_share = reference_ms_per_sample / that time, at most 1: the reference (the run's
  training ms per sample at cpu_share 1, default the fastest imported device's) is what
  the simulator's --sample-s means, in seconds.
- Links: kbit/s as given, for upload and download alike (FedScale has one rate).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from flexfl.errors import ConfigError
from trace_recorder.timeline import Conditions, Interval, Timeline, TimeUnit
from workloads.partition_spec import device_id

# Rows one device may get: a time_scale that wraps a short period millions of times is a mistake.
MAX_ROWS_PER_DEVICE = 1_000_000
# FedScale's factor from an inference latency to a training step's (forward + backward).
FEDSCALE_TRAINING_FACTOR = 3.0


@dataclass(frozen=True)
class TraceClock:
    """Run second t reads the trace at start_s + t * time_scale, for 0 <= t < horizon_s."""

    horizon_s: float = 3600.0
    time_scale: float = 1.0
    start_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("horizon_s", "time_scale"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a finite number > 0, got {value}")
        if not math.isfinite(self.start_s) or self.start_s < 0:
            raise ConfigError(f"start_s must be a finite number >= 0, got {self.start_s}")


@dataclass(frozen=True)
class Availability:
    """Windows [start, end) of trace seconds within one period of `period_s`, sorted and disjoint."""

    windows: tuple[tuple[float, float], ...]
    period_s: float


def merge_windows(windows: Sequence[tuple[float, float]], *, period_s: float) -> Availability:
    """Clip windows to [0, period_s], drop empty ones, sort and merge those that overlap or touch."""
    clipped = sorted((max(0.0, a), min(period_s, b)) for a, b in windows)
    merged: list[tuple[float, float]] = []
    for a, b in clipped:
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return Availability(windows=tuple(merged), period_s=period_s)


def online_segments(availability: Availability | None, clock: TraceClock) -> list[tuple[float, float, bool]]:
    """(start, end, online) in run seconds, covering [0, horizon_s) without gaps; None: always online."""
    if availability is None:
        return [(0.0, clock.horizon_s, True)]
    lo = clock.start_s
    hi = clock.start_s + clock.horizon_s * clock.time_scale
    period = availability.period_s
    first, last = math.floor(lo / period), math.floor(hi / period)
    if (last - first + 1) * max(1, len(availability.windows)) > MAX_ROWS_PER_DEVICE:
        raise ConfigError(f"horizon_s x time_scale covers {last - first + 1} periods of {period:g} s: over "
                          f"{MAX_ROWS_PER_DEVICE} rows for one device; shorten the horizon or the time scale")
    edges = {lo, hi}
    for k in range(first, last + 1):
        for a, b in availability.windows:
            edges.update(x for x in (a + k * period, b + k * period) if lo < x < hi)
    points = sorted(edges)

    def run_time(x: float) -> float:
        # The span's own ends map exactly onto 0 and the horizon, whatever the float arithmetic.
        return 0.0 if x == lo else clock.horizon_s if x == hi else (x - lo) / clock.time_scale

    def online_at(x: float) -> bool:
        t = x - math.floor(x / period) * period
        return any(a <= t < b for a, b in availability.windows)

    segments: list[tuple[float, float, bool]] = []
    for a, b in itertools.pairwise(points):
        start, end, online = run_time(a), run_time(b), online_at((a + b) / 2)
        if end <= start:
            continue
        if segments and segments[-1][2] == online:
            segments[-1] = (segments[-1][0], end, online)
        elif segments:
            segments.append((segments[-1][1], end, online))  # shares the previous end exactly
        else:
            segments.append((start, end, online))
    return segments


@dataclass(frozen=True)
class DeviceSpec:
    """An imported device's constant conditions; its availability decides when they hold."""

    cpu_share: float
    up_kbit_s: float
    down_kbit_s: float


def device_rows(availability: Availability | None, spec: DeviceSpec, *, clock: TraceClock) -> tuple[Interval, ...]:
    """A device's timeline rows: its constant conditions, online where its availability says."""
    return tuple(Interval(start=a, end=b, conditions=Conditions(cpu_share=spec.cpu_share, up_kbit_s=spec.up_kbit_s,
                                                                 down_kbit_s=spec.down_kbit_s, online=online))
                 for a, b, online in online_segments(availability, clock))


@dataclass(frozen=True)
class ImportResult:
    """A timeline and what it was made from: each device's source, the compute scaling used."""

    timeline: Timeline
    sources: dict[str, str]  # device -> where in the input files it came from
    reference_ms_per_sample: float | None  # cpu_share 1.0 = this many ms per training sample; None: not from a trace
    capped: int = 0  # devices faster than the reference, given cpu_share 1
    skipped: tuple[str, ...] = ()  # input devices left out, and why


def assemble(specs: Sequence[DeviceSpec], availabilities: Sequence[Availability | None], *, sources: Sequence[str],
             clock: TraceClock, reference_ms_per_sample: float | None, capped: int = 0,
             skipped: Sequence[str] = ()) -> ImportResult:
    """Device k (dev-k) gets specs[k] while availabilities[k] says it is online (None: always)."""
    names = device_names(len(specs))
    rows = {name: device_rows(av, spec, clock=clock) for name, spec, av in zip(names, specs, availabilities)}
    return ImportResult(timeline=Timeline(unit=TimeUnit.SECOND, devices=rows), sources=dict(zip(names, sources)),
                        reference_ms_per_sample=reference_ms_per_sample, capped=capped, skipped=tuple(skipped))


@dataclass(frozen=True)
class ComputeScaling:
    """Trace ms/sample -> the run's: times model_cost_ratio; cpu_share = reference / that (module docstring)."""

    model_cost_ratio: float = FEDSCALE_TRAINING_FACTOR
    reference_ms_per_sample: float | None = None  # the run's training ms/sample at cpu_share 1; None: the fastest

    def __post_init__(self) -> None:
        for name in ("model_cost_ratio", "reference_ms_per_sample"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {value}")

    def shares(self, ms_per_sample: Sequence[float]) -> tuple[list[float], float, int]:
        """cpu_share per device, the reference ms/sample used, and how many devices were capped at 1."""
        run_ms = [ms * self.model_cost_ratio for ms in ms_per_sample]
        reference = self.reference_ms_per_sample if self.reference_ms_per_sample is not None else min(run_ms)
        shares = [min(1.0, reference / ms) for ms in run_ms]
        return shares, reference, sum(reference > ms for ms in run_ms)


def device_names(n: int) -> list[str]:
    """Imported devices are dev-0..dev-(n-1): the ids `flexfl live` and the simulator give devices."""
    return [device_id(k) for k in range(n)]

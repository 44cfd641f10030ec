"""The trace sampler: which trace a device follows and its s in each round, one rule for all.

The live agent (a device following a trace) and the simulator call the same functions with
the same seed, so a live run and its simulation see the same s per device per round. Every
draw is a pure function of (seed, device index, round): no stream state, so resumed runs,
devices that arrive late and paired runs that differ only in a policy all see the same s.

Rules (the paper leaves them open; see results/README.md):
- Assignment: each device follows one trace drawn uniformly from the first |T| traces of a
  set (`assign_traces`).
- Sampling: `iid` (default) draws each round's fraction uniformly from the device's trace,
  independently across rounds and devices ("randomly samples from its trace"); `replay`
  walks the trace in order from a per-device random starting row, wrapping.
- Fraction to s: `round` (default) is round-half-up of fraction x E, clipped to 0..E, so a
  trace recorded with the same E maps exactly and the mean of s / E tracks the trace's
  mean; `floor` counts only updates finished in full. Neither maps a zero to anything but 0.
"""

from __future__ import annotations

import numpy as np

from flexfl.errors import ConfigError
from flexfl.vocabulary import Sampling, SRule
from trace_recorder.format import Trace

# Stream tags keep the sampler's random numbers apart from every other seeded stream.
_ASSIGN, _OFFSET, _DRAW = 1, 7, 2


def fraction_to_updates(fraction: np.ndarray | float, *, E: int, rule: SRule | str = SRule.ROUND) -> np.ndarray:
    """Map completed fractions (0..1) to integer local updates s in 0..E."""
    f = np.asarray(fraction, dtype=np.float64)
    if np.any(~np.isfinite(f)) or np.any(f < 0) or np.any(f > 1):
        raise ConfigError(f"fractions must lie in 0..1, got {f[(~np.isfinite(f)) | (f < 0) | (f > 1)][:3]}")
    try:
        rule = SRule(rule)
    except ValueError:
        raise ConfigError(f"unknown fraction-to-s rule {rule!r}; use one of {', '.join(SRule)}") from None
    # The 1e-9 guards against k/E stored as 0.34999999 becoming one update less.
    s = np.floor(f * E + (0.5 if rule is SRule.ROUND else 0.0) + 1e-9)
    return np.clip(s, 0, E).astype(np.int64)


def assign_traces(n_devices: int, *, n_traces: int, seed: int) -> np.ndarray:
    """The trace (index into the first `n_traces` of a set) each of n_devices follows; int64 [n]."""
    if n_traces < 1 or n_devices < 0:
        raise ConfigError(f"need n_traces >= 1 and n_devices >= 0, got {n_traces}, {n_devices}")
    return np.random.default_rng([seed, _ASSIGN]).integers(0, n_traces, size=n_devices)


class TraceSampler:
    """s per round for one device that follows `trace`."""

    def __init__(self, trace: Trace, *, E: int, seed: int, device_index: int,
                 sampling: Sampling | str = Sampling.IID, s_rule: SRule | str = SRule.ROUND) -> None:
        if E < 1 or device_index < 0:
            raise ConfigError(f"need E >= 1 and device_index >= 0, got {E}, {device_index}")
        try:
            self.sampling = Sampling(sampling)
        except ValueError:
            raise ConfigError(f"unknown sampling mode {sampling!r}; use one of {', '.join(Sampling)}") from None
        self.trace = trace
        self.seed = seed
        self.device_index = device_index
        self.updates = fraction_to_updates(trace.fraction, E=E, rule=s_rule)  # s per trace row
        self._offset = int(np.random.default_rng([seed, _OFFSET, device_index]).integers(1 << 30))

    def draw(self, round_index: int) -> int:
        """s in round `round_index` (counted from 1)."""
        n = len(self.updates)
        if self.sampling is Sampling.REPLAY:
            return int(self.updates[(self._offset + round_index - 1) % n])
        u = np.random.default_rng([self.seed, _DRAW, self.device_index, round_index]).random()
        return int(self.updates[int(u * n)])

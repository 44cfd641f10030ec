"""Participation from traces: which trace each simulated device follows and its s every round.

Rules (the paper leaves them open; see results/README.md):
- Assignment: each device gets one trace uniformly at random from the first |T| traces of
  the set (seeded).
- Sampling: `iid` (default) draws each round's fraction uniformly from the device's trace,
  independently across rounds and devices ("randomly samples from its trace");
  `replay` walks the trace in order from a random starting round per device, wrapping.
- Fraction to s: `round` (default) is round-half-up of fraction * E, clipped to 0..E, so a
  trace recorded with the same E maps exactly and the mean of s / E tracks the trace's
  mean; `floor` counts only updates finished in full. Neither maps a zero to anything but 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flexfl.errors import ConfigError
from trace_recorder.format import Trace
from trace_recorder.replay import S_RULES, fraction_to_updates

SAMPLING_MODES = ("iid", "replay")


class TraceParticipation:
    """Draws s_tau^k for N simulated devices from their assigned traces."""

    def __init__(
        self,
        traces: Sequence[Trace],
        *,
        n_devices: int,
        E: int,
        seed: int,
        sampling: str = "iid",
        s_rule: str = "round",
    ) -> None:
        if not traces:
            raise ConfigError("no traces to draw participation from")
        if sampling not in SAMPLING_MODES:
            raise ConfigError(f"unknown sampling mode {sampling!r}; use one of {SAMPLING_MODES}")
        if n_devices < 1 or E < 1:
            raise ConfigError(f"need n_devices >= 1 and E >= 1, got {n_devices}, {E}")
        self.traces = tuple(traces)
        self.E = E
        self.sampling = sampling
        self.s_rule = s_rule
        assign_rng = np.random.default_rng([seed, 1])
        self.assignment = assign_rng.integers(0, len(self.traces), size=n_devices)
        self._offsets = assign_rng.integers(0, 1 << 30, size=n_devices)
        self._rng = np.random.default_rng([seed, 2])
        # Precompute s per trace row once; drawing then is pure indexing.
        self._updates = [fraction_to_updates(t.fraction, E=E, rule=s_rule) for t in self.traces]

    @property
    def trace_names(self) -> list[str]:
        return [self.traces[i].name for i in self.assignment]

    def draw(self, round_index: int) -> np.ndarray:
        """s for every device in round `round_index` (counted from 1); int64 [N]."""
        s = np.empty(len(self.assignment), dtype=np.int64)
        if self.sampling == "iid":
            # One uniform per device keeps the stream independent of the traces' lengths' mix.
            u = self._rng.random(len(self.assignment))
            for k, j in enumerate(self.assignment):
                updates = self._updates[j]
                s[k] = updates[int(u[k] * len(updates))]
        else:
            for k, j in enumerate(self.assignment):
                updates = self._updates[j]
                s[k] = updates[(self._offsets[k] + round_index - 1) % len(updates)]
        return s


class FixedParticipation:
    """A given s per device per round (cycled): forced participation, e.g. to replay a live run."""

    def __init__(self, schedule: Sequence[Sequence[int]], *, E: int) -> None:
        arr = np.asarray(schedule, dtype=np.int64)  # [rounds, devices]
        if arr.ndim != 2 or arr.size == 0:
            raise ConfigError(f"schedule must be a non-empty [rounds][devices] table, got shape {arr.shape}")
        if arr.min() < 0 or arr.max() > E:
            raise ConfigError(f"schedule values must lie in 0..E (E = {E})")
        self._schedule = arr
        self.trace_names = ["fixed"] * arr.shape[1]

    def draw(self, round_index: int) -> np.ndarray:
        return self._schedule[(round_index - 1) % len(self._schedule)].copy()

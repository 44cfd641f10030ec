"""The names of the rules' choices: aggregation scheme and departure policy.

Light (no torch), so that command-line parsers take their choices from here (`flexfl --help`
and the loadgen daemon on a Pi build every parser). The rules themselves live in
coordinator.aggregation (schemes) and coordinator.objective (departures).
"""

from __future__ import annotations

from enum import StrEnum


class Scheme(StrEnum):
    """A: complete devices only. B: incomplete work at weight p_k. C: incomplete work at (E/s_k) p_k."""

    A = "A"
    B = "B"
    C = "C"


class DeparturePolicy(StrEnum):
    """include: keep a departed device's p^k (it contributes nothing); exclude: drop and renormalise;
    auto: decide per departure by Corollary 4.3 (AutoDeparture); threshold: by the time left
    alone (ThresholdDeparture)."""

    INCLUDE = "include"
    EXCLUDE = "exclude"
    AUTO = "auto"
    THRESHOLD = "threshold"

    @property
    def decided_at_departure(self) -> bool:
        """auto and threshold are rules, resolved to include or exclude when the departure takes effect."""
        return self in (DeparturePolicy.AUTO, DeparturePolicy.THRESHOLD)

"""How a trace's fractions become local-update counts s (used by the simulator and throttled agents).

Rules: `round` (default) is round-half-up of fraction * E, clipped to 0..E, so a trace
recorded with the same E maps exactly and the mean of s / E tracks the trace's mean;
`floor` counts only updates finished in full. Neither maps a zero to anything but 0.
"""

from __future__ import annotations

import numpy as np

from flexfl.errors import ConfigError

S_RULES = ("round", "floor")


def fraction_to_updates(fraction: np.ndarray | float, *, E: int, rule: str = "round") -> np.ndarray:
    """Map completed fractions (0..1) to integer local updates s in 0..E."""
    f = np.asarray(fraction, dtype=np.float64)
    if np.any(~np.isfinite(f)) or np.any(f < 0) or np.any(f > 1):
        raise ConfigError(f"fractions must lie in 0..1, got {f[(~np.isfinite(f)) | (f < 0) | (f > 1)][:3]}")
    # The 1e-9 guards against k/E stored as 0.34999999 becoming one update less.
    if rule == "round":
        s = np.floor(f * E + 0.5 + 1e-9)
    elif rule == "floor":
        s = np.floor(f * E + 1e-9)
    else:
        raise ConfigError(f"unknown fraction-to-s rule {rule!r}; use one of {S_RULES}")
    return np.clip(s, 0, E).astype(np.int64)

"""The agent's own memory, as the kernel counts it: what it logs after every round.

Figures come from /proc/self/status (Linux, the devices' OS): VmRSS (resident now), RssAnon
(its anonymous part: heaps, arenas, tensors, Python objects; the rest is mostly shared
libraries' code, clean pages the kernel can drop and read again) and VmHWM (the most ever
resident). Elsewhere psutil gives the resident size only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import psutil

_STATUS = Path("/proc/self/status")
_KEYS = {"VmRSS": "resident_mib", "RssAnon": "anonymous_mib", "VmHWM": "peak_mib"}


@dataclass(frozen=True)
class ProcessMemory:
    resident_mib: float  # VmRSS
    anonymous_mib: float  # RssAnon (nan without /proc)
    peak_mib: float  # VmHWM (nan without /proc)

    @classmethod
    def now(cls) -> ProcessMemory:
        """This process's memory now (one read of /proc/self/status)."""
        try:
            text = _STATUS.read_text()
        except OSError:
            return cls(psutil.Process().memory_info().rss / 2**20, math.nan, math.nan)
        values = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in _KEYS:
                values[_KEYS[key]] = int(value.split()[0]) / 1024  # kB
        return cls(**{name: values.get(name, math.nan) for name in _KEYS.values()})

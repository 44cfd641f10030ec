"""The agent's own memory: what it logs after every round, and handing a round's freed memory back.

Figures come from /proc/self/status (Linux, the devices' OS): VmRSS (resident now), RssAnon
(its anonymous part: heaps, arenas, tensors, Python objects; the rest is mostly shared
libraries' code, clean pages the kernel can drop and read again) and VmHWM (the most ever
resident). Elsewhere psutil gives the resident size only.

Each round allocates and frees buffers of about the model's size (0.8 MB for the MNIST MLP):
the received bytes and their joined copy, the initial parameters and the delta, the wire
copies of the upload, gRPC's own on its threads. glibc's malloc keeps what such a round
frees: once a block that big is freed, its mmap threshold rises to that size (so later ones
come from the heaps, not from mmap), and every thread that allocates gets an arena of its
own (gRPC runs about ten). Measured with benchmarks/agent_memory.py after 5 MNIST rounds,
that was ~10 MiB resident that no round used again. Two glibc settings give it back:
limit_arenas() at start (gRPC's threads share arenas) and release_freed() after each round
(malloc_trim, a few ms). A fixed mmap threshold would too, but torch then maps and faults
in every step's gradient buffers afresh: local updates took 2.5x as long.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import psutil

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
# The main thread's and one for all of gRPC's threads. One arena in all measured 2.3 MiB less
# after 5 MNIST rounds (benchmarks/agent_memory.py, medians of 3 interleaved runs); with one
# torch thread local updates took 0.37 against 0.35 ms (medians of 5, each run's spread +-20 %),
# and with torch's own thread count a loaded 2-core box timed both settings anywhere from 1 to
# 115 ms per update: kept at 2 until a quiet machine says one arena does not slow training.
ARENAS = 2

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


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Let at most `arenas` malloc arenas exist (glibc; call before threads start); False elsewhere."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_ARENA_MAX, arenas))


def release_freed() -> bool:
    """Hand the free memory of every malloc arena back to the kernel (glibc's malloc_trim); False elsewhere."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True

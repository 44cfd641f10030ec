"""Which trainer a simulation runs; light (no torch), so that `flexfl sim --trainer` takes its choices from here."""

from __future__ import annotations

from enum import StrEnum


class TrainerKind(StrEnum):
    """cache: each device alone, its weights in cache, numba kernels (simulator.cache_trainer);
    fast: all devices of a round together (simulator.fast_trainer); plain: edge_agent.trainer per
    device (the reference both must equal); auto: cache. All count updates in either unit: an
    epoch is ceil(n_k / B) steps of the same batch stream (edge_agent.trainer)."""

    AUTO = "auto"
    CACHE = "cache"
    FAST = "fast"
    PLAIN = "plain"

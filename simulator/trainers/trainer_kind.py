"""Which trainer a simulation runs; light (no torch), so that `flexfl sim --trainer` takes its choices from here."""

from __future__ import annotations

import functools
import logging
from enum import StrEnum

log = logging.getLogger(__name__)


class TrainerKind(StrEnum):
    """cache: each device alone, its weights in cache, numba kernels (simulator.trainers.cache_trainer);
    fast: all devices of a round together (simulator.trainers.fast_trainer); plain: edge_agent.trainer per
    device (the reference both must equal); auto: cache where numba imports, else fast. All count
    updates in either unit: an epoch is ceil(n_k / B) steps of the same batch stream (edge_agent.trainer)."""

    AUTO = "auto"
    CACHE = "cache"
    FAST = "fast"
    PLAIN = "plain"


# The row trainers: every row (device) of a round in one call, which paired runs share.
ROW_KINDS = frozenset({TrainerKind.CACHE, TrainerKind.FAST})


@functools.cache
def cache_trainer_available() -> bool:
    """numba imports (pip install -e '.[sim]'); else auto picks the batched torch trainer, and says so.

    An import, not importlib.util.find_spec: a numba that is found but does not load (an llvmlite
    of another build) must fall back too."""
    try:
        import numba  # noqa: F401
    except ImportError as exc:
        log.warning("numba is not installed (pip install -e '.[sim]'): simulating on the batched torch trainer, "
                    "about half the cache trainer's speed on MNIST (%s)", exc)
        return False
    return True

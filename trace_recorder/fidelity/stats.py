"""The statistics of `flexfl traces fidelity`: how far a live run's s and curves are from the traces' and simulations'.

numpy only (scipy is not a dependency). Each function validates its input and says which
argument is wrong; nothing here knows about files, rounds or devices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from flexfl.errors import ConfigError


def _sample(values: Sequence[float] | np.ndarray, *, name: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ConfigError(f"{name}: empty sample")
    if not np.all(np.isfinite(x)):
        raise ConfigError(f"{name}: {int(np.sum(~np.isfinite(x)))} value(s) are not finite")
    return x


def ks_distance(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov distance D = sup_x |F_a(x) - F_b(x)| of the empirical CDFs.

    Both step functions change only at sample values, so the supremum is reached at one of
    them (ties included: each ECDF counts every value <= x, side="right").
    """
    xa, xb = np.sort(_sample(a, name="ks_distance a")), np.sort(_sample(b, name="ks_distance b"))
    at = np.concatenate([xa, xb])
    fa = np.searchsorted(xa, at, side="right") / xa.size
    fb = np.searchsorted(xb, at, side="right") / xb.size
    return float(np.max(np.abs(fa - fb)))


def ks_critical(n: int, m: int, *, alpha: float = 0.05) -> float:
    """The asymptotic critical D of a two-sample KS test at level `alpha`: c(alpha) sqrt((n + m) / (n m)),
    c(alpha) = sqrt(-ln(alpha / 2) / 2) (1.358 at 5 %).

    It assumes independent draws of a continuous variable: for values on a grid (s / E) the
    test is conservative, for positively autocorrelated rounds it rejects too often (fewer
    independent rounds than n); the fidelity page reports the autocorrelation beside it.
    """
    if n < 1 or m < 1:
        raise ConfigError(f"ks_critical needs two non-empty samples, got sizes {n} and {m}")
    if not 0 < alpha < 1:
        raise ConfigError(f"ks_critical: alpha must lie in (0, 1), got {alpha}")
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def band_share(values: Sequence[float] | np.ndarray, low: Sequence[float] | np.ndarray,
               high: Sequence[float] | np.ndarray) -> float:
    """The share of positions i with low[i] <= values[i] <= high[i] (a curve inside a per-round band)."""
    v, lo, hi = (_sample(x, name=n) for x, n in ((values, "band_share values"), (low, "band_share low"),
                                                 (high, "band_share high")))
    if not v.size == lo.size == hi.size:
        raise ConfigError(f"band_share: values, low and high differ in length ({v.size}, {lo.size}, {hi.size})")
    if np.any(lo > hi):
        i = int(np.argmax(lo > hi))
        raise ConfigError(f"band_share: low > high at position {i} ({lo[i]} > {hi[i]})")
    return float(np.mean((v >= lo) & (v <= hi)))


def exchangeable_inside_share(k: int) -> float:
    """The expected share of rounds a curve lies inside the min-max band of k others when all k + 1 are
    exchangeable draws (continuous values): it is outside when it is the smallest or the largest, 2 / (k + 1)."""
    if k < 2:
        raise ConfigError(f"a min-max band needs at least 2 curves, got {k}")
    return (k - 1) / (k + 1)


def lag1_autocorrelation(values: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation of x[t] with x[t + 1]; nan when either part is constant or there are < 3 values."""
    x = _sample(values, name="lag1_autocorrelation")
    if x.size < 3:
        return math.nan
    return _pearson(x[:-1], x[1:])


def mean_pairwise_correlation(table: Sequence[Sequence[float]] | np.ndarray) -> float:
    """The mean Pearson correlation over pairs of columns of table[round][device] (columns that never
    change have none and are left out); nan with fewer than two such columns.

    Devices drawing s independently (the simulator's iid sampling) have 0 in expectation;
    devices slowed together (contention on a shared machine) have more.
    """
    t = np.asarray(table, dtype=np.float64)
    if t.ndim != 2:
        raise ConfigError(f"mean_pairwise_correlation needs a [rounds][devices] table, got shape {t.shape}")
    _sample(t, name="mean_pairwise_correlation")
    varying = [j for j in range(t.shape[1]) if np.ptp(t[:, j]) > 0]
    pairs = [_pearson(t[:, i], t[:, j]) for n, i in enumerate(varying) for j in varying[n + 1:]]
    return float(np.mean(pairs)) if pairs else math.nan


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])

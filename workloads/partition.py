"""Splitting a dataset over devices: Pareto sample counts, IID and one-label-per-device.

Every function takes an explicit seed and is reproducible for it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from flexfl.errors import DataError

log = logging.getLogger(__name__)


def pareto_sizes(
    n_devices: int,
    *,
    total: int,
    index: float = 0.5,
    min_size: int,
    max_size: int | None = None,
    seed: int,
) -> np.ndarray:
    """Per-device sample counts (int64 [n_devices]) following a Type-I Pareto with `index`.

    Draws d_k = Pareto(index) with x_m = 1. Each device first gets `min_size`; the rest,
    total - n_devices * min_size, is shared in proportion to d_k, with no device above
    `max_size` (excess goes to the others, still in proportion to d_k). Rounding is by
    largest remainder, so the counts sum to exactly `total`.
    """
    if n_devices < 1:
        raise DataError(f"need at least one device, got n_devices={n_devices}")
    if index <= 0:
        raise DataError(f"the Pareto index must be > 0, got {index}")
    if min_size < 1:
        raise DataError(f"min_size must be >= 1 (every device needs data), got {min_size}")

    rng = np.random.default_rng(seed)
    draws = rng.pareto(index, n_devices) + 1.0  # Type I: support [1, inf)
    return proportional_sizes(draws, total=total, min_size=min_size, max_size=max_size)


def truncated_pareto_draws(n_devices: int, *, index: float = 0.5, upper: float, seed: int) -> np.ndarray:
    """Type-I Pareto(index) draws (x_m = 1) truncated to [1, upper], by inverse CDF; float64 [n]."""
    if upper <= 1:
        raise DataError(f"the truncation point must be > 1, got {upper}")
    u = np.random.default_rng(seed).random(n_devices)
    # F(x) = (1 - x^-a) / (1 - U^-a) on [1, U]  =>  x = (1 - u (1 - U^-a))^(-1/a)
    return (1.0 - u * (1.0 - upper ** -index)) ** (-1.0 / index)


def lognormal_draws(n_devices: int, *, seed: int) -> np.ndarray:
    """FedProx's SYNTHETIC sample counts: floor(LogNormal(4, 2)) + 50 per device; float64 [n]."""
    return np.floor(np.random.default_rng(seed).lognormal(4.0, 2.0, n_devices)) + 50.0


def proportional_sizes(weights: np.ndarray, *, total: int, min_size: int, max_size: int | None = None) -> np.ndarray:
    """Counts summing to `total`: `min_size` each, the rest in proportion to `weights`, none above `max_size`."""
    n_devices = len(weights)
    if n_devices * min_size > total:
        raise DataError(f"{n_devices} devices x min_size {min_size} = {n_devices * min_size} exceeds total {total}")
    cap = np.inf
    if max_size is not None:
        if max_size < min_size:
            raise DataError(f"max_size {max_size} is below min_size {min_size}")
        if n_devices * max_size < total:
            raise DataError(f"{n_devices} devices x max_size {max_size} = {n_devices * max_size} is below total "
                            f"{total}")
        cap = float(max_size - min_size)
    weights = np.asarray(weights, dtype=np.float64)
    rest = total - n_devices * min_size
    extra = _water_fill(weights / weights.sum(), amount=float(rest), cap=cap)
    return np.full(n_devices, min_size, dtype=np.int64) + _round_to_sum(extra, total=rest, cap=cap)


def _water_fill(weights: np.ndarray, *, amount: float, cap: float) -> np.ndarray:
    # Proportional shares; devices that would exceed cap are pinned at cap and the rest
    # is re-shared among the others until no share exceeds cap.
    out = np.zeros_like(weights)
    free = np.ones(len(weights), dtype=bool)
    while True:
        share = (amount - out[~free].sum()) * weights[free] / weights[free].sum()
        over = share > cap
        if not over.any():
            out[free] = share
            return out
        pinned = np.flatnonzero(free)[over]
        out[pinned] = cap
        free[pinned] = False


def _round_to_sum(values: np.ndarray, *, total: int, cap: float) -> np.ndarray:
    # Largest-remainder rounding: floors, then +1 for the largest fractional parts.
    floors = np.floor(values).astype(np.int64)
    left = total - int(floors.sum())
    order = np.argsort(-(values - floors), kind="stable")
    order = order[floors[order] < cap]
    while left > 0:  # normally one pass; loops only to absorb float error
        take = order[:left]
        floors[take] += 1
        left -= len(take)
        order = order[floors[order] < cap]
    return floors


def partition_iid(n_samples: int, sizes: Sequence[int] | np.ndarray, *, seed: int) -> list[np.ndarray]:
    """Disjoint index arrays of the given sizes, cut from one random permutation of n_samples."""
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    if (sizes_arr < 0).any():
        raise DataError(f"sizes must be >= 0, got {sizes_arr.min()}")
    if sizes_arr.sum() > n_samples:
        raise DataError(f"sizes ask for {int(sizes_arr.sum())} samples but only {n_samples} exist")
    perm = np.random.default_rng(seed).permutation(n_samples)
    return np.split(perm[: sizes_arr.sum()], np.cumsum(sizes_arr)[:-1])


def partition_by_label_shares(labels: np.ndarray, weights: np.ndarray, *, total: int, seed: int,
                              min_size: int = 1) -> tuple[list[np.ndarray], np.ndarray]:
    """One label per device, and the devices of a label share its samples in proportion to `weights`.

    Each device's label is drawn uniformly (as partition_by_label). Of each label, the same
    fraction total / len(labels) is used, so the split holds `total` samples (up to
    rounding) and no device is ever shrunk: sizes follow the weights within each label.
    """
    labels = np.asarray(labels)
    weights = np.asarray(weights, dtype=np.float64)
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    assigned = rng.choice(classes, size=len(weights)).astype(np.int64)
    parts: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(weights)
    for label in classes:
        devices = np.flatnonzero(assigned == label)
        pool = rng.permutation(np.flatnonzero(labels == label))
        if len(devices) == 0:
            continue
        use = max(len(devices) * min_size, round(len(pool) * total / len(labels)))
        if use > len(pool):
            raise DataError(f"label {label} has {len(pool)} samples for {len(devices)} devices of at least {min_size}")
        counts = proportional_sizes(weights[devices], total=use, min_size=min_size)
        for device, chunk in zip(devices, np.split(pool[:use], np.cumsum(counts)[:-1])):
            parts[device] = chunk
    return parts, assigned


def partition_by_label(
    labels: np.ndarray, sizes: Sequence[int] | np.ndarray, *, seed: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """Give each device samples of one label only: (index arrays, label of each device).

    Each device's label is drawn uniformly from the labels present. When the devices that
    drew a label ask for more samples than it has, their sizes are scaled down by the same
    factor (each keeps at least 1) and this is logged once per label at INFO.
    """
    labels = np.asarray(labels)
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    if (sizes_arr < 1).any():
        raise DataError(f"every device needs at least one sample, got size {sizes_arr.min()}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    if len(classes) == 0:
        raise DataError("no labels to partition")
    assigned = rng.choice(classes, size=len(sizes_arr)).astype(np.int64)
    parts: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(sizes_arr)
    for label in classes:
        devices = np.flatnonzero(assigned == label)
        if len(devices) == 0:
            continue
        pool = rng.permutation(np.flatnonzero(labels == label))
        want = sizes_arr[devices]
        if want.sum() > len(pool):
            if len(devices) > len(pool):
                raise DataError(f"label {label} has {len(pool)} samples for {len(devices)} devices")
            factor = len(pool) / want.sum()
            want = _shrink(want, available=len(pool))
            log.info("label %s: %d devices asked for %d samples, %d exist; sizes scaled by %.3f",
                     label, len(devices), int(sizes_arr[devices].sum()), len(pool), factor)
        for device, chunk in zip(devices, np.split(pool[: want.sum()], np.cumsum(want)[:-1])):
            parts[device] = chunk
    return parts, assigned


def _shrink(want: np.ndarray, *, available: int) -> np.ndarray:
    # Proportional scale-down, floored, at least 1 each; the floor of 1 can overshoot,
    # so take the surplus back from the largest devices.
    out = np.maximum(1, np.floor(want * (available / want.sum())).astype(np.int64))
    while out.sum() > available:
        out[np.argmax(out)] -= 1
    return out

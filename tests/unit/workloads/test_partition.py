"""Pareto sample counts, IID splits and one-label-per-device splits."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from flexfl.errors import DataError
from workloads.partition import pareto_sizes, partition_by_label, partition_iid


def assert_disjoint(parts: list[np.ndarray]) -> None:
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)


# ---------------------------------------------------------------- Pareto sizes


def test_pareto_sizes_sum_floor_dtype() -> None:
    sizes = pareto_sizes(100, total=60000, min_size=20, seed=0)
    assert sizes.dtype == np.int64 and sizes.shape == (100,)
    assert sizes.sum() == 60000
    assert sizes.min() >= 20


def test_pareto_sizes_reproducible_and_seed_dependent() -> None:
    a = pareto_sizes(50, total=20000, min_size=50, seed=1)
    assert np.array_equal(a, pareto_sizes(50, total=20000, min_size=50, seed=1))
    assert not np.array_equal(a, pareto_sizes(50, total=20000, min_size=50, seed=2))


def test_pareto_index_half_is_heavy_tailed() -> None:
    # Index 0.5 has an infinite mean: the largest device typically holds a large share.
    shares = [pareto_sizes(100, total=60000, min_size=20, seed=s).max() / 60000 for s in range(10)]
    assert np.median(shares) > 10 / 100
    # A light tail (large index) gives nearly equal sizes.
    light = pareto_sizes(100, total=60000, index=50.0, min_size=20, seed=0)
    assert light.max() / 60000 < 2 / 100


def test_pareto_sizes_cap_redistributes_excess() -> None:
    sizes = pareto_sizes(100, total=60000, min_size=20, max_size=2000, seed=0)
    uncapped = pareto_sizes(100, total=60000, min_size=20, seed=0)
    assert uncapped.max() > 2000  # the cap binds for this seed
    assert sizes.max() <= 2000 and sizes.min() >= 20 and sizes.sum() == 60000


def test_pareto_sizes_exactly_min_when_no_room() -> None:
    assert pareto_sizes(10, total=200, min_size=20, seed=0).tolist() == [20] * 10


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"total": 100, "min_size": 20}, "exceeds total"),
        ({"total": 1000, "min_size": 20, "max_size": 50}, "below total"),
        ({"total": 1000, "min_size": 20, "max_size": 10}, "below min_size"),
        ({"total": 1000, "min_size": 0}, "min_size must be >= 1"),
    ],
)
def test_pareto_sizes_impossible_requests(kwargs: dict, problem: str) -> None:
    with pytest.raises(DataError, match=problem):
        pareto_sizes(10, seed=0, **kwargs)


# ---------------------------------------------------------------- IID


def test_partition_iid_exact_sizes_disjoint_reproducible() -> None:
    sizes = [5, 0, 17, 3]
    parts = partition_iid(30, sizes, seed=0)
    assert [len(p) for p in parts] == sizes
    assert_disjoint(parts)
    assert np.concatenate(parts).max() < 30
    again = partition_iid(30, sizes, seed=0)
    assert all(np.array_equal(p, q) for p, q in zip(parts, again))
    other = partition_iid(30, sizes, seed=1)
    assert not all(np.array_equal(p, q) for p, q in zip(parts, other))


def test_partition_iid_too_many_samples() -> None:
    with pytest.raises(DataError, match="only 10 exist"):
        partition_iid(10, [6, 6], seed=0)


# ---------------------------------------------------------------- by label


def test_partition_by_label_one_label_each_exact_sizes_disjoint() -> None:
    labels = np.repeat(np.arange(10), 100)
    sizes = [10, 20, 30, 5, 15, 25, 40, 1, 7, 9, 11, 12]
    parts, assigned = partition_by_label(labels, sizes, seed=0)
    assert assigned.shape == (12,) and assigned.dtype == np.int64
    assert [len(p) for p in parts] == sizes  # no label is oversubscribed here
    assert_disjoint(parts)
    for part, label in zip(parts, assigned):
        assert np.all(labels[part] == label)


def test_partition_by_label_reproducible() -> None:
    labels = np.repeat(np.arange(10), 50)
    a_parts, a_labels = partition_by_label(labels, [10] * 8, seed=4)
    b_parts, b_labels = partition_by_label(labels, [10] * 8, seed=4)
    assert np.array_equal(a_labels, b_labels)
    assert all(np.array_equal(p, q) for p, q in zip(a_parts, b_parts))


def test_partition_by_label_labels_are_roughly_uniform() -> None:
    labels = np.repeat(np.arange(10), 10000)
    _, assigned = partition_by_label(labels, [1] * 5000, seed=0)
    counts = np.bincount(assigned, minlength=10)
    assert counts.min() > 400 and counts.max() < 600


def test_partition_by_label_shrinks_oversubscribed_label(caplog: pytest.LogCaptureFixture) -> None:
    labels = np.array([0] * 10 + [1] * 1000)
    sizes = [30, 10, 2, 1]
    # Find a seed where several devices drew label 0 so the shrink is exercised.
    for seed in range(100):
        _, assigned = partition_by_label(labels, sizes, seed=seed)
        if (assigned == 0).sum() >= 3:
            break
    on_zero = np.flatnonzero(assigned == 0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="workloads.partition"):
        parts, _ = partition_by_label(labels, sizes, seed=seed)
    got = np.array([len(parts[d]) for d in on_zero])
    assert got.sum() <= 10 and got.min() >= 1
    assert_disjoint(parts)
    shrink_logs = [r for r in caplog.records if "label 0" in r.getMessage()]
    assert len(shrink_logs) == 1 and "scaled by" in shrink_logs[0].getMessage()
    # Label 1 has plenty: its devices keep their exact sizes and nothing is logged for it.
    for d in np.flatnonzero(assigned == 1):
        assert len(parts[d]) == sizes[d]
    assert not [r for r in caplog.records if "label 1" in r.getMessage()]


def test_partition_by_label_more_devices_than_samples_of_a_label() -> None:
    labels = np.array([0, 0])
    with pytest.raises(DataError, match="label 0 has 2 samples for 3 devices"):
        partition_by_label(labels, [1, 1, 1], seed=0)

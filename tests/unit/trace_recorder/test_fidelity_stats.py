"""The fidelity page's statistics against values computed by hand."""

import math

import numpy as np
import pytest

from flexfl.errors import ConfigError
from trace_recorder.fidelity.stats import (
    band_share,
    exchangeable_inside_share,
    ks_critical,
    ks_distance,
    lag1_autocorrelation,
    mean_pairwise_correlation,
)


@pytest.mark.parametrize("a, b, d", [
    ([1, 2, 3], [3, 2, 1], 0.0),  # the same sample, in another order
    ([0], [1], 1.0),  # disjoint: one ECDF is 1 where the other is still 0
    ([1, 2, 3, 4], [3, 4, 5, 6], 0.5),  # at x = 2: F_a = 2/4, F_b = 0
    ([0, 0, 1], [0, 1, 1], 1 / 3),  # ties: at x = 0, F_a = 2/3 and F_b = 1/3; at 1 both are 1
    ([0.5], [0, 1], 0.5),  # unequal sizes: at 0, 0 vs 1/2; at 0.5, 1 vs 1/2
    ([0.2, 0.2, 0.2, 0.2], [0.2, 0.4, 0.4, 0.4], 0.75),  # s / E on a grid: at 0.2, 1 vs 1/4
])
def test_ks_distance_equals_the_hand_computed_value(a, b, d):
    assert ks_distance(a, b) == pytest.approx(d)
    assert ks_distance(b, a) == pytest.approx(d)  # symmetric


def test_ks_distance_equals_the_supremum_over_a_fine_grid():
    """A brute-force ECDF difference on a grid finer than the values' spacing finds the same supremum."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 21, size=37) / 20
    b = rng.integers(4, 21, size=53) / 20
    grid = np.arange(-1, 2001) / 1000
    brute = max(abs(np.mean(a <= x) - np.mean(b <= x)) for x in grid)
    assert ks_distance(a, b) == pytest.approx(brute)
    assert 0 < ks_distance(a, b) < 1


def test_ks_distance_refuses_empty_and_non_finite_samples():
    with pytest.raises(ConfigError, match="ks_distance b: empty sample"):
        ks_distance([1.0], [])
    with pytest.raises(ConfigError, match="ks_distance a: 1 value"):
        ks_distance([1.0, float("nan")], [1.0])


def test_ks_critical_at_five_percent():
    # c(0.05) = sqrt(-ln(0.025) / 2) = 1.35810; sqrt(200 / 100^2) = 0.141421
    assert ks_critical(100, 100) == pytest.approx(1.35810 * 0.141421, rel=1e-4)
    assert ks_critical(100, 100) == pytest.approx(0.19206, abs=1e-5)
    assert ks_critical(300, 100) < ks_critical(100, 100)  # more rounds, a finer test
    assert ks_critical(100, 100, alpha=0.01) > ks_critical(100, 100)
    with pytest.raises(ConfigError, match="sizes 0 and 5"):
        ks_critical(0, 5)


def test_band_share_counts_the_rounds_inside_including_the_edges():
    values = [0.5, 0.2, 0.9, 0.4]
    low = [0.4, 0.3, 0.8, 0.4]
    high = [0.6, 0.5, 0.9, 0.45]
    assert band_share(values, low, high) == pytest.approx(3 / 4)  # round 2 is below; 3 and 4 touch an edge
    with pytest.raises(ConfigError, match="differ in length"):
        band_share(values, low[:3], high)
    with pytest.raises(ConfigError, match=r"low > high at position 1 \(0.6 > 0.5\)"):
        band_share(values, [0.4, 0.6, 0.8, 0.4], high)


def test_exchangeable_inside_share():
    assert exchangeable_inside_share(5) == pytest.approx(4 / 6)
    assert exchangeable_inside_share(2) == pytest.approx(1 / 3)
    # A check by simulation: one draw among k + 1 iid curves lies inside the others' min-max band.
    rng = np.random.default_rng(0)
    draws = rng.normal(size=(20000, 6))
    inside = np.mean((draws[:, 0] >= draws[:, 1:].min(axis=1)) & (draws[:, 0] <= draws[:, 1:].max(axis=1)))
    assert inside == pytest.approx(exchangeable_inside_share(5), abs=0.01)
    with pytest.raises(ConfigError, match="at least 2 curves"):
        exchangeable_inside_share(1)


def test_lag1_autocorrelation():
    assert lag1_autocorrelation([1, 2, 3, 4, 5]) == pytest.approx(1.0)
    assert lag1_autocorrelation([1, -1, 1, -1, 1, -1]) == pytest.approx(-1.0)
    # x[:-1] = [0, 1, 0, 0], x[1:] = [1, 0, 0, 1]: means 1/4 and 1/2, covariance sum -1/2, r = -1/sqrt(3)
    assert lag1_autocorrelation([0, 1, 0, 0, 1]) == pytest.approx(-1 / math.sqrt(3))
    assert math.isnan(lag1_autocorrelation([0.5, 0.5, 0.5]))  # a device always at the same s
    assert math.isnan(lag1_autocorrelation([1, 2]))


def test_mean_pairwise_correlation():
    together = [[1, 2, 1], [0, 1, 0], [1, 2, 1], [0, 0, 0]]  # devices 0 and 1 move together; 2 = device 0
    # r(0, 1) = r(2, 1): deviations (1, -1, 1, -1) / 2 and (3, -1, 3, -5) / 4, covariance sum 3/2 over
    # sqrt(1 x 11/4), so 3 / sqrt(11); r(0, 2) = 1
    assert mean_pairwise_correlation(together) == pytest.approx((2 * 3 / math.sqrt(11) + 1) / 3)
    # A constant column (a device always at E) has no correlation and is left out.
    assert mean_pairwise_correlation([[1, 5, 1], [0, 5, 1], [1, 5, 0]]) == pytest.approx(-0.5)
    assert math.isnan(mean_pairwise_correlation([[1, 5], [0, 5]]))
    with pytest.raises(ConfigError, match="shape"):
        mean_pairwise_correlation([1, 2, 3])

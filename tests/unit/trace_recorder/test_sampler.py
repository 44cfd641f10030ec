"""The trace sampler: fraction -> s, assignment to the first |T| traces, i.i.d. vs replay, pure per round."""

import itertools

import numpy as np
import pytest

from flexfl.errors import ConfigError
from trace_recorder.format import Trace
from trace_recorder.sampler import TraceSampler, assign_traces, fraction_to_updates


def _trace(name, fractions):
    return Trace(name=name, round=np.arange(len(fractions)), fraction=np.array(fractions, dtype=np.float64))


def test_fraction_to_updates_rules():
    f = np.array([0.0, 0.05, 0.35, 0.349, 0.5, 0.974, 1.0])
    np.testing.assert_array_equal(fraction_to_updates(f, E=20, rule="round"), [0, 1, 7, 7, 10, 19, 20])
    np.testing.assert_array_equal(fraction_to_updates(f, E=20, rule="floor"), [0, 1, 7, 6, 10, 19, 20])
    # Exact k/E values survive float error (0.35 * 20 = 6.999999...).
    assert fraction_to_updates(np.array([7 / 20]), E=20, rule="floor")[0] == 7
    with pytest.raises(ConfigError, match=r"0..1"):
        fraction_to_updates(np.array([1.2]), E=5)
    with pytest.raises(ConfigError, match="rule"):
        fraction_to_updates(np.array([0.2]), E=5, rule="ceil")


def test_assignment_uses_only_the_first_traces_uniformly_and_is_seeded():
    a = assign_traces(400, n_traces=2, seed=3)
    assert set(a.tolist()) == {0, 1} and 0.4 < np.mean(a == 0) < 0.6
    assert np.array_equal(a, assign_traces(400, n_traces=2, seed=3))
    assert not np.array_equal(a, assign_traces(400, n_traces=2, seed=4))
    # A prefix of the fleet gets the same traces whatever the fleet's size (a live run of
    # N devices and a simulation of N devices agree device by device).
    assert np.array_equal(assign_traces(10, n_traces=2, seed=3), a[:10])


def test_draws_come_from_the_trace_and_are_a_pure_function_of_seed_device_round():
    trace = _trace("b", [0.5, 0.25, 1.0])
    s = TraceSampler(trace, E=4, seed=9, device_index=2)
    draws = [s.draw(t) for t in range(1, 200)]
    assert set(draws) == {2, 1, 4}
    # Same (seed, device, round) -> same s, in any order and from a fresh sampler.
    again = TraceSampler(trace, E=4, seed=9, device_index=2)
    assert [again.draw(t) for t in reversed(range(1, 200))] == draws[::-1]
    other_device = TraceSampler(trace, E=4, seed=9, device_index=3)
    other_seed = TraceSampler(trace, E=4, seed=10, device_index=2)
    assert [other_device.draw(t) for t in range(1, 200)] != draws
    assert [other_seed.draw(t) for t in range(1, 200)] != draws


def test_replay_walks_the_trace_in_order_from_a_per_device_offset():
    trace = _trace("x", [0.25, 0.5, 0.75, 1.0])
    for device in range(3):
        s = TraceSampler(trace, E=4, seed=1, device_index=device, sampling="replay")
        seq = [s.draw(t) for t in range(1, 9)]
        assert all((b - a) % 4 == 1 for a, b in itertools.pairwise(seq))


def test_bad_sampler_config():
    with pytest.raises(ConfigError, match="sampling"):
        TraceSampler(_trace("x", [1.0]), E=2, seed=0, device_index=0, sampling="shuffled")
    with pytest.raises(ConfigError, match="n_traces"):
        assign_traces(2, n_traces=0, seed=0)

"""Trace-driven participation: fraction -> s, assignment to the first |T| traces, i.i.d. vs replay."""

import numpy as np
import pytest

from flexfl.errors import ConfigError
from simulator.participation import TraceParticipation
from trace_recorder.replay import fraction_to_updates
from trace_recorder.format import Trace


def _trace(name, fractions):
    return Trace(name=name, round=np.arange(len(fractions)), fraction=np.array(fractions, dtype=np.float64))


def test_fraction_to_updates_rules():
    f = np.array([0.0, 0.05, 0.35, 0.349, 0.5, 0.974, 1.0])
    np.testing.assert_array_equal(fraction_to_updates(f, E=20, rule="round"), [0, 1, 7, 7, 10, 19, 20])
    np.testing.assert_array_equal(fraction_to_updates(f, E=20, rule="floor"), [0, 1, 7, 6, 10, 19, 20])
    # Exact k/E values survive float error (0.35 * 20 = 6.999999...).
    assert fraction_to_updates(np.array([7 / 20]), E=20, rule="floor")[0] == 7
    with pytest.raises(ConfigError, match="0..1"):
        fraction_to_updates(np.array([1.2]), E=5)
    with pytest.raises(ConfigError, match="rule"):
        fraction_to_updates(np.array([0.2]), E=5, rule="ceil")


def test_devices_use_only_the_first_traces_and_draws_come_from_them():
    traces = [_trace("a", [1.0] * 10), _trace("b", [0.5, 0.25]), _trace("c", [0.0, 0.75])]
    part = TraceParticipation(traces[:2], n_devices=200, E=4, seed=3)
    assert set(part.trace_names) == {"a", "b"}
    for tau in range(1, 30):
        s = part.draw(tau)
        for name, sk in zip(part.trace_names, s):
            assert sk in ({4} if name == "a" else {2, 1})
    # Roughly uniform assignment over the allowed traces.
    share_a = np.mean(np.array(part.trace_names) == "a")
    assert 0.35 < share_a < 0.65


def test_iid_sampling_is_seeded_and_replay_walks_in_order():
    traces = [_trace("x", [0.25, 0.5, 0.75, 1.0])]
    p1 = TraceParticipation(traces, n_devices=5, E=4, seed=9)
    p2 = TraceParticipation(traces, n_devices=5, E=4, seed=9)
    p3 = TraceParticipation(traces, n_devices=5, E=4, seed=10)
    draws1 = np.stack([p1.draw(t) for t in range(1, 50)])
    assert np.array_equal(draws1, np.stack([p2.draw(t) for t in range(1, 50)]))
    assert not np.array_equal(draws1, np.stack([p3.draw(t) for t in range(1, 50)]))
    replay = TraceParticipation(traces, n_devices=3, E=4, seed=1, sampling="replay")
    seq = np.stack([replay.draw(t) for t in range(1, 9)])  # [rounds, devices]
    for k in range(3):
        # Each device cycles 1,2,3,4 from its own offset.
        assert all((seq[t + 1, k] - seq[t, k]) % 4 == 1 for t in range(7))


def test_bad_participation_config():
    with pytest.raises(ConfigError, match="sampling"):
        TraceParticipation([_trace("x", [1.0])], n_devices=2, E=2, seed=0, sampling="shuffled")
    with pytest.raises(ConfigError, match="no traces"):
        TraceParticipation([], n_devices=2, E=2, seed=0)

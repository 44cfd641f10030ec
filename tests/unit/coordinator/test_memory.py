"""The per-device update memory: the running sum gives the term the stacked memories give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.rules.memory import UpdateMemory
from flexfl.errors import AggregationError


def test_the_running_sum_after_replacements_and_departures_is_the_stacked_memories_sum():
    like = {"w": torch.zeros(3, 2), "b": torch.zeros(2)}
    memory = UpdateMemory(like=like)
    n = {"a": 10, "b": 30, "c": 20, "d": 40}
    rng = np.random.default_rng(1)
    # 40 replacements in arbitrary order (a device's old update must leave the sum), two forgotten
    for step in range(40):
        device = "abcd"[rng.integers(4)]
        memory.replace(device, n_samples=n[device], scale=float(rng.uniform(0.5, 8)),
                       update={name: rng.normal(size=w.shape).astype(np.float32) for name, w in like.items()})
        if step in (17, 31):
            memory.forget("b")
    memory.keep_only({"a", "c", "d"})
    total = sum(n.values())
    p = {d: k / total for d, k in n.items()}
    p["c"] *= 3.0  # a fast-reboot boost: its p is not its n / n
    running, stacked = memory.term(p=p, n_total=total), memory.stacked_term(p=p)
    assert set(memory.memories) <= {"a", "c", "d"} and "c" in memory.memories
    for name in like:
        torch.testing.assert_close(running[name], stacked[name], rtol=1e-5, atol=1e-6)
    oracle = sum(p[d] * memory.memories[d]["w"].double() for d in memory.memories).float()
    torch.testing.assert_close(running["w"], oracle, rtol=1e-5, atol=1e-6)


def test_a_malformed_update_is_refused_and_changes_nothing():
    memory = UpdateMemory(like={"w": torch.zeros(2)})
    memory.replace("a", n_samples=5, update={"w": np.ones(2, dtype=np.float32)}, scale=2.0)
    with pytest.raises(AggregationError, match=r"'a': tensor 'w' has shape \(3,\), expected \(2,\)"):
        memory.replace("a", n_samples=5, update={"w": np.ones(3, dtype=np.float32)}, scale=1.0)
    with pytest.raises(AggregationError, match="not finite"):
        memory.replace("a", n_samples=5, update={"w": np.array([1.0, np.nan], dtype=np.float32)}, scale=1.0)
    with pytest.raises(AggregationError, match=r"no weight given for the memories of \['a'\]"):
        memory.term(p={}, n_total=5)
    torch.testing.assert_close(memory.term(p={"a": 1.0}, n_total=5)["w"], torch.full((2,), 2.0))

"""FedBuff's server buffer (coordinator.rules.buffer): the step's formula, summed on arrival, and what it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from coordinator.rules.buffer import ServerBuffer
from coordinator.rules.strategies import configured
from flexfl.errors import AggregationError

E = 4


def model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g)}


def delta(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g)}


def test_a_step_is_w_plus_the_staleness_weighted_mean_of_the_buffer() -> None:
    rule = configured("fedbuff", {"buffer": 3, "server_lr": 0.5, "es_factor": True})
    server = ServerBuffer(rule, params=model(), E=E)
    start = {k: v.clone() for k, v in server.params.items()}
    server.take("a", s=E, pulled=0, delta=delta(1))
    server.take("b", s=E, pulled=0, delta=delta(2))
    server.take("c", s=E, pulled=0, delta=delta(3))
    first = server.step()
    assert first.step == 1 and [u.staleness for u in first.updates] == [0, 0, 0]
    expected = {k: start[k] + 0.5 / 3 * (delta(1)[k] + delta(2)[k] + delta(3)[k]) for k in start}
    for k in start:
        torch.testing.assert_close(server.params[k], expected[k])
    after_one = {k: v.clone() for k, v in server.params.items()}
    # Second buffer: one stale update (pulled at step 0), one cut short (s = 2 of 4: E / s = 2), one with nothing.
    server.take("a", s=E, pulled=0, delta=delta(4))
    server.take("b", s=2, pulled=1, delta=delta(5))
    nothing = server.take("c", s=0, pulled=1, delta={})
    second = server.step()
    assert [(u.device, u.staleness) for u in second.updates] == [("a", 1), ("b", 0), ("c", 0)]
    assert [u.p for u in second.updates] == pytest.approx([1 / math.sqrt(2), 1.0, 1.0])
    assert [u.coefficient for u in second.updates] == pytest.approx([0.5 / 3 / math.sqrt(2), 0.5 / 3 * 2, 0.0])
    assert nothing.coefficient == 0
    for k in start:
        torch.testing.assert_close(server.params[k], after_one[k] + 0.5 / 3 / math.sqrt(2) * delta(4)[k]
                                   + 0.5 / 3 * 2 * delta(5)[k])
    assert server.steps == 2 and not server.full


def test_what_the_buffer_refuses_changes_nothing() -> None:
    rule = configured("fedbuff", {"buffer": 2})
    server = ServerBuffer(rule, params=model(), E=E)
    server.take("a", s=E, pulled=0, delta=delta(1))
    bad_shape = {"w": torch.zeros(2, 3), "b": torch.zeros(2)}
    nan = {"w": torch.full((3, 2), float("nan")), "b": torch.zeros(2)}
    for kwargs, message in (
        ({"s": E + 1, "pulled": 0, "delta": delta(2)}, "outside 0..E"),
        ({"s": E, "pulled": 1, "delta": delta(2)}, "pulled at server step 1; the server has taken 0"),
        ({"s": E, "pulled": 0, "delta": bad_shape}, "tensor 'w' has shape \\(2, 3\\), the model \\(3, 2\\)"),
        ({"s": E, "pulled": 0, "delta": nan}, "tensor 'w' is not finite"),
        ({"s": E, "pulled": 0, "delta": {"w": torch.zeros(3, 2)}}, "has tensors \\['w'\\]"),
    ):
        with pytest.raises(AggregationError, match=message):
            server.take("b", **kwargs)
    assert not server.full  # none of them entered
    with pytest.raises(AggregationError, match="needs 2 buffered updates, there are 1"):
        server.step()
    server.take("b", s=E, pulled=0, delta=delta(2))
    with pytest.raises(AggregationError, match="holds its 2 updates"):
        server.take("c", s=E, pulled=0, delta=delta(3))
    start = model()
    server.step()
    for k in start:
        torch.testing.assert_close(server.params[k], start[k] + (delta(1)[k] + delta(2)[k]) / 2)

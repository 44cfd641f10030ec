"""The 'no learning-rate restart' diagnostic (issue 33 item 12): eta_0 / tau kept through an objective shift."""

from __future__ import annotations

import pytest
import torch

from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Federation


def _rates(*, lr_restart: bool) -> list[float]:
    fed = Federation(rules=RulesConfig(required_updates=4, eta0=1.0, lr_restart=lr_restart), dataset="synthetic",
                     params={"w": torch.zeros(2)})
    fed.apply_events(arrivals=[Arrival("a", 10)])
    rates = []
    for tau in range(1, 6):
        rates.append(fed.open(tau).lr)
        fed.close_stacked(fed.weigh(tau, {"a": 4}), deltas={"w": torch.zeros(1, 2)}, rows=["a"],
                  arrivals=[Arrival("b", 10)] if tau == 2 else [])  # the objective shifts at round 2's close
    assert fed.objective.shift_round == 2
    return rates


def test_the_paper_rule_restarts_the_rate_after_a_shift_and_the_diagnostic_does_not() -> None:
    assert _rates(lr_restart=True) == pytest.approx([1, 1 / 2, 1, 1 / 2, 1 / 3])  # eta_0 / (tau - tau_0)
    assert _rates(lr_restart=False) == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5])  # eta_0 / tau
    assert RulesConfig().lr_restart is True  # the paper's rule is the default


def test_the_switch_is_written_only_when_off_so_saved_configs_stay_equal() -> None:
    from flexfl.config import from_dict, to_dict

    assert "lr_restart" not in to_dict(RulesConfig())  # every run saved before the switch reads back byte-equal
    off = RulesConfig(lr_restart=False)
    assert to_dict(off)["lr_restart"] is False
    assert from_dict(RulesConfig, to_dict(off)) == off

"""The [rules] flags shared by `flexfl coordinator`, `flexfl sim` and `flexfl live`."""

import argparse

import pytest

from coordinator.cli import add_rules_flags
from coordinator.round import RulesConfig
from flexfl.config import overrides_from_args


def _rules(*argv: str) -> RulesConfig:
    p = argparse.ArgumentParser()
    add_rules_flags(p)
    return RulesConfig(**overrides_from_args(p.parse_args(list(argv))).get("rules", {}))


def test_every_departure_policy_and_its_constant_can_be_given_as_flags():
    assert _rules("--departure-policy", "threshold", "--threshold-k", "30") == RulesConfig(
        departure_policy="threshold", threshold_k=30.0)
    assert _rules("--departure-policy", "auto", "--auto-c", "2.5") == RulesConfig(departure_policy="auto", auto_c=2.5)
    assert _rules() == RulesConfig()
    with pytest.raises(SystemExit):
        _rules("--departure-policy", "sometimes")

"""The one exception -> status table: errors reach devices by kind (state, bad input, identity)."""

from __future__ import annotations

import grpc
import pytest
import torch
from flexfl.proto.options import ErrorReason

from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Federation
from coordinator.status import ERRORS, status_of
from flexfl.errors import ConfigError, FlexFLError, PartitionMismatch, RoundStateError, UpdateRejected, WrongRoundState

STATE = (grpc.StatusCode.FAILED_PRECONDITION, ErrorReason.WRONG_ROUND_STATE)


def test_a_round_state_error_is_failed_precondition_not_invalid_argument():
    fed = Federation(rules=RulesConfig(), dataset="synthetic", params={"w": torch.zeros(2)})
    with pytest.raises(RoundStateError, match="round 3 cannot open after round 0") as opened:
        fed.open(3)
    assert not isinstance(opened.value, ConfigError)  # a state, not configuration
    assert status_of(opened.value) == STATE
    # A refused update that is a state error (stale, duplicate, late) is both; the state decides.
    assert status_of(WrongRoundState("round 1 is not open")) == STATE
    assert status_of(UpdateRejected("NaN")) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.UPDATE_REJECTED)
    assert status_of(ConfigError("bad")) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_ARGUMENT)
    assert status_of(PartitionMismatch("other data"))[0] == grpc.StatusCode.FAILED_PRECONDITION


def test_every_mapped_class_is_a_flexfl_error_and_other_exceptions_are_not_refusals():
    assert all(issubclass(cls, FlexFLError) for cls in ERRORS)
    assert status_of(ValueError("x")) is None

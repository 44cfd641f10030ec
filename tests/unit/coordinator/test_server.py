"""The servicer's wire -> record conversions that are more than a field copy: the update's stop reason."""

from __future__ import annotations

from flexfl.proto import fleet_pb2 as pb

from coordinator.server import stop_reason
from edge_agent.agent import wire_stop_reason
from edge_agent.deadline import AGENT_REASONS, StopReason


def test_every_reason_an_agent_sends_arrives_as_itself() -> None:
    assert {stop_reason(wire_stop_reason(why)) for why in AGENT_REASONS} == set(AGENT_REASONS)
    # The wire has a value for the agent's reasons and for "not said", and no other (the coordinator's are its own).
    named = {pb.StopReason.Name(v).removeprefix("STOP_REASON_") for v in pb.StopReason.values()}
    assert named == {why.name for why in AGENT_REASONS} | {"UNSPECIFIED"}


def test_an_update_without_a_reason_or_with_one_this_coordinator_does_not_know_is_taken_as_unknown() -> None:
    older = pb.UpdateHeader(device_id="d", round_id=1, updates_completed=3)  # an agent from before the field
    assert stop_reason(older.stop_reason) is StopReason.UNKNOWN
    newer = pb.UpdateHeader.FromString(pb.UpdateHeader(stop_reason=42).SerializeToString())  # open enum: kept as 42
    assert newer.stop_reason == 42 and stop_reason(newer.stop_reason) is StopReason.UNKNOWN

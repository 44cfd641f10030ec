"""The servicer's wire -> record conversions that are more than a field copy: the update's stop reason."""

from __future__ import annotations

from flexfl.proto import fleet_pb2 as pb

from coordinator.uploading import stop_reason
from edge_agent.transport import wire_stop_reason
from flexfl.vocabulary import AGENT_REASONS, StopReason


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


def test_a_turn_is_handed_back_at_the_end_or_after_its_hold_time_whichever_comes_first() -> None:
    import asyncio

    from coordinator.turns import Turn

    async def scenario() -> list[str]:
        turns = asyncio.Semaphore(1)
        seen = []

        async def stalled() -> None:  # holds its slot far longer than hold_s
            async with Turn(turns, hold_s=0.05):
                seen.append("stalled in")
                await asyncio.sleep(0.5)
            seen.append("stalled out")

        async def waiting() -> None:
            await asyncio.sleep(0.01)
            async with Turn(turns, hold_s=10.0):
                seen.append("waiting in")
            seen.append("waiting out")

        await asyncio.gather(stalled(), waiting())
        assert not turns.locked() and turns._value == 1  # every turn handed back exactly once
        return seen

    assert asyncio.run(scenario()) == ["stalled in", "waiting in", "waiting out", "stalled out"]


def test_pre_serialised_messages_pass_the_response_serializers_as_they_are() -> None:
    import grpc

    from coordinator.server import add_servicer

    class Server:
        def __init__(self) -> None:
            self.by_name = {}

        def add_generic_rpc_handlers(self, handlers) -> None:
            self.generic = handlers

        def add_registered_method_handlers(self, service, handlers) -> None:
            self.by_name = handlers

    from flexfl.proto import fleet_pb2_grpc as pb_grpc

    target = Server()
    add_servicer(pb_grpc.FleetServicer(), target)
    session = target.by_name["Session"]
    chunk = pb.RoundChunk(data=b"\x01\x02")
    assert session.response_serializer(chunk.SerializeToString()) == chunk.SerializeToString()
    assert session.response_serializer(chunk) == chunk.SerializeToString()  # messages are still serialised
    assert set(target.by_name) == {"Join", "Leave", "PullRound", "PushUpdate", "Session", "Status", "SendLog"}
    assert isinstance(target.generic[0], grpc.GenericRpcHandler)

"""The Session stream (PullRound and PushUpdate on one call): bad input ends it with PushUpdate's
status and changes nothing; agents fall back to per-round calls against a coordinator without it."""

from __future__ import annotations

import asyncio
import queue

import grpc
import numpy as np
import pytest
import torch
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, error_reason

from coordinator import offering, server, uploading
from coordinator.turns import Turn
from edge_agent.agent import AgentError, EdgeAgent
from edge_agent.config import ParticipationConfig

from .conftest import make_config
from .test_bad_input import TOKEN, _bad_variants, _update


class RawSession:
    """A hand-driven Session call (to send what agents never would); reads raise grpc.RpcError."""

    def __init__(self, port: int, device_id: str) -> None:
        self.device_id = device_id
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.FleetStub(self.channel)
        self.md = [(AUTH_HEADER, f"Bearer {TOKEN}"), (DEVICE_HEADER, device_id)]
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.call = None

    def join(self) -> None:
        self.stub.Join(pb.JoinRequest(device_id=self.device_id, sample_count=100, protocol_version=1),
                       metadata=self.md, timeout=5)

    def open(self, *first: pb.UpdateChunk) -> None:
        for message in first or (pb.UpdateChunk(pull=pb.PullRequest(device_id=self.device_id, wait_s=5)),):
            self.outbox.put(message)
        self.call = self.stub.Session(iter(self.outbox.get, None), metadata=self.md, timeout=30)

    def read(self) -> pb.RoundChunk:
        return next(self.call)

    def pull(self) -> tuple[pb.RoundHeader, dict[str, np.ndarray]]:
        header = self.read().header
        assert header.status == pb.RoundHeader.ROUND, header
        data = b""
        while len(data) < header.payload.total_bytes:
            data += self.read().data
        return header, wire.decode(header.payload, data)

    def send(self, *messages: pb.UpdateChunk, close: bool = False) -> None:
        for m in messages:
            self.outbox.put(m)
        if close:
            self.outbox.put(None)  # half-close: the coordinator sees the end of the stream

    def push(self, header: pb.UpdateHeader, data: bytes) -> pb.PushReply:
        """The update, then the end of this side of the stream; the coordinator's reply (or its error)."""
        self.send(pb.UpdateChunk(header=header), *(pb.UpdateChunk(data=p) for p in wire.chunks(data) if data),
                  close=True)
        return self.read().reply

    def close(self) -> None:
        self.outbox.put(None)
        if self.call is not None:
            self.call.cancel()
        self.channel.close()


def test_bad_updates_end_the_session_with_pushupdates_status_and_change_nothing(live_config, fleet_factory):
    # The variants of test_bad_input (one device each, as a refusal ends its session), and
    # what only a stream can get wrong.
    probe = {"w": np.zeros(1, np.float32)}
    labels = [*_bad_variants(pb.RoundHeader(round_id=1), probe), "update before the model", "data before the pull",
              "data for a header", "pull inside the data", "ends inside the payload"]
    fleet = fleet_factory(live_config(rounds=1, n_devices=len(labels) + 1, min_devices=len(labels) + 1,
                                      deadline_s=30.0))
    devices = {label: RawSession(fleet.port, f"dev-{i}") for i, label in enumerate(labels)}
    good = RawSession(fleet.port, "good")
    try:
        for dev in [*devices.values(), good]:
            dev.join()
        for label, dev in devices.items():
            if label == "update before the model":
                dev.open(pb.UpdateChunk(header=pb.UpdateHeader(device_id=dev.device_id, round_id=1)))
            elif label == "data before the pull":
                dev.open(pb.UpdateChunk(data=b"x" * 10))
            else:
                dev.open()
        good.open()
        header, model = good.pull()
        engine = fleet.coordinator.engine
        before = {n: p.clone() for n, p in engine.params.items()}
        variants = _bad_variants(header, model)
        zero = {n: np.zeros_like(v) for n, v in model.items()}
        for label, dev in devices.items():
            with pytest.raises(grpc.RpcError) as err:
                if label in variants:
                    dev.pull()
                    (shared, d), code, fragment = variants[label]
                    h = pb.UpdateHeader()
                    h.CopyFrom(shared)  # variants share headers
                    if h.device_id == "evil":
                        h.device_id = dev.device_id
                    fragment = fragment.replace("'evil'", repr(dev.device_id))
                    dev.push(h, d)
                elif label == "update before the model":  # a session may open with an update: of a round it has
                    code = grpc.StatusCode.FAILED_PRECONDITION
                    fragment = f"device {dev.device_id!r} has not received round 1's model"
                    dev.read()
                elif label == "data before the pull":
                    code = grpc.StatusCode.INVALID_ARGUMENT
                    fragment = "first message must be a pull request or an update's header, not data"
                    dev.read()
                else:
                    dev.pull()
                    h, d = _update(dev.device_id, header.round_id, zero)
                    if label == "data for a header":
                        code, fragment = grpc.StatusCode.INVALID_ARGUMENT, "expected the update's header, got data"
                        dev.send(pb.UpdateChunk(data=d))
                    elif label == "pull inside the data":
                        code = grpc.StatusCode.INVALID_ARGUMENT
                        fragment = "a pull message arrived inside the update's data"
                        dev.send(pb.UpdateChunk(header=h), pb.UpdateChunk(pull=pb.PullRequest()))
                    else:
                        code = grpc.StatusCode.INVALID_ARGUMENT
                        fragment = f"stream ended after 100 of the update's {len(d)} bytes"
                        dev.send(pb.UpdateChunk(header=h), pb.UpdateChunk(data=d[:100]), close=True)
                    dev.read()
            assert err.value.code() == code, (label, err.value.details())
            assert fragment in err.value.details(), (label, err.value.details())
            assert error_reason(err.value), label  # the machine-readable reason travels as on PushUpdate
            assert engine.current is not None and not engine.current.closed, f"{label} closed the round"
            assert dev.device_id not in engine.current.updates, label
            for n, p in engine.params.items():
                assert torch.equal(p, before[n]), label
        # The refused devices' rounds are lost (their sessions are gone); a valid update still counts.
        reply = good.push(*_update("good", header.round_id, {n: np.full_like(v, 0.01) for n, v in model.items()},
                                   s=header.required_updates))
        assert reply.accepted and reply.round_id == header.round_id
        assert "good" in engine.current.updates
        # Every refusal of an update for the open round is in its row; stale and future ones name other rounds.
        rejected = engine.current.rejected
        assert set(rejected) == {d.device_id for label, d in devices.items()
                                 if label not in ("stale round", "future round", "data before the pull")}
    finally:
        for dev in [*devices.values(), good]:
            dev.close()


def _train(fleet, n: int) -> tuple[list[EdgeAgent], dict[str, torch.Tensor]]:
    # Ragged s, fixed per device and round, so that both runs train the same model.
    schedules = [tuple((i + r) % 5 + 1 for r in range(3)) for i in range(n)]
    agents = [fleet.start_agent(i, participation=ParticipationConfig(forced_updates=s))
              for i, s in enumerate(schedules)]
    assert fleet.coordinator.wait(timeout=120)
    return agents, {k: v.clone() for k, v in fleet.coordinator.engine.params.items()}


def test_agents_fall_back_to_per_round_calls_and_train_the_same_model(tmp_path, fleet_factory, monkeypatch):
    cfg = dict(rounds=3, n_devices=3, min_devices=3, deadline_s=60.0)
    agents, on_session = _train(fleet_factory(make_config(tmp_path / "session", **cfg)), 3)
    assert not any(a.per_round_calls for a in agents)
    assert all(r.outcome.endswith("accepted") for a in agents for r in a.rounds_done)

    async def unimplemented(self, request_iterator, context):  # a coordinator from before Session
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield  # pragma: no cover

    monkeypatch.setattr(server.FleetServicer, "Session", unimplemented)
    agents, per_round = _train(fleet_factory(make_config(tmp_path / "per-round", **cfg)), 3)
    assert all(a.per_round_calls for a in agents)
    assert [len(a.rounds_done) for a in agents] == [3, 3, 3]
    for name in on_session:  # updates are summed in arrival order: equal up to float32 rounding
        torch.testing.assert_close(per_round[name], on_session[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_silent_session_times_out_like_the_call_it_replaces(live_config, fleet_factory, monkeypatch):
    """A coordinator that accepts the stream and then says nothing (not even WAIT) does not hold
    the agent: the wait is bounded by pull_wait_s + rpc_timeout_s, as a PullRound's was."""

    async def silent(self, request_iterator, context):
        await asyncio.sleep(3600)
        yield  # pragma: no cover

    monkeypatch.setattr(server.FleetServicer, "Session", silent)
    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=1))
    agent = EdgeAgent(fleet.agent_config(0, rpc_timeout_s=0.5, give_up_after_s=2.5))  # pull_wait_s 0.5: 1 s per try
    with pytest.raises(AgentError, match=r"gave up after \d+ s .* pull to coordinator .* keeps failing: no answer "
                                         r"within the call's time limit \(the coordinator sent no header on the "
                                         r"session stream for 1 s\)"):
        agent.run()


def test_uploads_take_turns_and_a_stalled_upload_gives_its_turn_back(live_config, fleet_factory, monkeypatch):
    """With one update read at a time (coordinator.uploading.UPLOADS_AT_ONCE = 1), a device that sends
    its update's header and then stalls keeps the other's update waiting, until either it goes on
    or its turn is handed back (UPLOAD_TURN_S); both updates are taken."""
    import threading

    monkeypatch.setattr(uploading, "UPLOADS_AT_ONCE", 1)
    monkeypatch.setattr(uploading, "UPLOAD_TURN_S", 1.0)
    taken = threading.Semaphore(0)  # released each time a turn (offer or upload) is taken

    class SeenTurn(Turn):
        async def __aenter__(self):
            turn = await super().__aenter__()
            taken.release()
            return turn

    monkeypatch.setattr(offering, "Turn", SeenTurn)
    monkeypatch.setattr(uploading, "Turn", SeenTurn)
    fleet = fleet_factory(live_config(rounds=2, n_devices=2, min_devices=2, deadline_s=120.0))
    stalled, other = RawSession(fleet.port, "dev-0"), RawSession(fleet.port, "dev-1")
    try:
        for dev in (stalled, other):
            dev.join()
            dev.open()
        updates = {}
        for dev in (stalled, other):
            header, model = dev.pull()
            updates[dev] = _update(dev.device_id, header.round_id, {n: np.zeros_like(v) for n, v in model.items()})
        assert taken.acquire(timeout=10) and taken.acquire(timeout=10)  # the two offers' turns
        (h, data) = updates[stalled]
        stalled.send(pb.UpdateChunk(header=h))
        assert taken.acquire(timeout=10)  # its upload's turn taken; no data yet
        replies: dict[str, pb.PushReply] = {}
        pushing = threading.Thread(target=lambda: replies.setdefault("other", other.push(*updates[other])))
        pushing.start()
        pushing.join(timeout=0.3)
        assert pushing.is_alive() and not replies  # waiting for the stalled device's turn
        pushing.join(timeout=30)  # the turn comes back after UPLOAD_TURN_S, the stalled upload still open
        assert replies["other"].accepted
        stalled.send(*(pb.UpdateChunk(data=p) for p in wire.chunks(data)), close=True)
        assert stalled.read().reply.accepted
    finally:
        stalled.close()
        other.close()


def test_offers_take_turns_and_every_device_gets_the_same_model(live_config, fleet_factory, monkeypatch):
    """With one offer at a time (coordinator.offering.OFFERS_AT_ONCE = 1), a device that takes the
    round's header and then reads nothing for a while does not keep the other from its model; both
    read the same model (serialised once per round, sent as the same bytes)."""
    monkeypatch.setattr(offering, "OFFERS_AT_ONCE", 1)
    fleet = fleet_factory(live_config(dataset="mnist", rounds=1, n_devices=2, min_devices=2, deadline_s=120.0))
    slow, reader = RawSession(fleet.port, "dev-0"), RawSession(fleet.port, "dev-1")
    try:
        for dev in (slow, reader):
            dev.join()
        slow.open()
        header = slow.read().header  # then it reads nothing until the other has its model
        assert header.status == pb.RoundHeader.ROUND
        reader.open()
        _, model = reader.pull()
        data = b""
        while len(data) < header.payload.total_bytes:
            data += slow.read().data
        slow_model = wire.decode(header.payload, data)
        assert sorted(slow_model) == sorted(model) and model
        assert all(np.array_equal(slow_model[n], model[n]) for n in model)
    finally:
        slow.close()
        reader.close()

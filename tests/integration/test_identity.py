"""Identity and shards: one device id holds one shard and one live stream, its refused update may be
resent on a new Session, a call without a device says so, and every refusal counts in the round's row."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import AUTH_HEADER, error_reason

from coordinator.metrics import read_metrics

from .test_bad_input import TOKEN, RawDevice, _update
from .test_session import RawSession


def _join(dev: RawDevice, *, shard: int) -> pb.JoinReply:
    # sample_count 0: the device holds its shard without saying how many samples (benchmark agents do).
    return dev.stub.Join(pb.JoinRequest(device_id=dev.device_id, sample_count=0, protocol_version=1,
                                        shard_index=shard), metadata=dev.md, timeout=5)


def _zero(model: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: np.zeros_like(v) for n, v in model.items()}


def test_a_second_agent_with_the_same_device_id_and_another_shard_is_refused(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, n_devices=4, min_devices=1, deadline_s=30.0))
    running, twin = RawDevice(fleet.port, "pi-01"), RawDevice(fleet.port, "pi-01")
    try:
        assert _join(running, shard=1).device_index == 1
        with pytest.raises(grpc.RpcError) as err:
            _join(twin, shard=2)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert error_reason(err.value) == "device-conflict"
        assert "device 'pi-01' holds shard 1" in err.value.details() and "shard 2" in err.value.details()
        # The running device keeps its slot: its shard, and its rounds with that shard's seed index.
        assert fleet.coordinator.engine.registry.get("pi-01").shard_index == 1
        assert _join(running, shard=1).device_index == 1  # the same agent reconnecting is still welcome
        header, _ = running.pull()
        assert header.status == pb.RoundHeader.ROUND and header.device_index == 1
    finally:
        running.channel.close()
        twin.channel.close()


def test_a_device_holds_one_live_session_or_pull_at_a_time(live_config, fleet_factory, wait_for):
    # Two devices needed: the round waits for the second, so the first one's session stays parked.
    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=2, deadline_s=30.0))
    engine = fleet.coordinator.engine
    live, again, pull, other = (RawSession(fleet.port, "dev-0"), RawSession(fleet.port, "dev-0"),
                                RawDevice(fleet.port, "dev-0"), RawDevice(fleet.port, "dev-1"))
    try:
        live.join()
        live.open()
        wait_for(lambda: engine.parked() == 1, what="dev-0's session to park")
        again.open()
        with pytest.raises(grpc.RpcError) as err:
            again.read()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # agents retry it with backoff
        assert error_reason(err.value) == "device-busy"
        assert "device 'dev-0' already has a live Session or PullRound" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            pull.pull()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(err.value) == "device-busy"
        assert engine.parked() == 1
        other.join()
        header, model = live.pull()  # the round opens: the one live session gets the model, once
        wait_for(lambda: "dev-0" in engine.current.delivered, what="dev-0's model to be delivered")
        sent = engine.current.bytes_out["dev-0"]
        assert header.payload.total_bytes < sent < 2 * header.payload.total_bytes  # one model's messages
        # Once that stream ends, the device may open another (here, to send its update).
        live.close()
        again = RawSession(fleet.port, "dev-0")
        h, d = _update("dev-0", header.round_id, _zero(model), s=header.required_updates)

        def reopened() -> bool:
            session = RawSession(fleet.port, "dev-0")
            session.open(pb.UpdateChunk(header=h), *(pb.UpdateChunk(data=p) for p in wire.chunks(d)))
            try:
                return session.read().reply.accepted
            except grpc.RpcError as exc:  # the coordinator may not have seen the old stream's end yet
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
                return False
            finally:
                session.close()

        wait_for(reopened, what="a new session of dev-0 once the old one ended")
    finally:
        for d in (live, again, pull, other):
            d.close() if isinstance(d, RawSession) else d.channel.close()


def test_a_refused_update_can_be_resent_on_a_new_session_within_the_deadline(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=1, deadline_s=30.0))
    dev = RawSession(fleet.port, "dev-0")
    resend = RawSession(fleet.port, "dev-0")
    try:
        dev.join()
        dev.open()
        header, model = dev.pull()
        E = header.required_updates
        h, d = _update("dev-0", header.round_id, {n: np.full_like(v, 0.01) for n, v in model.items()}, s=E)
        corrupt = bytearray(d)
        corrupt[0] ^= 0xFF
        with pytest.raises(grpc.RpcError) as err:
            dev.push(h, bytes(corrupt))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "checksum" in err.value.details()
        # The same update, intact, as the first thing on a new session (as PushUpdate would take it).
        resend.open(pb.UpdateChunk(header=h), *(pb.UpdateChunk(data=p) for p in wire.chunks(d)))
        reply = resend.read().reply
        assert reply.accepted and reply.round_id == header.round_id, reply
        assert fleet.coordinator.wait(timeout=30)
        row = read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")[-1]
        assert row.s == {"dev-0": E}
        assert len(row.live.rejected["dev-0"]) == 1 and "checksum" in row.live.rejected["dev-0"][0]
    finally:
        dev.close()
        resend.close()


def test_a_call_without_a_device_says_so(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, min_devices=1))
    channel = grpc.insecure_channel(f"127.0.0.1:{fleet.port}")
    stub = pb_grpc.FleetStub(channel)
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.Status(pb.StatusRequest(), metadata=[(AUTH_HEADER, f"Bearer {TOKEN}")], timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_reason(err.value) == "missing-device"
        assert "x-flexfl-device" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:  # the token is checked first: a wrong one is still bad-token
            stub.Status(pb.StatusRequest(), metadata=[(AUTH_HEADER, "Bearer nope")], timeout=5)
        assert error_reason(err.value) == "bad-token"
    finally:
        channel.close()


def test_every_refusal_of_a_devices_upload_counts_in_the_rounds_rejected(live_config, fleet_factory):
    """On a Session: data or a pull where the update's header belongs, an update for another device;
    the same on PushUpdate; and a duplicate of an accepted update."""
    labels = ["data for the header", "pull for the header", "session: other device", "push: other device",
              "duplicate"]
    fleet = fleet_factory(live_config(rounds=1, n_devices=len(labels), min_devices=len(labels), deadline_s=30.0))
    sessions = {label: RawSession(fleet.port, f"dev-{i}") for i, label in enumerate(labels)}
    pushers = {label: RawDevice(fleet.port, f"dev-{i}") for i, label in enumerate(labels)}
    try:
        for s in sessions.values():
            s.join()
        rounds = {}
        for label, s in sessions.items():
            s.open()
            rounds[label] = s.pull()
        header, model = rounds[labels[0]]
        E = header.required_updates
        for label, s in sessions.items():
            dev = s.device_id
            expected = {"data for the header": "expected the update's header, got data",
                        "pull for the header": "expected the update's header, got pull",
                        "session: other device": f"update header for 'dev-0' from {dev!r}",
                        "push: other device": f"update header for 'dev-0' from {dev!r}",
                        "duplicate": f"device {dev!r} already sent its update for round 1"}[label]
            with pytest.raises(grpc.RpcError) as err:
                if label == "data for the header":
                    s.send(pb.UpdateChunk(data=b"x" * 10))
                    s.read()
                elif label == "pull for the header":
                    s.send(pb.UpdateChunk(pull=pb.PullRequest(device_id=dev)))
                    s.read()
                elif label == "session: other device":
                    s.push(*_update("dev-0", header.round_id, _zero(model)))
                elif label == "push: other device":
                    pushers[label].push(*_update("dev-0", header.round_id, _zero(model)))
                else:
                    assert s.push(*_update(dev, header.round_id, _zero(model), s=E)).accepted
                    pushers[label].push(*_update(dev, header.round_id, _zero(model), s=E))
            assert expected in err.value.details(), (label, err.value.details())
            rejected = fleet.coordinator.engine.current.rejected.get(dev, [])
            assert len(rejected) == 1 and expected in rejected[0], (label, rejected)
        for label, p in pushers.items():  # the others answer s = 0, so the round closes now
            if label != "duplicate":
                assert p.push(pb.UpdateHeader(device_id=p.device_id, round_id=header.round_id), b"").accepted
        assert fleet.coordinator.wait(timeout=30)
        row = read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")[-1]
        assert row.live.close_reason == "all answered"
        assert sorted(row.live.rejected) == sorted(s.device_id for s in sessions.values())
        assert row.s["dev-4"] == E  # a refused duplicate leaves the accepted update as it was
    finally:
        for label in labels:
            sessions[label].close()
            pushers[label].channel.close()

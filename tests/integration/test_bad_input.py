"""Malformed updates, wrong tokens and unknown devices are refused with the right status; nothing changes."""

from __future__ import annotations

import hashlib

import grpc
import numpy as np
import pytest
import torch
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, error_reason

from coordinator.metrics import read_metrics
from edge_agent.agent import AgentError, EdgeAgent
from workloads.partition_spec import PartitionSpec

from .conftest import with_server

TOKEN = "test-fleet-token"


class RawDevice:
    """A hand-driven client speaking the wire protocol directly (to send what agents never would)."""

    def __init__(self, port: int, device_id: str, token: str = TOKEN) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.FleetStub(self.channel)
        self.md = [(AUTH_HEADER, f"Bearer {token}"), (DEVICE_HEADER, device_id)]
        self.device_id = device_id

    def join(self, samples: int = 100) -> pb.JoinReply:
        return self.stub.Join(pb.JoinRequest(device_id=self.device_id, sample_count=samples, protocol_version=1),
                              metadata=self.md, timeout=5)

    def pull(self) -> tuple[pb.RoundHeader, dict[str, np.ndarray]]:
        stream = self.stub.PullRound(pb.PullRequest(device_id=self.device_id, after_round=0, wait_s=5),
                                     metadata=self.md, timeout=10)
        chunks = list(stream)
        header = chunks[0].header
        self.model_bytes = b"".join(c.data for c in chunks[1:])
        return header, wire.decode(header.payload, self.model_bytes)

    def push(self, header: pb.UpdateHeader, data: bytes) -> pb.PushReply:
        def gen():
            yield pb.UpdateChunk(header=header)
            for piece in wire.chunks(data):
                yield pb.UpdateChunk(data=piece)
        return self.stub.PushUpdate(gen(), metadata=self.md, timeout=5)


def _update(device_id, round_id, delta, *, s=3, payload=None, data=None):
    p, d = wire.encode(delta)
    return pb.UpdateHeader(device_id=device_id, round_id=round_id, updates_completed=s, samples_used=30,
                           train_s=0.1, local_loss=1.0, payload=payload or p), (d if data is None else data)


@pytest.fixture
def open_round(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=1, deadline_s=20.0))
    dev = RawDevice(fleet.port, "evil")
    dev.join()
    header, model = dev.pull()
    assert header.status == pb.RoundHeader.ROUND
    yield fleet, dev, header, model
    dev.channel.close()


def _bad_variants(header, model):
    zero = {n: np.zeros_like(v) for n, v in model.items()}
    name = next(iter(model))
    wrong_shape = dict(zero)
    wrong_shape[name] = np.zeros((*model[name].shape[:-1], model[name].shape[-1] + 1), dtype=np.float32)
    nan = {n: v.copy() for n, v in zero.items()}
    nan[name].flat[0] = np.nan
    h_ok, d_ok = _update("evil", header.round_id, zero)
    corrupt = bytearray(d_ok)
    corrupt[len(corrupt) // 2] ^= 0xFF
    missing = {n: v for n, v in zero.items() if n != name}
    h_bare, h_sha = pb.UpdateHeader(), pb.UpdateHeader()
    for h in (h_bare, h_sha):
        h.CopyFrom(h_ok)
        h.payload.ClearField("crc32")
    h_sha.payload.sha256 = hashlib.sha256(bytes(corrupt)).digest()[::-1]  # an agent before protocol 3, wrong
    return {
        "wrong shape": (_update("evil", header.round_id, wrong_shape), grpc.StatusCode.INVALID_ARGUMENT, "shape"),
        "NaN": (_update("evil", header.round_id, nan), grpc.StatusCode.INVALID_ARGUMENT, "non-finite"),
        "s > E": (_update("evil", header.round_id, zero, s=header.required_updates + 1),
                  grpc.StatusCode.INVALID_ARGUMENT, "outside 0..E"),
        "bad checksum": ((h_ok, bytes(corrupt)), grpc.StatusCode.INVALID_ARGUMENT, "checksum"),
        "no checksum": ((h_bare, d_ok), grpc.StatusCode.INVALID_ARGUMENT, "no checksum"),
        "bad SHA-256": ((h_sha, d_ok), grpc.StatusCode.INVALID_ARGUMENT, "checksum (SHA-256) mismatch"),
        "truncated": ((h_ok, d_ok[:-4]), grpc.StatusCode.INVALID_ARGUMENT, "bytes"),
        "missing tensor": (_update("evil", header.round_id, missing), grpc.StatusCode.INVALID_ARGUMENT, "missing"),
        "stale round": (_update("evil", header.round_id - 1, zero), grpc.StatusCode.FAILED_PRECONDITION, "not open"),
        "future round": (_update("evil", header.round_id + 5, zero), grpc.StatusCode.FAILED_PRECONDITION, "not open"),
        "other device": (_update("someone-else", header.round_id, zero), grpc.StatusCode.PERMISSION_DENIED,
                         "for 'someone-else' from 'evil'"),
    }


def test_malformed_updates_rejected_and_model_unchanged(open_round):
    fleet, dev, header, model = open_round
    engine = fleet.coordinator.engine
    before = {n: p.clone() for n, p in engine.params.items()}
    for label, ((h, d), code, fragment) in _bad_variants(header, model).items():
        with pytest.raises(grpc.RpcError) as err:
            dev.push(h, d)
        assert err.value.code() == code, label
        assert fragment in err.value.details(), (label, err.value.details())
        assert engine.current is not None and not engine.current.closed, f"{label} closed the round"
        assert "evil" not in engine.current.updates, label
        for n, p in engine.params.items():
            assert torch.equal(p, before[n]), label
    # After all that the device can still send a valid update, and only that moves the model.
    ones = {n: np.full_like(v, 0.01) for n, v in model.items()}
    reply = dev.push(*_update("evil", header.round_id, ones, s=header.required_updates))
    assert reply.accepted
    assert fleet.coordinator.wait(timeout=30)
    assert any(not torch.equal(engine.params[n], before[n]) for n in before)
    assert engine.completed_round == 1


def test_an_agent_before_protocol_3_checks_the_model_by_sha256_and_sends_only_that(open_round):
    """Protocol 3 moved payloads to CRC-32; the model still carries a SHA-256 for older agents, and
    their updates, with a SHA-256 alone, are checked by it and taken."""
    fleet, dev, header, model = open_round
    assert header.payload.HasField("crc32") and len(header.payload.sha256) == 32
    old_view = pb.Payload()
    old_view.CopyFrom(header.payload)
    old_view.ClearField("crc32")  # what an agent that does not know the field checks
    assert all(np.array_equal(v, model[n]) for n, v in wire.decode(old_view, dev.model_bytes).items())
    h, d = _update("evil", header.round_id, {n: np.full_like(v, 0.01) for n, v in model.items()},
                   s=header.required_updates)
    h.payload.ClearField("crc32")
    h.payload.sha256 = hashlib.sha256(d).digest()
    assert dev.push(h, d).accepted
    assert fleet.coordinator.wait(timeout=30)
    assert fleet.coordinator.engine.completed_round == 1


def test_duplicate_update_refused_while_the_round_is_open(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=2, deadline_s=20.0))
    first, second = RawDevice(fleet.port, "first"), RawDevice(fleet.port, "second")
    first.join()
    second.join()
    header, model = first.pull()
    second.pull()  # a second participant that has not answered keeps the round open
    zero = {n: np.zeros_like(v) for n, v in model.items()}
    assert first.push(*_update("first", header.round_id, zero)).accepted
    engine = fleet.coordinator.engine
    assert engine.current.round_id == header.round_id and not engine.current.closed  # the branch under test runs
    kept = engine.current.updates["first"]
    with pytest.raises(grpc.RpcError) as err:
        first.push(*_update("first", header.round_id, {n: np.ones_like(v) for n, v in model.items()}, s=1))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already sent its update for round 1" in err.value.details()
    assert error_reason(err.value) == "wrong-round-state"
    assert engine.current.updates["first"] is kept and not engine.current.closed
    for d in (first, second):
        d.channel.close()


def test_an_update_from_a_device_outside_the_open_round_is_a_state_error(live_config, fleet_factory):
    """A device that joined during round 1 trains from round 2: its update for round 1 is refused as
    the round's state (FAILED_PRECONDITION), not as bad input (INVALID_ARGUMENT)."""
    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=1, deadline_s=20.0))
    first, late = RawDevice(fleet.port, "first"), RawDevice(fleet.port, "late")
    first.join()
    header, model = first.pull()
    late.join()
    engine = fleet.coordinator.engine
    assert engine.current.round_id == header.round_id and not engine.current.closed  # the branch under test runs
    assert "late" in engine.registry and "late" not in engine.current.taking_part
    with pytest.raises(grpc.RpcError) as err:
        late.push(*_update("late", header.round_id, {n: np.zeros_like(v) for n, v in model.items()}))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err.value) == "wrong-round-state"
    assert f"device 'late' does not take part in round {header.round_id}" in err.value.details()
    assert "late" not in engine.current.updates and not engine.current.closed
    for d in (first, late):
        d.channel.close()


def test_partition_mismatch_is_refused_at_join_naming_both(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, n_devices=4, min_devices=1))
    dev = RawDevice(fleet.port, "dev-0")
    mine = PartitionSpec(dataset="mnist", n_devices=4)
    with pytest.raises(grpc.RpcError) as err:
        dev.stub.Join(pb.JoinRequest(device_id="dev-0", sample_count=0, protocol_version=1, shard_index=0,
                                     partition_json=mine.to_json()), metadata=dev.md, timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err.value) == "partition-mismatch"
    details = err.value.details()
    assert "[mnist non-IID, 4 devices, pareto sizes, seed 0]" in details
    assert "[synthetic(1,1) non-IID, 4 devices, 1600 samples, pareto sizes, seed 0]" in details
    assert "dataset: mnist vs synthetic" in details
    assert len(fleet.coordinator.engine.registry.devices) == 0
    dev.channel.close()


def test_an_agent_configured_with_another_partition_stops_with_both_named(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, n_devices=4, min_devices=1))
    cfg = fleet.agent_config(0, partition=PartitionSpec(dataset="synthetic", n_devices=4, total_samples=1600, seed=7))
    with pytest.raises(AgentError, match=r"seed 7\] differs from the coordinator's \[.*seed 0\].*seed: 7 vs 0"):
        EdgeAgent(cfg).run()
    assert len(fleet.coordinator.engine.registry.devices) == 0


def test_wrong_token_and_unknown_device_get_unauthenticated(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, min_devices=1))
    intruder = RawDevice(fleet.port, "dev-x", token="not-the-token")
    with pytest.raises(grpc.RpcError) as err:
        intruder.join()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "fleet token" in err.value.details()
    stranger = RawDevice(fleet.port, "never-joined")
    with pytest.raises(grpc.RpcError) as err:
        stranger.pull()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unknown device" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stranger.push(*_update("never-joined", 1, {"w": np.zeros(2, np.float32)}))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(fleet.coordinator.engine.registry.devices) == 0
    for d in (intruder, stranger):
        d.channel.close()


def test_oversized_update_rejected_before_it_is_buffered(live_config, fleet_factory):
    cfg = with_server(live_config(rounds=1, n_devices=2, min_devices=1, deadline_s=20.0),
                      max_update_mib=0.001)  # ~1 KB; the model is ~2.4 KB
    fleet = fleet_factory(cfg)
    dev = RawDevice(fleet.port, "big")
    dev.join()
    header, model = dev.pull()
    with pytest.raises(grpc.RpcError) as err:
        dev.push(*_update("big", header.round_id, {n: np.zeros_like(v) for n, v in model.items()}))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds the limit" in err.value.details()
    assert "big" not in fleet.coordinator.engine.current.updates
    dev.channel.close()


def _stream(header: pb.UpdateHeader, *, chunks: int, sent: list[int]):
    """The header, then `chunks` 1 MiB chunks made on demand; `sent` counts those gRPC took."""
    yield pb.UpdateChunk(header=header)
    piece = bytes(wire.MAX_CHUNK_BYTES)
    for _ in range(chunks):
        sent[0] += 1
        yield pb.UpdateChunk(data=piece)


@pytest.mark.parametrize("declared_mib", [1000, 0.5], ids=["declares 1000 MiB", "declares 0.5 MiB, sends 1000"])
def test_a_1000_mib_upload_is_refused_early_without_growing_memory(live_config, fleet_factory, declared_mib):
    import psutil

    cfg = with_server(live_config(rounds=1, n_devices=2, min_devices=1, deadline_s=60.0), max_update_mib=1.0)
    fleet = fleet_factory(cfg)
    dev = RawDevice(fleet.port, "big")
    dev.join()
    header, model = dev.pull()
    h, _ = _update("big", header.round_id, {n: np.zeros_like(v) for n, v in model.items()})
    h.payload.total_bytes = int(declared_mib * (1 << 20))
    rss_before = psutil.Process().memory_info().rss
    sent = [0]
    with pytest.raises(grpc.RpcError) as err:
        dev.stub.PushUpdate(_stream(h, chunks=1000, sent=sent), metadata=dev.md, timeout=60)
    grown_mib = (psutil.Process().memory_info().rss - rss_before) / 2**20
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("exceeds the limit of 1048576" if declared_mib > 1 else "exceeds its declared 524288 bytes") \
        in err.value.details()
    # Refused after a few chunks (those in flight when the coordinator said no), not 1000.
    assert sent[0] <= 32, sent[0]
    assert grown_mib < 64, f"resident memory grew by {grown_mib:.0f} MiB"
    r = fleet.coordinator.engine.current
    assert "big" not in r.updates and len(r.rejected["big"]) == 1
    dev.channel.close()


def test_refused_uploads_leave_no_memory_behind(live_config, fleet_factory):
    """Found by make fuzz: on grpc.aio the frame of a refused upload outlived its call, and with it
    the chunks received so far (3,000 refused 600 kB chunks grew the coordinator by 470 MiB)."""
    import gc

    import psutil

    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=1, deadline_s=120.0))
    dev = RawDevice(fleet.port, "evil")
    dev.join()
    header, model = dev.pull()
    h, _ = _update("evil", header.round_id, {n: np.zeros_like(v) for n, v in model.items()})

    def refused(n: int) -> None:
        codes = set()
        for _ in range(n):  # more data than the update declares
            try:
                dev.stub.PushUpdate(iter([pb.UpdateChunk(header=h), pb.UpdateChunk(data=bytes(600_000))]),
                                    metadata=dev.md, timeout=10)
            except grpc.RpcError as err:
                codes.add(err.code())
        assert codes == {grpc.StatusCode.INVALID_ARGUMENT}

    refused(50)  # allocator and gRPC warm-up
    gc.collect()
    rss_before = psutil.Process().memory_info().rss
    refused(400)
    gc.collect()  # what a collection frees is not kept; what stays reachable is
    grown_mib = (psutil.Process().memory_info().rss - rss_before) / 2**20
    assert grown_mib < 30, f"resident memory grew by {grown_mib:.0f} MiB over 400 refused uploads of 600 kB"
    dev.channel.close()


@pytest.mark.slow
def test_refused_model_sized_uploads_do_not_keep_their_memory():
    """Issue: one device re-sending a 63 MiB update with a wrong checksum (then SHA-256) grew the coordinator from
    257 to 1,753 MiB in 20 refusals. Twenty of those uploads, five at a time, to a coordinator
    process (benchmarks/refused_uploads.py, where the issue's 100 are measured): afterwards its RSS
    is within the uploads' limit twice over of where it started."""
    from benchmarks import refused_uploads

    f = refused_uploads.run(uploads=20, parallel=5, upload_mib=63, limit_mib=64, every=5, log=lambda line: None)
    # Every upload was received in full and refused for its checksum: the branch under test ran.
    assert f.outcomes == {refused_uploads.REFUSED: 20}
    assert f.settled_mib <= f.start_mib + 2 * f.limit_mib, \
        f"coordinator RSS {f.start_mib:.0f} MiB before, {f.settled_mib:.0f} MiB after ({f.after_mib} along the way)"


def test_an_update_with_s_but_no_payload_says_so_and_every_rejection_is_kept(live_config, fleet_factory):
    fleet = fleet_factory(live_config(rounds=1, n_devices=2, min_devices=1, deadline_s=20.0))
    dev = RawDevice(fleet.port, "evil")
    dev.join()
    header, model = dev.pull()
    E = header.required_updates
    empty = pb.UpdateHeader(device_id="evil", round_id=header.round_id, updates_completed=E, samples_used=30,
                            train_s=0.1, local_loss=1.0)
    with pytest.raises(grpc.RpcError) as err:
        dev.push(empty, b"")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"s = {E} updates completed but the update carries no model delta" in err.value.details()
    assert "checksum" not in err.value.details()
    zero = {n: np.zeros_like(v) for n, v in model.items()}
    with pytest.raises(grpc.RpcError):
        dev.push(*_update("evil", header.round_id, zero, s=E + 1))
    assert dev.push(*_update("evil", header.round_id, zero, s=E)).accepted
    assert fleet.coordinator.wait(timeout=30)
    row = read_metrics(fleet.coordinator.out_dir / "metrics.jsonl")[-1]
    reasons = row.live.rejected["evil"]
    assert isinstance(reasons, tuple) and len(reasons) == 2, reasons
    assert "carries no model delta" in reasons[0] and "outside 0..E" in reasons[1]
    assert row.s["evil"] == E  # the valid update that followed counts

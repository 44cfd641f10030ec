"""Tensor payloads: round trip, chunking, and every corruption detected with a clear message."""

import numpy as np
import pytest
import torch
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import tensors as wire


def test_round_trip_keeps_names_shapes_dtypes_values():
    src = {"w": np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32), "b": np.arange(5, dtype=np.int64),
           "t": torch.ones(2, 2, dtype=torch.float64)}
    payload, data = wire.encode(src)
    out = wire.decode(payload, data)
    assert list(out) == ["w", "b", "t"]
    np.testing.assert_array_equal(out["w"], src["w"])
    assert out["b"].dtype == np.int64 and out["t"].shape == (2, 2)


def test_chunks_are_at_most_one_mib_and_join_back():
    data = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB
    pieces = list(wire.chunks(data))
    assert all(len(p) <= wire.MAX_CHUNK_BYTES for p in pieces) and len(pieces) == 4
    assert wire.join(pieces, limit_bytes=len(data)) == data
    with pytest.raises(wire.PayloadError, match="size limit"):
        wire.join(pieces, limit_bytes=len(data) - 1)
    assert list(wire.chunks(b"")) == [b""]


@pytest.mark.parametrize("n", [600, wire.MAP_FROM_BYTES // 4 + 3], ids=["on the heap", "in a memory map"])
def test_a_payload_buffer_assembles_chunks_and_refuses_what_does_not_fit(n):
    payload, data = wire.encode({"w": np.arange(n, dtype=np.float32)})
    buf = wire.PayloadBuffer(len(data))
    for piece in wire.chunks(data, size=1000 if n < 1000 else wire.MAX_CHUNK_BYTES):
        buf.add(piece)
    out = wire.decode(payload, buf.data())
    np.testing.assert_array_equal(out["w"], np.arange(n, dtype=np.float32))
    assert out["w"].flags.writeable  # summed in place without a copy, like join()'s
    with pytest.raises(wire.PayloadError, match=f"exceeds its declared {len(data)} bytes"):
        buf.add(b"x")
    with pytest.raises(wire.PayloadError, match="chunk limit"):
        wire.PayloadBuffer(2 * wire.MAX_CHUNK_BYTES).add(bytes(wire.MAX_CHUNK_BYTES + 1))
    short = wire.PayloadBuffer(len(data))
    short.add(data[:100])
    with pytest.raises(wire.PayloadError, match=f"payload is 100 bytes, header announced {len(data)}"):
        wire.decode(payload, short.data())
    empty = wire.PayloadBuffer(0)
    empty.add(b"")
    assert len(empty.data()) == 0


def test_decode_returns_views_of_the_received_buffer_not_copies():
    payload, data = wire.encode({"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, dtype=np.float32)})
    received = wire.join(list(wire.chunks(data, size=7)), limit_bytes=len(data))  # one copy, writable
    out = wire.decode(payload, received)
    raw = np.frombuffer(received, dtype=np.uint8)
    assert all(np.shares_memory(v, raw) for v in out.values())
    assert all(v.flags.writeable for v in out.values())  # torch.from_numpy takes them without a warning
    assert not wire.decode(payload, bytes(data))["w"].flags.writeable  # views of immutable bytes stay read-only
    small = b"x" * 10
    assert next(wire.chunks(small)) is small  # a payload of one chunk is not copied to be sent


@pytest.fixture
def encoded():
    return wire.encode({"w": np.zeros((2, 3), np.float32)})


def test_corruption_and_mismatch_detected(encoded):
    payload, data = encoded
    flipped = bytearray(data)
    flipped[0] ^= 1
    with pytest.raises(wire.PayloadError, match="checksum"):
        wire.decode(payload, bytes(flipped))
    with pytest.raises(wire.PayloadError, match="announced"):
        wire.decode(payload, data[:-1])
    with pytest.raises(wire.PayloadError, match="shape"):
        wire.decode(payload, data, expected={"w": ((3, 2), np.float32)})
    with pytest.raises(wire.PayloadError, match="missing"):
        wire.decode(payload, data, expected={"v": ((2, 3), np.float32)})
    with pytest.raises(wire.PayloadError, match="dtype"):
        wire.decode(payload, data, expected={"w": ((2, 3), np.float64)})


def test_checked_by_crc32_else_sha256_and_refused_without_either():
    """Protocol 3's payloads carry a CRC-32; agents before it send a SHA-256 alone (fleet.proto)."""
    import hashlib
    import zlib

    payload, data = wire.encode({"w": np.arange(6, dtype=np.float32)})
    assert payload.crc32 == zlib.crc32(data) and payload.sha256 == b""
    both, _ = wire.encode({"w": np.arange(6, dtype=np.float32)}, sha256=True)
    assert both.crc32 == payload.crc32 and both.sha256 == hashlib.sha256(data).digest()
    flipped = bytearray(data)
    flipped[5] ^= 0x10
    with pytest.raises(wire.PayloadError, match=r"checksum \(CRC-32\) mismatch"):
        wire.decode(both, bytes(flipped))  # the CRC-32 decides when there is one
    old = pb.Payload()
    old.CopyFrom(both)
    old.ClearField("crc32")  # as an agent before protocol 3 sends it
    np.testing.assert_array_equal(wire.decode(old, data)["w"], np.arange(6, dtype=np.float32))
    with pytest.raises(wire.PayloadError, match=r"checksum \(SHA-256\) mismatch"):
        wire.decode(old, bytes(flipped))
    old.sha256 = b""
    with pytest.raises(wire.PayloadError, match="no checksum"):
        wire.decode(old, data)


def test_non_finite_values_rejected():
    payload, data = wire.encode({"w": np.array([1.0, np.inf], np.float32)})
    with pytest.raises(wire.PayloadError, match="non-finite"):
        wire.decode(payload, data)


def test_header_lies_about_tensor_size():
    payload, data = wire.encode({"w": np.zeros(4, np.float32)})
    payload.tensors[0].shape[:] = [5]
    with pytest.raises(wire.PayloadError, match="needs"):
        wire.decode(payload, data)

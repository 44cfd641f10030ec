"""Tensors on the wire: named, shaped, typed little-endian buffers in <= 1 MiB chunks with a checksum.

Encoding concatenates the tensors' raw bytes in order; decoding checks the description
against the bytes (sizes, checksum) and, when told what to expect, against the model
(names, shapes, dtypes) and rejects non-finite values. Every problem raises
PayloadError naming the tensor and what was wrong.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import zlib
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
from flexfl.proto import fleet_pb2 as pb

from flexfl.errors import UpdateRejected

MAX_CHUNK_BYTES = 1 << 20  # gRPC's default message cap is 4 MiB; 1 MiB chunks stay well inside
# Agents send their update in pieces of this size. gRPC core assembles each message whole before
# the coordinator's handler sees it, so the piece size bounds what a stream waiting for its turn
# to be read (coordinator/server.py, UPLOADS_AT_ONCE) holds in the coordinator. 1,000 light agents
# answering at once (benchmarks.coordinator_bench, interleaved runs, 2 cores): the coordinator's
# peak 1,087-1,249 MiB with 256 KiB pieces and 256 turns, against 2,002-2,276 with the MNIST
# update's 0.8 MB in one message (10 pairs; joined: 321-326); the pieces without the turn 1,160-1,708, the turn
# without the pieces ~2,066, 512 KiB pieces ~1,500, 128 KiB ~740 but rounds a third slower. Four
# messages per upload made rounds ~1.1x as long while payloads carried a SHA-256; with CRC-32
# (protocol 3, fleet.proto) they are 0.93x the one-message SHA-256 rounds at 1,000 agents.
UPLOAD_CHUNK_BYTES = 256 << 10

_DTYPES: dict[int, np.dtype] = {pb.FLOAT32: np.dtype("<f4"), pb.FLOAT64: np.dtype("<f8"), pb.INT64: np.dtype("<i8")}
_CODES = {np.dtype(np.float32): pb.FLOAT32, np.dtype(np.float64): pb.FLOAT64, np.dtype(np.int64): pb.INT64}


class PayloadError(UpdateRejected):
    """A tensor payload does not match its description or the expected model."""


def encode(tensors: Mapping[str, np.ndarray], *, sha256: bool = False) -> tuple[pb.Payload, bytes]:
    """Describe and serialise `tensors` (numpy arrays or torch tensors) in insertion order.

    The payload carries the bytes' CRC-32, and their SHA-256 too when `sha256` is set (the
    coordinator's model, for agents before protocol 3: fleet.proto's Payload says why).
    """
    specs, parts = [], []
    for name, value in tensors.items():
        arr = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        if arr.dtype not in _CODES:
            raise PayloadError(f"tensor '{name}': dtype {arr.dtype} cannot be sent (float32, float64, int64)")
        code = _CODES[arr.dtype]
        raw = np.ascontiguousarray(arr, dtype=_DTYPES[code]).tobytes()
        specs.append(pb.TensorSpec(name=name, shape=list(arr.shape), dtype=code, nbytes=len(raw)))
        parts.append(raw)
    data = b"".join(parts)
    payload = pb.Payload(tensors=specs, total_bytes=len(data), crc32=zlib.crc32(data))
    if sha256:
        payload.sha256 = hashlib.sha256(data).digest()
    return payload, data


def chunks(data: bytes, *, size: int = MAX_CHUNK_BYTES) -> Iterator[bytes]:
    """Cut a payload into pieces of at most `size` bytes (one empty piece for an empty payload)."""
    if len(data) <= size:
        yield data  # the common case (a model under 1 MiB): no copy
        return
    view = memoryview(data)
    for start in range(0, len(data), size):
        yield bytes(view[start : start + size])


def join(pieces: Iterable[bytes], *, limit_bytes: int) -> bytearray:
    """Reassemble chunks into one writable buffer (copied once), refusing to hold more than `limit_bytes`."""
    held, size = [], 0
    for piece in pieces:
        if len(piece) > MAX_CHUNK_BYTES:
            raise PayloadError(f"chunk of {len(piece)} bytes exceeds the {MAX_CHUNK_BYTES}-byte chunk limit")
        size += len(piece)
        if size > limit_bytes:
            raise PayloadError(f"payload exceeds the size limit of {limit_bytes} bytes")
        held.append(piece)
    return bytearray().join(held)


# Payloads from this size up are assembled in a memory map of their own (PayloadBuffer).
MAP_FROM_BYTES = 4 * MAX_CHUNK_BYTES


class PayloadBuffer:
    """A payload of a declared size, assembled in one buffer as its chunks arrive (one copy each).

    From MAP_FROM_BYTES up the buffer is an anonymous memory map of the declared size, not
    C-heap memory: its pages become resident only as data arrives (a header declaring 64 MiB
    that sends nothing costs nothing), and the whole map goes back to the system once nothing
    refers to it any more (the buffer, or arrays decode() made of it). Chunks kept in a list and
    joined at the end cost the payload twice, in blocks the C allocator keeps once freed: 100
    refused 63 MiB uploads, five at a time, left a coordinator 456 MiB larger
    (benchmarks/refused_uploads.py). Below it a heap buffer grows as chunks arrive: its pages
    are warm, and a fresh map's page faults would double the cost of a 0.8 MB MNIST update
    (0.47 vs 1.1-1.5 ms to assemble and check it).
    """

    def __init__(self, declared_bytes: int) -> None:
        self.declared_bytes = declared_bytes
        self.received_bytes = 0
        self._map = mmap.mmap(-1, declared_bytes) if declared_bytes >= MAP_FROM_BYTES else None
        self._heap = bytearray()

    def add(self, piece: bytes) -> None:
        """Append one received chunk; refuses a chunk over the chunk limit or data past the declared size."""
        if len(piece) > MAX_CHUNK_BYTES:
            raise PayloadError(f"chunk of {len(piece)} bytes exceeds the {MAX_CHUNK_BYTES}-byte chunk limit")
        end = self.received_bytes + len(piece)
        if end > self.declared_bytes:
            raise PayloadError(f"payload exceeds its declared {self.declared_bytes} bytes")
        if self._map is not None:
            self._map[self.received_bytes:end] = piece
        else:
            self._heap += piece
        self.received_bytes = end

    def data(self) -> memoryview:
        """What has arrived, writable (decode() of a short payload says how short it is)."""
        return memoryview(self._map if self._map is not None else self._heap)[: self.received_bytes]


def decode(
    payload: pb.Payload,
    data: bytes | bytearray | memoryview,
    *,
    expected: Mapping[str, tuple[tuple[int, ...], np.dtype]] | None = None,
    require_finite: bool = True,
) -> dict[str, np.ndarray]:
    """Check `data` against `payload` (and `expected` {name: (shape, dtype)}) and return the arrays.

    The arrays are views of `data`, not copies: writable when `data` is (a bytearray from
    join(), a PayloadBuffer's data()), read-only when it is bytes.
    """
    if payload.total_bytes != len(data):
        raise PayloadError(f"payload is {len(data)} bytes, header announced {payload.total_bytes}")
    if payload.HasField("crc32"):
        if zlib.crc32(data) != payload.crc32:
            raise PayloadError("payload checksum (CRC-32) mismatch: the transfer was corrupted")
    elif not payload.sha256:
        raise PayloadError("payload carries no checksum (neither crc32 nor sha256)")
    elif hashlib.sha256(data).digest() != payload.sha256:
        raise PayloadError("payload checksum (SHA-256) mismatch: the transfer was corrupted")
    declared = sum(t.nbytes for t in payload.tensors)
    if declared != len(data):
        raise PayloadError(f"tensor sizes add up to {declared} bytes, payload has {len(data)}")
    names = [t.name for t in payload.tensors]
    if len(set(names)) != len(names):
        raise PayloadError(f"duplicate tensor names in {names}")
    if expected is not None and set(names) != set(expected):
        missing, extra = sorted(set(expected) - set(names)), sorted(set(names) - set(expected))
        raise PayloadError(f"tensor names do not match the model: missing {missing}, unexpected {extra}")
    out: dict[str, np.ndarray] = {}
    offset = 0
    for spec in payload.tensors:
        dtype = _DTYPES.get(spec.dtype)
        if dtype is None:
            raise PayloadError(f"tensor '{spec.name}': unknown dtype code {spec.dtype}")
        shape = tuple(int(d) for d in spec.shape)
        if any(d < 0 for d in shape):
            raise PayloadError(f"tensor '{spec.name}': negative dimension in shape {shape}")
        if math.prod(shape) * dtype.itemsize != spec.nbytes:
            raise PayloadError(f"tensor '{spec.name}': shape {shape} of {dtype} needs "
                               f"{math.prod(shape) * dtype.itemsize} bytes, header says {spec.nbytes}")
        if expected is not None:
            want_shape, want_dtype = expected[spec.name]
            if shape != tuple(want_shape):
                raise PayloadError(f"tensor '{spec.name}': shape {shape}, the model expects {tuple(want_shape)}")
            if dtype != np.dtype(want_dtype).newbyteorder("<"):
                raise PayloadError(f"tensor '{spec.name}': dtype {dtype}, the model expects {np.dtype(want_dtype)}")
        arr = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
        if require_finite and dtype.kind == "f" and not np.isfinite(arr).all():
            bad = int((~np.isfinite(arr)).sum())
            raise PayloadError(f"tensor '{spec.name}': {bad} non-finite values (NaN/Inf)")
        out[spec.name] = arr if dtype.isnative else arr.astype(dtype.newbyteorder("="))
        offset += spec.nbytes
    return out

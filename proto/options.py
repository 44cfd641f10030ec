"""gRPC channel and server options in one place: message sizes and keepalive."""

from __future__ import annotations

from enum import StrEnum

from flexfl.proto.tensors import MAX_CHUNK_BYTES

# A message holds at most one 1 MiB chunk plus a header; 4 MiB leaves room for large
# headers (many tensors) without letting a peer push arbitrary-size messages.
MAX_MESSAGE_BYTES = 4 * MAX_CHUNK_BYTES

GRPC_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Pings keep NAT mappings of idle agents alive and detect dead peers within ~a minute.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    # gRPC's own reconnect backoff grows to 120 s by default; the agent retries on its own
    # schedule, so cap the channel's so a restarted coordinator is found within seconds.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

# Server only: refuse a port another process already holds (gRPC sets SO_REUSEPORT by
# default, which would let two coordinators split one fleet between them silently).
SERVER_OPTIONS: list[tuple[str, int]] = [*GRPC_OPTIONS, ("grpc.so_reuseport", 0)]

AUTH_HEADER = "authorization"
# Trailing metadata of a refused call: the machine-readable reason, so that clients decide on
# the status code and this, never on message text (coordinator/server.py maps errors to both).
ERROR_HEADER = "x-flexfl-error"


class ErrorReason(StrEnum):
    BAD_TOKEN = "bad-token"
    MISSING_DEVICE = "missing-device"
    UNKNOWN_DEVICE = "unknown-device"
    IDENTITY_MISMATCH = "identity-mismatch"
    DEVICE_CONFLICT = "device-conflict"
    DEVICE_BUSY = "device-busy"
    PROTOCOL_VERSION = "protocol-version"
    PARTITION_MISMATCH = "partition-mismatch"
    WRONG_ROUND_STATE = "wrong-round-state"
    UPDATE_REJECTED = "update-rejected"
    INVALID_ARGUMENT = "invalid-argument"


def error_reason(exc: object) -> str:
    """The x-flexfl-error reason of a grpc.RpcError ('' when the server gave none)."""
    for key, value in (exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else ():
        if key == ERROR_HEADER:
            return value
    return ""
DEVICE_HEADER = "x-flexfl-device"
# 2: RoundHeader.proximal_mu (FedProx). An agent of version 1 (or 0: unsaid) would ignore it
# and train without the term, so a run whose strategy has one refuses such agents at join.
# 3: Payload.crc32. Agents send it in place of sha256; the coordinator takes either, and its
# model carries both, so agents of versions 1-2 still work (fleet.proto's Payload).
PROTOCOL_VERSION = 3
PROXIMAL_MU_PROTOCOL = 2

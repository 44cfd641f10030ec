"""gRPC channel and server options in one place: message sizes and keepalive."""

from __future__ import annotations

from proto.tensors import MAX_CHUNK_BYTES

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

AUTH_HEADER = "authorization"
DEVICE_HEADER = "x-flexfl-device"
PROTOCOL_VERSION = 1

"""The gRPC servicer: authenticates every call and hands the work to the round engine.

Domain errors become status codes through one table (`ERRORS`), most specific class first
by inheritance; the reason travels as trailing metadata (proto/options.py) so that agents
act on code and reason, never on message text.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc

from coordinator.config import CoordinatorConfig
from coordinator.engine import RoundEngine
from flexfl.errors import (ConfigError, IdentityMismatch, PartitionMismatch, ProtocolMismatch, Unauthenticated,
                           UnknownDevice, UpdateRejected, WrongRoundState)
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import (AUTH_HEADER, DEVICE_HEADER, ERROR_HEADER, PROTOCOL_VERSION, SERVER_OPTIONS,
                                  ErrorReason)

log = logging.getLogger(__name__)

Code = grpc.StatusCode
ERRORS: dict[type[Exception], tuple[grpc.StatusCode, ErrorReason]] = {
    Unauthenticated: (Code.UNAUTHENTICATED, ErrorReason.BAD_TOKEN),
    UnknownDevice: (Code.UNAUTHENTICATED, ErrorReason.UNKNOWN_DEVICE),
    IdentityMismatch: (Code.PERMISSION_DENIED, ErrorReason.IDENTITY_MISMATCH),
    ProtocolMismatch: (Code.FAILED_PRECONDITION, ErrorReason.PROTOCOL_VERSION),
    PartitionMismatch: (Code.FAILED_PRECONDITION, ErrorReason.PARTITION_MISMATCH),
    WrongRoundState: (Code.FAILED_PRECONDITION, ErrorReason.WRONG_ROUND_STATE),
    UpdateRejected: (Code.INVALID_ARGUMENT, ErrorReason.UPDATE_REJECTED),
    ConfigError: (Code.INVALID_ARGUMENT, ErrorReason.INVALID_ARGUMENT),
}


def status_of(exc: Exception) -> tuple[grpc.StatusCode, ErrorReason] | None:
    """The table's entry for `exc`'s most specific class that has one (None: not a domain error)."""
    return next((ERRORS[cls] for cls in type(exc).__mro__ if cls in ERRORS), None)


@contextmanager
def _mapped(context: grpc.ServicerContext):
    try:
        yield
    except tuple(ERRORS) as exc:
        code, reason = status_of(exc)
        context.set_trailing_metadata(((ERROR_HEADER, str(reason)),))
        context.abort(code, str(exc))


class FleetServicer(pb_grpc.FleetServicer):
    def __init__(self, engine: RoundEngine, *, token: str, max_update_bytes: int) -> None:
        self.engine = engine
        self._token = token.encode()
        self.max_update_bytes = max_update_bytes

    def _caller(self, context: grpc.ServicerContext) -> str:
        """Check the fleet token; return the device id the call claims to come from."""
        md = dict(context.invocation_metadata())
        presented = md.get(AUTH_HEADER, "")
        token = presented[len("Bearer "):] if presented.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode(), self._token):
            raise Unauthenticated("missing or wrong fleet token")
        device_id = md.get(DEVICE_HEADER, "")
        if not device_id:
            raise Unauthenticated(f"missing {DEVICE_HEADER} metadata")
        return device_id

    @staticmethod
    def _same(caller: str, claimed: str, what: str) -> None:
        if claimed and claimed != caller:
            raise IdentityMismatch(f"{what} for {claimed!r} from {caller!r}")

    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinReply:
        with _mapped(context):
            caller = self._caller(context)
            self._same(caller, request.device_id or "(none)", "join")
            if request.protocol_version not in (0, PROTOCOL_VERSION):
                raise ProtocolMismatch(f"protocol version {request.protocol_version} unsupported "
                                       f"(coordinator speaks {PROTOCOL_VERSION})")
            return self.engine.join(request)

    def Leave(self, request: pb.LeaveRequest, context: grpc.ServicerContext) -> pb.LeaveReply:
        with _mapped(context):
            caller = self._caller(context)
            self._same(caller, request.device_id, "leave")
            return pb.LeaveReply(policy=self.engine.leave(caller, request.reason))

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        with _mapped(context):
            self._caller(context)
            return self.engine.status()

    def PullRound(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[pb.RoundChunk]:
        with _mapped(context):
            caller = self._caller(context)
            header, data = self.engine.pull(caller, after_round=request.after_round, wait_s=request.wait_s)
        first = pb.RoundChunk(header=header)
        yield first
        if header.status != pb.RoundHeader.ROUND:
            return
        sent = first.ByteSize()  # protobuf message bytes: header + chunks (HTTP/2 framing not counted)
        for piece in wire.chunks(data):
            if not context.is_active():
                return
            chunk = pb.RoundChunk(data=piece)
            yield chunk
            sent += chunk.ByteSize()
        # Reached once gRPC asked for more after the last chunk: the model is on its way.
        self.engine.delivered(caller, header.round_id, sent)

    def PushUpdate(self, request_iterator: Iterator[pb.UpdateChunk], context: grpc.ServicerContext) -> pb.PushReply:
        with _mapped(context):
            caller = self._caller(context)
            first = next(request_iterator, None)
            if first is None or not first.HasField("header"):
                raise UpdateRejected("the first message of an update must be its header")
            header = first.header
            self._same(caller, header.device_id, "update header")
            try:
                self.engine.check_push_header(caller, header)
                data, message_bytes = self._receive(header, first, request_iterator)
                return self.engine.push(caller, header, data, message_bytes=message_bytes)
            except UpdateRejected as exc:
                if not isinstance(exc, WrongRoundState):
                    log.warning("rejected update from %s: %s", caller, exc)
                    self.engine.note_rejection(caller, header.round_id, str(exc))
                raise

    def _receive(self, header: pb.UpdateHeader, first: pb.UpdateChunk,
                 rest: Iterator[pb.UpdateChunk]) -> tuple[bytes, int]:
        """The payload, refused as soon as it exceeds the limit or its declared size (never buffered past either)."""
        declared = header.payload.total_bytes
        if declared > self.max_update_bytes:
            raise UpdateRejected(f"payload of {declared} bytes exceeds the limit of {self.max_update_bytes}")
        pieces, received, message_bytes = [], 0, first.ByteSize()
        for chunk in rest:
            if chunk.HasField("header"):
                raise UpdateRejected("a second header arrived inside the update stream")
            received += len(chunk.data)
            if received > declared:
                raise UpdateRejected(f"payload exceeds its declared {declared} bytes (limit {self.max_update_bytes})")
            pieces.append(chunk.data)
            message_bytes += chunk.ByteSize()
        return wire.join(pieces, limit_bytes=self.max_update_bytes), message_bytes


def handler_threads(cfg: CoordinatorConfig) -> int:
    """Handler threads for the partition's devices: each may park a PullRound and upload at once, plus spare.

    A parked long poll holds its thread; with fewer threads than parked polls, uploads
    queue behind polls until those time out, and rounds stall. Threads start on demand.
    """
    return 2 * cfg.partition.n_devices + 32


def build_server(cfg: CoordinatorConfig, engine: RoundEngine, *, token: str,
                 max_workers: int | None = None) -> tuple[grpc.Server, int]:
    """A started gRPC server bound to `server.listen` (port 0 picks a free one); returns it and the port."""
    workers = max_workers or handler_threads(cfg)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc-handler"),
                         options=SERVER_OPTIONS)
    servicer = FleetServicer(engine, token=token, max_update_bytes=int(cfg.server.max_update_mib * (1 << 20)))
    pb_grpc.add_FleetServicer_to_server(servicer, server)
    s = cfg.server
    try:
        if s.tls_cert:
            creds = grpc.ssl_server_credentials(
                [(_read(s.tls_key), _read(s.tls_cert))],
                root_certificates=_read(s.tls_client_ca) if s.tls_client_ca else None,
                require_client_auth=bool(s.tls_client_ca),
            )
            port = server.add_secure_port(s.listen, creds)
        else:
            port = server.add_insecure_port(s.listen)
    except RuntimeError:  # grpcio >= 1.6x raises instead of returning 0
        port = 0
    if port == 0:
        raise ConfigError(f"server.listen: cannot bind {s.listen!r}: the port is in use by another program, "
                          "or the address is not HOST:PORT on this machine")
    server.start()
    return server, port


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None

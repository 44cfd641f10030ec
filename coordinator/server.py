"""The gRPC servicer: authenticates every call and hands the work to the round engine.

Domain errors become status codes: bad input INVALID_ARGUMENT, wrong round state
FAILED_PRECONDITION, unknown device or bad token UNAUTHENTICATED, a header that names
another device, or (mutual TLS) a client certificate that names another device
(coordinator/identity.py) PERMISSION_DENIED.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc

from coordinator import identity
from coordinator.config import CoordinatorConfig
from coordinator.rounds import RoundEngine, UnknownDevice, WrongRoundState
from flexfl.errors import ConfigError, UpdateRejected
from proto import fleet_pb2 as pb
from proto import fleet_pb2_grpc as pb_grpc
from proto import tensors as wire
from proto.options import AUTH_HEADER, DEVICE_HEADER, GRPC_OPTIONS, PROTOCOL_VERSION

log = logging.getLogger(__name__)


class FleetServicer(pb_grpc.FleetServicer):
    def __init__(self, engine: RoundEngine, *, token: str, max_update_bytes: int,
                 certificate_identity: bool = False) -> None:
        self.engine = engine
        self._token = token.encode()
        self.max_update_bytes = max_update_bytes
        self.certificate_identity = certificate_identity  # mutual TLS: the CN is the device id

    def _caller(self, context: grpc.ServicerContext) -> str:
        """Check the fleet token; return the device id the call claims to come from."""
        md = dict(context.invocation_metadata())
        presented = md.get(AUTH_HEADER, "")
        token = presented[len("Bearer "):] if presented.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode(), self._token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong fleet token")
        device_id = md.get(DEVICE_HEADER, "")
        if not device_id:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"missing {DEVICE_HEADER} metadata")
        if self.certificate_identity:
            try:
                identity.check_claim(context.auth_context(), device_id)
            except identity.IdentityMismatch as exc:
                log.warning("refused a call: %s", exc)
                context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        return device_id

    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinReply:
        caller = self._caller(context)
        if request.device_id != caller:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"join for {request.device_id!r} from {caller!r}")
        if request.protocol_version not in (0, PROTOCOL_VERSION):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"protocol version {request.protocol_version} unsupported (coordinator speaks {PROTOCOL_VERSION})")
        try:
            return self.engine.join(request)
        except ConfigError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def Leave(self, request: pb.LeaveRequest, context: grpc.ServicerContext) -> pb.LeaveReply:
        caller = self._caller(context)
        if request.device_id and request.device_id != caller:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"leave for {request.device_id!r} from {caller!r}")
        try:
            return pb.LeaveReply(policy=self.engine.leave(caller, request.reason))
        except UnknownDevice as exc:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))

    def PullRound(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[pb.RoundChunk]:
        caller = self._caller(context)
        try:
            header, data = self.engine.pull(caller, after_round=request.after_round, wait_s=request.wait_s)
        except UnknownDevice as exc:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
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
        caller = self._caller(context)
        try:
            first = next(request_iterator)
        except StopIteration:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty update stream: the header must come first")
        if not first.HasField("header"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message of an update must be its header")
        header = first.header
        try:
            self.engine.check_push_header(caller, header)
            if header.payload.total_bytes > self.max_update_bytes:
                raise UpdateRejected(f"payload of {header.payload.total_bytes} bytes exceeds the limit of {self.max_update_bytes}")
            pieces = []
            message_bytes = first.ByteSize()
            for chunk in request_iterator:
                if chunk.HasField("header"):
                    raise UpdateRejected("a second header arrived inside the update stream")
                pieces.append(chunk.data)
                message_bytes += chunk.ByteSize()
            data = wire.join(pieces, limit_bytes=self.max_update_bytes)
            return self.engine.push(caller, header, data, message_bytes=message_bytes)
        except UnknownDevice as exc:
            code = grpc.StatusCode.PERMISSION_DENIED if "header names" in str(exc) else grpc.StatusCode.UNAUTHENTICATED
            context.abort(code, str(exc))
        except WrongRoundState as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except UpdateRejected as exc:
            log.warning("rejected update from %s: %s", caller, exc)
            self.engine.note_rejection(caller, header.round_id, str(exc))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def build_server(cfg: CoordinatorConfig, engine: RoundEngine, *, max_workers: int = 64) -> tuple[grpc.Server, int]:
    """A started gRPC server bound to `server.listen` (port 0 picks a free one); returns it and the port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=GRPC_OPTIONS)
    servicer = FleetServicer(engine, token=cfg.token(), max_update_bytes=int(cfg.server.max_update_mib * (1 << 20)),
                             certificate_identity=bool(cfg.server.tls_cert and cfg.server.tls_client_ca))
    pb_grpc.add_FleetServicer_to_server(servicer, server)
    s = cfg.server
    if s.tls_cert:
        creds = grpc.ssl_server_credentials(
            [(_read(cfg.path(s.tls_key)), _read(cfg.path(s.tls_cert)))],
            root_certificates=_read(cfg.path(s.tls_client_ca)) if s.tls_client_ca else None,
            require_client_auth=bool(s.tls_client_ca),
        )
        port = server.add_secure_port(s.listen, creds)
    else:
        port = server.add_insecure_port(s.listen)
    if port == 0:
        raise ConfigError(f"server.listen: cannot bind {s.listen!r}")
    server.start()
    return server, port


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None

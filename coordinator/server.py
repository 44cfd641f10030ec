"""The gRPC servicer: the wire format in and out, and the work handed to the round engine.

Each request's protobuf message becomes a domain record (flexfl/exchange.py, shared with the agent) and each
answer a message again: the engine never sees protobuf. Calls are authenticated first
(coordinator/callers.py); domain errors end a call with the status code and reason of the
one table in coordinator/status.py.

Agents take their rounds on one long-lived Session stream each (PullRound and PushUpdate on
one call, proto/fleet.proto), so a round sets up no call; the two calls stay for agents from
before it, and share their code with it.

The server is grpc.aio on one event-loop thread. The turns of a round's transfers are their
own modules: the offer (the next round, waited for without a thread, and its model sent as
bytes serialised once per round, a bounded few at a time: coordinator/offering.py) and the
upload (an update read, checked and summed, a bounded number at a time, on the loop or a
work thread: coordinator/uploading.py). Devices' log lines go to their files in the output folder
(coordinator/agent_logs.py), written on a work thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from dataclasses import asdict, replace
from functools import partial
from typing import Any

import grpc
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto.options import PROTOCOL_VERSION, PROXIMAL_MU_PROTOCOL, SERVER_OPTIONS
from flexfl.proto.status import status_reply

from coordinator.agent_logs import AgentLogs
from coordinator.callers import Callers, same_device
from coordinator.config import CoordinatorConfig
from coordinator.engine import RoundEngine
from coordinator.listen import bind
from coordinator.offering import Offers
from coordinator.status import mapped
from coordinator.uploading import Uploads, kind
from flexfl.errors import ProtocolMismatch, UpdateRejected
from flexfl.exchange import Join, LogLine

# A session sends WAIT at most this often (a pull's wait_s of 0 would otherwise spin), or every
# server.pull_wait_s when that is shorter.
SESSION_MIN_WAIT_S = 1.0


class FleetServicer(pb_grpc.FleetServicer):
    def __init__(self, engine: RoundEngine, *, token: str, max_update_bytes: int, pull_wait_s: float,
                 work: futures.Executor, agent_logs: AgentLogs, certificate_identity: bool = False) -> None:
        self.engine = engine
        self.offers = Offers(engine, pull_wait_s=pull_wait_s, work=work)
        self.uploads = Uploads(engine, max_update_bytes=max_update_bytes, work=work)
        self.agent_logs = agent_logs
        self._work = work
        self._callers = Callers(token, certificate_identity=certificate_identity)

    @mapped
    async def Join(self, request: pb.JoinRequest, context: grpc.aio.ServicerContext) -> pb.JoinReply:
        caller = self._callers.identify(context)
        same_device(caller, request.device_id or "(none)", "join")
        self._callers.check_join(caller)
        if request.protocol_version > PROTOCOL_VERSION:
            raise ProtocolMismatch(f"protocol version {request.protocol_version} unsupported "
                                   f"(coordinator speaks {PROTOCOL_VERSION})")
        mu = self.engine.cfg.rules.aggregation.proximal_mu
        if mu > 0 and request.protocol_version < PROXIMAL_MU_PROTOCOL:
            raise ProtocolMismatch(f"this run's strategy trains with FedProx's mu = {mu:g}, which agents of "
                                   f"protocol version {request.protocol_version} ignore; update the agent "
                                   f"(version {PROXIMAL_MU_PROTOCOL} or later)")
        joined = self.engine.join(Join(
            device_id=request.device_id, sample_count=request.sample_count,
            shard_index=request.shard_index if request.HasField("shard_index") else None,
            partition_json=request.partition_json, hardware={f.name: v for f, v in request.hardware.ListFields()},
            agent_version=request.agent_version, resident_bytes=request.resident_bytes))
        return pb.JoinReply(**asdict(joined))

    @mapped
    async def Leave(self, request: pb.LeaveRequest, context: grpc.aio.ServicerContext) -> pb.LeaveReply:
        caller = self._callers.identify(context)
        same_device(caller, request.device_id, "leave")
        return pb.LeaveReply(policy=self.engine.leave(caller, request.reason))

    @mapped
    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusReply:
        self._callers.identify(context)
        state = self.engine.status()
        streaming = self._callers.streaming()
        return status_reply(replace(state, devices=tuple(replace(d, streaming=d.device_id in streaming)
                                                         for d in state.devices)))

    @mapped
    async def SendLog(self, request: pb.LogBatch, context: grpc.aio.ServicerContext) -> pb.LogReply:
        caller = self._callers.identify(context)
        lines = [LogLine(time_s=m.time_s, level=m.level, logger=m.logger, message=m.message) for m in request.lines]
        kept = await asyncio.get_running_loop().run_in_executor(self._work, partial(
            self.agent_logs.append, caller, lines, dropped_by_device=request.dropped))
        return pb.LogReply(kept=kept.kept, dropped=kept.dropped)

    @mapped
    async def PullRound(self, request: pb.PullRequest,
                        context: grpc.aio.ServicerContext) -> AsyncIterator[pb.RoundChunk]:
        caller = self._callers.identify(context)
        with self._callers.live_stream(caller, context):
            header, chunks = await self.offers.pull(caller, wait_s=request.wait_s)
            async for message in self.offers.send(caller, header, chunks):
                yield message

    @mapped
    async def Session(self, request_iterator: AsyncIterator[pb.UpdateChunk],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.RoundChunk]:
        """PullRound and PushUpdate on one stream (proto/fleet.proto): the device's rounds until FINISHED."""
        requests = aiter(request_iterator)
        caller = self._callers.identify(context)
        with self._callers.live_stream(caller, context):
            opening = await anext(requests, None)
            if opening is None:
                return
            if opening.WhichOneof("kind") == "header":
                # The update of a round the device already has (one refused, or its stream lost), checked
                # as PushUpdate would; then the session goes on, waiting as long as the server allows.
                yield pb.RoundChunk(reply=await self.uploads.take(caller, opening, requests, to_end=False))
                wait_s = float("inf")
            elif opening.WhichOneof("kind") == "pull":
                asked = opening.pull.wait_s
                wait_s = asked if asked >= SESSION_MIN_WAIT_S else SESSION_MIN_WAIT_S  # NaN too
            else:
                raise UpdateRejected(f"a session's first message must be a pull request or an update's header, "
                                     f"not {kind(opening)}")
            while True:
                header, chunks = await self.offers.pull(caller, wait_s=wait_s)
                async for message in self.offers.send(caller, header, chunks):
                    yield message
                if header.status == pb.RoundHeader.FINISHED:
                    return
                if header.status != pb.RoundHeader.ROUND:
                    continue
                first = await anext(requests, None)
                if first is None:  # the device closed its side (stopping)
                    return
                if first.WhichOneof("kind") != "header":
                    raise self.uploads.refused(caller, header.round_id, UpdateRejected(
                        f"round {header.round_id}: expected the update's header, got {kind(first)}"))
                yield pb.RoundChunk(reply=await self.uploads.take(caller, first, requests, to_end=False))

    @mapped
    async def PushUpdate(self, request_iterator: AsyncIterator[pb.UpdateChunk],
                         context: grpc.aio.ServicerContext) -> pb.PushReply:
        caller = self._callers.identify(context)
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("kind") != "header":
            raise UpdateRejected("the first message of an update must be its header")
        return await self.uploads.take(caller, first, requests, to_end=True)


def _passing_bytes(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A response serializer that sends bytes (a message serialised beforehand) as they are."""
    def serializer(message: Any) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return serializer


class _Registration:
    """Stands in for the server while the generated code registers the servicer: keeps its handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # the same handlers arrive by name below

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, handlers


def add_servicer(servicer: pb_grpc.FleetServicer, server: grpc.aio.Server) -> None:
    """Register `servicer` as the generated code does, with response serializers that pass bytes through."""
    registration = _Registration()
    pb_grpc.add_FleetServicer_to_server(servicer, registration)
    if not registration.handlers:
        raise RuntimeError("the generated fleet_pb2_grpc registered no method handlers by name; regenerate the "
                           "stubs with grpcio-tools >= 1.62 (make proto)")
    handlers = {name: handler._replace(response_serializer=_passing_bytes(handler.response_serializer))
                for name, handler in registration.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(registration.service, handlers),))
    server.add_registered_method_handlers(registration.service, handlers)


async def start_server(cfg: CoordinatorConfig, engine: RoundEngine, *, token: str, work: futures.Executor,
                       agent_logs: AgentLogs | None = None) -> tuple[grpc.aio.Server, int]:
    """A started grpc.aio server, bound to `server.listen` (port 0 picks a free one), on the running loop.

    Returns it and the port. Call from the event loop that will serve it; `work` runs the
    uploads' CPU work (a few threads).
    """
    server = grpc.aio.server(options=SERVER_OPTIONS)
    s = cfg.server
    agent_logs = agent_logs or AgentLogs.of(cfg)
    servicer = FleetServicer(engine, token=token, max_update_bytes=int(s.max_update_mib * (1 << 20)),
                             pull_wait_s=s.pull_wait_s, work=work, agent_logs=agent_logs,
                             certificate_identity=bool(s.tls_cert and s.tls_client_ca))
    add_servicer(servicer, server)
    port = await bind(server, s)
    await server.start()
    return server, port

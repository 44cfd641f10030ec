"""The gRPC servicer: the wire format in and out, and the work handed to the round engine.

Each request's protobuf message becomes a domain record (coordinator/records.py) and each
answer a message again: the engine never sees protobuf. Calls are authenticated first
(coordinator/callers.py); domain errors end a call with the status code and reason of the
one table in coordinator/status.py.

Agents take their rounds on one long-lived Session stream each (PullRound and PushUpdate on
one call, proto/fleet.proto), so a round sets up no call; the two calls stay for agents from
before it, and share their code with it.

The server is grpc.aio on one event-loop thread: a pull parked until its device's next
round holds a coroutine and a callback in the engine (RoundEngine.offer), not a thread, so
a thousand long polls cost little; and no message hops between a polling thread and a
handler thread. What takes CPU per upload (checksum, checks, adding the delta to the round's
sum) runs in a small thread pool, where hashing and numpy release the GIL, so the loop
keeps serving meanwhile; when only a few uploads are in progress and each is small, it
runs on the loop itself (INLINE_UPLOADS).

A round's model goes to every device as the same bytes: its data messages are serialised
once per round (_encode_model), and the server's response serializers pass bytes through
(add_servicer); gRPC would otherwise serialise the model afresh for every stream. At most
OFFERS_AT_ONCE streams are being sent the model at any moment, and at most UPLOADS_AT_ONCE
updates are being read (agents send them in pieces of proto.tensors.UPLOAD_CHUNK_BYTES, so a
stream waiting for its turn holds little); each turn is handed back after a few seconds even
if its transfer goes on (Turn), so a stalled device cannot hold the others up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from dataclasses import asdict
from typing import Any

import grpc
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import PROTOCOL_VERSION, PROXIMAL_MU_PROTOCOL, SERVER_OPTIONS

from coordinator.callers import Callers, same_device
from coordinator.config import CoordinatorConfig
from coordinator.engine import RoundEngine
from coordinator.listen import bind
from coordinator.records import Join, OfferStatus, RoundOffer, RoundTerms, UpdateReport
from coordinator.status import mapped
from edge_agent.deadline import AGENT_REASONS, StopReason
from edge_agent.memory import release_freed
from flexfl.errors import IdentityMismatch, ProtocolMismatch, UpdateRejected, WrongRoundState

log = logging.getLogger(__name__)

# An upload's CPU work was ~0.6 ms for the 0.8 MB MNIST MLP with SHA-256, less with CRC-32.
# Handing it to a work thread and back costs about as much (future chaining, a self-pipe wake-up, the GIL),
# and with few devices that hop sits on the round's critical path: a 5-agent round took
# ~12 % longer through the pool (A/B, interleaved). With up to INLINE_UPLOADS uploads in
# progress and none above INLINE_MAX_BYTES the loop does the work itself, stalling other
# calls for at most a few ms; a busier server uses the pool, where the work runs in parallel.
INLINE_UPLOADS = 8
INLINE_MAX_BYTES = 4 << 20
# A large upload reaches the coordinator in many small blocks that gRPC's threads allocate and free
# once read; glibc keeps freed blocks in the allocating thread's arena, to reuse. After 100
# refused 63 MiB uploads (five at a time) 40-390 MiB of them stayed resident, the more the busier
# the machine (gRPC buffers more while the loop lags), and malloc_trim brought the coordinator
# back to where it started (benchmarks/refused_uploads.py). A refused upload of this size has no
# steady state to reuse them for: refusing it hands them back (edge_agent.memory.release_freed, as
# agents do after each round), on a work thread: one pass over the arenas, 0.4 ms with little
# to return, ~90 ms for 540 MiB on this 2-core box.
TRIM_AFTER_BYTES = 8 << 20
# At most this many streams are sent a round's model at once; the others wait their turn. With all of
# a thousand offers in flight together the coordinator's RSS rose by ~1.5 MB per stream while they
# were written (sampled every 10 ms; most of it in gRPC core, not Python objects). Measured with
# 1,000 light agents on this 2-core machine (interleaved with the code before): peak 3.0-3.3 GiB ->
# 2.0-2.4 with the model serialised once and 64 offers at a time, rounds no slower (3.9 -> 3.0 s).
# A lab fleet (5-50 devices) never waits here.
OFFERS_AT_ONCE = 64
# ... and an offer gives its turn back after this long even if it is still being written. On loopback
# gRPC accepted a whole 0.8 MB model for a device that read nothing, so an MNIST offer never holds
# its turn that long; a model larger than the peer's flow-control window and socket buffers would,
# for as long as its device stalls (until keepalive declares a dead link, ~40 s).
OFFER_TURN_S = 5.0
# At most this many updates are read at once; the others wait their turn, their pieces held back
# by gRPC's flow control. Together with the agents' 256 KiB pieces this took the peak with 1,000
# light agents from joined + 1.8 GiB to joined + 0.8-0.9 GiB (proto/tensors.py, UPLOAD_CHUNK_BYTES,
# has the figures). 256 rather than 64: peak 1,097-1,153 against 1,195-1,220 MiB, rounds 0.99x
# (6 interleaved runs each at 1,000 agents).
UPLOADS_AT_ONCE = 256
# ... and an upload gives its turn back after this long even if it is still arriving: a 0.8 MB
# update takes ~0.6 s at 10 Mbit/s; a device slower than that, or one that stalls, lets the
# next in while its own upload goes on.
UPLOAD_TURN_S = 5.0
# A session sends WAIT at most this often (a pull's wait_s of 0 would otherwise spin), or every
# server.pull_wait_s when that is shorter.
SESSION_MIN_WAIT_S = 1.0


class FleetServicer(pb_grpc.FleetServicer):
    def __init__(self, engine: RoundEngine, *, token: str, max_update_bytes: int, pull_wait_s: float,
                 work: futures.Executor, certificate_identity: bool = False) -> None:
        self.engine = engine
        self._offering = asyncio.Semaphore(OFFERS_AT_ONCE)  # turns to be sent a model
        self._uploading = asyncio.Semaphore(UPLOADS_AT_ONCE)  # turns to have an update read
        self.pull_wait_s = pull_wait_s  # server.pull_wait_s: the longest a pull is held before WAIT
        self._encoded: tuple[int, asyncio.Future] | None = None  # (round, its model's messages), see _model
        self.max_update_bytes = max_update_bytes
        self._work = work  # uploads' checksums, checks and summing, off the event loop
        self._uploads = 0  # PushUpdate calls past their header check (touched on the loop thread only)
        self._callers = Callers(token, certificate_identity=certificate_identity)

    def _refused(self, caller: str, round_id: int, exc: Exception) -> Exception:
        """Log a refusal of `caller`'s update for round `round_id` and keep it in the round's row; returns `exc`."""
        # The text, not the exception: a log record that keeps the exception keeps its traceback's
        # frames and the upload they hold (pytest's log capture does).
        log.log(logging.INFO if isinstance(exc, WrongRoundState) else logging.WARNING, "refused an update from %s: %s",
                caller, str(exc))
        self.engine.note_rejection(caller, round_id, str(exc))
        return exc

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
        return pb.StatusReply(**{**asdict(state), "devices": [pb.DeviceStatus(**asdict(d)) for d in state.devices]})

    @mapped
    async def PullRound(self, request: pb.PullRequest,
                        context: grpc.aio.ServicerContext) -> AsyncIterator[pb.RoundChunk]:
        caller = self._callers.identify(context)
        with self._callers.live_stream(caller, context):
            header, chunks = await self._pull(caller, wait_s=request.wait_s)
            async for message in self._offer(caller, header, chunks):
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
                yield pb.RoundChunk(reply=await self._take_update(caller, opening, requests, to_end=False))
                wait_s = float("inf")
            elif opening.WhichOneof("kind") == "pull":
                asked = opening.pull.wait_s
                wait_s = asked if asked >= SESSION_MIN_WAIT_S else SESSION_MIN_WAIT_S  # NaN too
            else:
                raise UpdateRejected(f"a session's first message must be a pull request or an update's header, "
                                     f"not {_kind(opening)}")
            while True:
                header, chunks = await self._pull(caller, wait_s=wait_s)
                async for message in self._offer(caller, header, chunks):
                    yield message
                if header.status == pb.RoundHeader.FINISHED:
                    return
                if header.status != pb.RoundHeader.ROUND:
                    continue
                first = await anext(requests, None)
                if first is None:  # the device closed its side (stopping)
                    return
                if first.WhichOneof("kind") != "header":
                    raise self._refused(caller, header.round_id, UpdateRejected(
                        f"round {header.round_id}: expected the update's header, got {_kind(first)}"))
                yield pb.RoundChunk(reply=await self._take_update(caller, first, requests, to_end=False))

    async def _offer(self, caller: str, header: pb.RoundHeader,
                     chunks: tuple[bytes, ...]) -> AsyncIterator[pb.RoundChunk | bytes]:
        """The messages of one offer: the header, then (a round) the model, which then counts as delivered."""
        first = pb.RoundChunk(header=header)
        yield first
        if header.status != pb.RoundHeader.ROUND:
            return
        sent = first.ByteSize()  # protobuf message bytes: header + chunks (HTTP/2 framing not counted)
        async with Turn(self._offering, hold_s=OFFER_TURN_S):
            for chunk in chunks:  # serialised RoundChunk messages, the same bytes for every device of the round
                yield chunk
                sent += len(chunk)
        # Reached once gRPC asked for more after the last chunk: the model is on its way.
        self.engine.delivered(caller, header.round_id, sent)

    async def _pull(self, caller: str, *, wait_s: float) -> tuple[pb.RoundHeader, tuple[bytes, ...]]:
        """The device's next round (header, the model's data messages), waiting up to wait_s."""
        offer = await self._next_offer(caller, wait_s=wait_s)
        if offer.terms is None:
            return pb.RoundHeader(status=_STATUS[offer.status], round_id=offer.round_id), ()
        t = offer.terms
        payload, chunks = await self._model(offer.round_id, t)
        return pb.RoundHeader(
            status=_STATUS[offer.status], round_id=offer.round_id, required_updates=t.required_updates,
            learning_rate=t.learning_rate, batch_size=t.batch_size, deadline_s=t.deadline_s,
            model=pb.ModelDescription(**asdict(t.model)), payload=payload, seed=t.seed, unit=t.unit,
            device_index=t.device_index, trace_sampling=t.trace_sampling, s_rule=t.s_rule, proximal_mu=t.proximal_mu,
        ), chunks

    async def _model(self, round_id: int, terms: RoundTerms) -> tuple[pb.Payload, tuple[bytes, ...]]:
        """The round's model: its payload description and data messages, the same for every device of
        the round, encoded once (on a work thread: checksumming a large model would stall the loop)."""
        if self._encoded is None or self._encoded[0] != round_id:
            encoding = asyncio.get_running_loop().run_in_executor(self._work, _encode_model, terms.params)
            self._encoded = (round_id, encoding)
        return await asyncio.shield(self._encoded[1])  # one cancelled pull does not cancel the others' encoding

    async def _next_offer(self, caller: str, *, wait_s: float) -> RoundOffer:
        """The engine's offer to the device, waiting (parked in the engine, no thread held) up to wait_s."""
        loop = asyncio.get_running_loop()
        limit = loop.time() + max(0.0, min(wait_s, self.pull_wait_s))
        while True:
            woken = asyncio.Event()

            def wake() -> None:  # called by the engine under its lock, from another thread
                try:
                    # B023: the loop variable is read when the engine calls wake; kept as it was, since
                    # whether a wake can outlive its turn (ParkedPulls) is not settled here.
                    loop.call_soon_threadsafe(woken.set)  # noqa: B023
                except RuntimeError:  # the loop has closed: the server is gone, nobody waits
                    pass

            offered = self.engine.offer(caller, wake=wake)
            if offered is not None:
                return offered
            try:
                await asyncio.wait_for(woken.wait(), timeout=max(0.0, limit - loop.time()))
            except TimeoutError:
                return self.engine.waiting_reply()
            finally:
                self.engine.unpark(caller, wake)

    @mapped
    async def PushUpdate(self, request_iterator: AsyncIterator[pb.UpdateChunk],
                         context: grpc.aio.ServicerContext) -> pb.PushReply:
        caller = self._callers.identify(context)
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("kind") != "header":
            raise UpdateRejected("the first message of an update must be its header")
        return await self._take_update(caller, first, requests, to_end=True)

    async def _take_update(self, caller: str, first: pb.UpdateChunk, rest: AsyncIterator[pb.UpdateChunk], *,
                           to_end: bool) -> pb.PushReply:
        """Receive, check and sum one update whose header is `first`; its data follows in `rest`.

        to_end: the data runs to the end of the stream (PushUpdate); else it is exactly the
        declared payload (Session, where the stream goes on).
        """
        header = first.header
        buffer = None
        try:
            same_device(caller, header.device_id, "update header")
            report = UpdateReport(round_id=header.round_id, updates_completed=header.updates_completed,
                                  samples_used=header.samples_used, train_s=header.train_s,
                                  local_loss=header.local_loss, previous_upload_s=header.previous_upload_s,
                                  stop_reason=stop_reason(header.stop_reason))
            self.engine.check_update(caller, report)
            declared = header.payload.total_bytes
            if declared > self.max_update_bytes:
                raise UpdateRejected(f"payload of {declared} bytes exceeds the limit of {self.max_update_bytes}")
            async with Turn(self._uploading, hold_s=UPLOAD_TURN_S):
                buffer = wire.PayloadBuffer(declared)
                self._uploads += 1
                try:
                    message_bytes = await self._receive(buffer, first.ByteSize(), rest, to_end=to_end)
                    push = functools.partial(self._push, caller, report, header.payload, buffer.data(),
                                             message_bytes=message_bytes)
                    if self._uploads <= INLINE_UPLOADS and declared <= INLINE_MAX_BYTES:
                        return push()
                    return await asyncio.get_running_loop().run_in_executor(self._work, push)
                finally:
                    self._uploads -= 1
        except (UpdateRejected, IdentityMismatch) as exc:
            self._refused(caller, header.round_id, exc)
            if buffer is not None and buffer.received_bytes >= TRIM_AFTER_BYTES:
                await asyncio.get_running_loop().run_in_executor(self._work, release_freed)
            raise

    def _push(self, caller: str, report: UpdateReport, payload: pb.Payload, data: memoryview, *,
              message_bytes: int) -> pb.PushReply:
        """On a work thread (or the loop: INLINE_UPLOADS): decode and check the delta, sum the update."""
        if payload.total_bytes == 0 and (report.updates_completed == 0 or not payload.tensors):
            delta = {}  # s = 0 needs no delta; s > 0 without one is refused by the engine, which says so
        else:
            delta = wire.decode(payload, data, expected=self.engine.expected)  # views of `data`, checked
        accepted = self.engine.push(caller, report, delta, bytes_in=message_bytes)
        return pb.PushReply(round_id=accepted.round_id, accepted=True, message=accepted.message)

    @staticmethod
    async def _receive(buffer: wire.PayloadBuffer, first_bytes: int, rest: AsyncIterator[pb.UpdateChunk], *,
                       to_end: bool) -> int:
        """Fill `buffer` with the payload, refused as soon as it exceeds its declared size; returns the
        protobuf bytes of the messages, `first_bytes` (the header's) included.

        to_end: read to the end of the stream; else exactly the declared size.
        """
        declared, message_bytes = buffer.declared_bytes, first_bytes
        while to_end or buffer.received_bytes < declared:
            chunk = await anext(rest, None)
            if chunk is None:
                if to_end:
                    break
                raise UpdateRejected(f"the stream ended after {buffer.received_bytes} of the update's {declared} bytes")
            if chunk.WhichOneof("kind") not in ("data", None):
                raise UpdateRejected(f"a {_kind(chunk)} message arrived inside the update's data")
            buffer.add(chunk.data)
            message_bytes += chunk.ByteSize()
        return message_bytes


_STATUS = {OfferStatus.ROUND: pb.RoundHeader.ROUND, OfferStatus.WAIT: pb.RoundHeader.WAIT,
           OfferStatus.FINISHED: pb.RoundHeader.FINISHED}


def stop_reason(value: int) -> StopReason:
    """An update header's stop_reason as the agent's StopReason (fleet.proto names each value after its member).

    Unset (an older agent), a coordinator-side reason or a number this coordinator does not
    know (a newer agent) is UNKNOWN: the update is taken, its reason is not claimed.
    """
    name = pb.StopReason.Name(value).removeprefix("STOP_REASON_") if value in pb.StopReason.values() else ""
    reason = StopReason.__members__.get(name)
    return reason if reason in AGENT_REASONS else StopReason.UNKNOWN


class Turn:
    """One of the semaphore's turns (to be sent a model, to have an update read), handed back when the
    transfer ends or after `hold_s`, whichever comes first (the transfer itself goes on)."""

    def __init__(self, turns: asyncio.Semaphore, *, hold_s: float) -> None:
        self.turns = turns
        self.hold_s = hold_s
        self._held = False
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> Turn:
        await self.turns.acquire()
        self._held = True
        self._timer = asyncio.get_running_loop().call_later(self.hold_s, self.release)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            self._held = False
            self.turns.release()


def _encode_model(params) -> tuple[pb.Payload, tuple[bytes, ...]]:
    """The model's payload description and its data messages, each a serialised RoundChunk.

    With a SHA-256 beside the CRC-32 for agents before protocol 3 (one hash per round)."""
    payload, data = wire.encode(params, sha256=True)
    return payload, tuple(pb.RoundChunk(data=piece).SerializeToString() for piece in wire.chunks(data))


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


def _kind(message: pb.UpdateChunk) -> str:
    """What an update-stream message is, for errors: 'header', 'data', 'pull' or 'empty'."""
    return message.WhichOneof("kind") or "empty"


async def start_server(cfg: CoordinatorConfig, engine: RoundEngine, *, token: str,
                       work: futures.Executor) -> tuple[grpc.aio.Server, int]:
    """A started grpc.aio server, bound to `server.listen` (port 0 picks a free one), on the running loop.

    Returns it and the port. Call from the event loop that will serve it; `work` runs the
    uploads' CPU work (a few threads).
    """
    server = grpc.aio.server(options=SERVER_OPTIONS)
    s = cfg.server
    servicer = FleetServicer(engine, token=token, max_update_bytes=int(s.max_update_mib * (1 << 20)),
                             pull_wait_s=s.pull_wait_s, work=work,
                             certificate_identity=bool(s.tls_cert and s.tls_client_ca))
    add_servicer(servicer, server)
    port = await bind(server, s)
    await server.start()
    return server, port

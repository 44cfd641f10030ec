"""The agent's side of the wire: one channel to the coordinator, its Session stream, retries, protobuf.

Everything past this module speaks the records of flexfl/exchange.py, as the coordinator's
engine does past its servicer: a pull gives a RoundOffer (the model decoded and checked), a
push takes an UpdateReport and its delta. Rounds and updates travel on one long-lived Session
stream (proto/fleet.proto), reopened after any error; against a coordinator without it
(UNIMPLEMENTED) the agent makes a PullRound and a PushUpdate call per round instead.

The agent always dials the coordinator and retries with exponential backoff while it is
away. It decides on status codes and the coordinator's error reason (proto/options.py), never
on message text.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc
import numpy as np
import torch
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.channel import open_channel
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, PROTOCOL_VERSION, ErrorReason, error_reason
from flexfl.proto.status import fleet_state

from edge_agent.config import AgentConfig
from flexfl.errors import FlexFLError
from flexfl.exchange import (
    Delta,
    FleetState,
    Join,
    Joined,
    LogKept,
    LogLine,
    ModelDescription,
    OfferStatus,
    RoundOffer,
    RoundTerms,
    UpdateReport,
)
from flexfl.net import reach_problem
from flexfl.vocabulary import StopReason

log = logging.getLogger(__name__)

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED}

# {tensor name: (shape, dtype)}: what a model expects of the parameters sent to it.
Expected = Mapping[str, tuple[tuple[int, ...], np.dtype]]
T = TypeVar("T")


class AgentError(FlexFLError):
    """The agent cannot go on (its token or partition is refused, ...)."""


class UnknownDevice(AgentError):
    """The coordinator does not know this device (it restarted without --resume): join again."""


@dataclass(frozen=True)
class Delivery:
    """A pull's answer: the offer, and when the whole model had arrived (the deadline counts from then)."""

    offer: RoundOffer
    received_at: float  # time.monotonic()


@dataclass(frozen=True)
class Pushed:
    """What became of an update: the coordinator's message (or what went wrong) and the upload's time."""

    outcome: str
    taken: bool  # the coordinator accepted the push (False: refused, late, the call failed)
    carried_update: bool  # the push had a delta in it (s > 0)
    upload_s: float  # from the first message to the coordinator's answer (or the failure)


class _Silent(grpc.RpcError):
    """The coordinator sent nothing on a session for longer than a call of the same kind may take."""

    def __init__(self, what: str, limit_s: float) -> None:
        super().__init__(what)
        self._details = f"the coordinator sent no {what} on the session stream for {limit_s:g} s"

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return ()


class _Session:
    """One Session call: this device's rounds and its answers, in order, on one stream.

    The request side is fed from a queue, so that the agent's thread writes an update when
    it has one; gRPC's RpcError surfaces from the reads (the call's status and reason). A
    wait for the next header or for a reply is bounded like the call it replaces (the
    coordinator sends WAIT every pull wait_s): past it the stream is cancelled and the read
    raises DEADLINE_EXCEEDED, which the agent retries like any call that timed out.
    """

    def __init__(self, stub: pb_grpc.FleetStub, metadata: list[tuple[str, str]], pull: pb.PullRequest) -> None:
        self._outbox: queue.SimpleQueue[pb.UpdateChunk | None] = queue.SimpleQueue()
        self._outbox.put(pb.UpdateChunk(pull=pull))
        self._call = stub.Session(iter(self._outbox.get, None), metadata=metadata)
        self._expired = threading.Event()

    def next_round(self, *, limit_s: float) -> tuple[pb.RoundHeader, bytes | bytearray]:
        """The next header (WAIT after the pull's wait_s, FINISHED, or a ROUND with its model's bytes)."""
        header = self._read("header", limit_s=limit_s).header
        if header.status != pb.RoundHeader.ROUND:
            return header, b""
        return header, wire.join(self._data(header.payload.total_bytes), limit_bytes=header.payload.total_bytes)

    def push(self, update: Iterator[pb.UpdateChunk], *, limit_s: float) -> pb.PushReply:
        for message in update:
            self._outbox.put(message)
        return self._read("reply", limit_s=limit_s).reply

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()

    def _data(self, total: int) -> Iterator[bytes]:
        received = 0
        while received < total:
            piece = self._read("data").data
            received += len(piece)
            yield piece

    def _read(self, kind: str, *, limit_s: float | None = None) -> pb.RoundChunk:
        timer = None
        if limit_s is not None:
            timer = threading.Timer(limit_s, self._expire)
            timer.daemon = True
            timer.start()
        try:
            message = next(self._call, None)
        except grpc.RpcError:
            if self._expired.is_set() and limit_s is not None:
                raise _Silent(kind, limit_s) from None
            raise
        finally:
            if timer is not None:
                timer.cancel()
        got = "the end of the stream" if message is None else message.WhichOneof("kind")
        if got != kind:
            raise AgentError(f"the coordinator's session stream sent {got} where a {kind} message belongs")
        return message

    def _expire(self) -> None:
        self._expired.set()
        self._call.cancel()


class Transport:
    """The device's calls to its coordinator (status, join, leave, pull, push, send_log), in domain records.

    `stop` is the agent's: retries end when it is set.
    """

    def __init__(self, cfg: AgentConfig, *, stop: threading.Event) -> None:
        self.cfg = cfg
        self._stop = stop
        self._token = cfg.token()
        self._channel = open_channel(cfg.coordinator, cfg.tls_files())
        self._stub = pb_grpc.FleetStub(self._channel)
        self._session: _Session | None = None
        self.per_round_calls = False  # the coordinator has no Session: a PullRound and a PushUpdate per round
        self.logs_unsupported = False  # the coordinator has no SendLog: the agent's log stays on the device

    def close(self) -> None:
        self.end_session()
        self._channel.close()

    def end_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def status(self) -> FleetState:
        """The coordinator's state (retried while it is away)."""
        try:
            reply = self._retrying("status", lambda: self._stub.Status(
                pb.StatusRequest(), metadata=self._metadata(), timeout=self.cfg.rpc_timeout_s))
        except grpc.RpcError as exc:
            raise self._refused("status", exc) from None
        return fleet_state(reply)

    def join(self, join: Join) -> Joined:
        request = pb.JoinRequest(device_id=join.device_id, sample_count=join.sample_count,
                                 hardware=pb.HardwareFacts(**join.hardware), agent_version=join.agent_version,
                                 protocol_version=PROTOCOL_VERSION, partition_json=join.partition_json,
                                 resident_bytes=join.resident_bytes)
        if join.shard_index is not None:  # optional on the wire: unset is "no shard", not shard 0
            request.shard_index = join.shard_index
        try:
            reply = self._retrying("join", lambda: self._stub.Join(request, metadata=self._metadata(),
                                                                    timeout=self.cfg.rpc_timeout_s))
        except grpc.RpcError as exc:
            raise self._refused("join", exc) from None
        return Joined(device_id=reply.device_id, device_index=reply.device_index, arrival=reply.arrival,
                      current_round=reply.current_round, run_id=reply.run_id, partition_json=reply.partition_json)

    def leave(self, reason: str) -> str | None:
        """Announce a departure; the coordinator's policy for it, or None when it could not be told."""
        try:
            reply = self._stub.Leave(pb.LeaveRequest(device_id=self.cfg.device_id, reason=reason),
                                     metadata=self._metadata(), timeout=5)
        except grpc.RpcError as exc:
            log.warning("%s: could not announce departure to %s: %s", self.cfg.device_id, self.cfg.coordinator,
                        exc.code().name)
            return None
        return str(reply.policy)

    def send_log(self, lines: list[LogLine], dropped: int, *, timeout_s: float = 10.0) -> LogKept | None:
        """Deliver a batch of this agent's log records; None when it could not (tried once: the next round tries
        again). A coordinator without SendLog is not asked again (logs_unsupported)."""
        if self.logs_unsupported:
            return None
        batch = pb.LogBatch(lines=[pb.LogLine(time_s=x.time_s, level=x.level, logger=x.logger, message=x.message)
                                   for x in lines], dropped=dropped)
        try:
            reply = self._stub.SendLog(batch, metadata=self._metadata(), timeout=min(timeout_s, self.cfg.rpc_timeout_s))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.logs_unsupported = True
                log.info("%s: coordinator %s keeps no device logs (no SendLog); this log stays here",
                         self.cfg.device_id, self.cfg.coordinator)
            else:  # DEBUG: a WARNING would be a record to send, at every failed try
                log.debug("%s: log not sent: %s: %s", self.cfg.device_id, exc.code().name, exc.details())
            return None
        return LogKept(kept=reply.kept, dropped=reply.dropped)

    def pull(self, after_round: int, *, expected: Callable[[ModelDescription], Expected]) -> Delivery | None:
        """The next offer after `after_round` (None: the agent is stopping); a round's model is checked
        against `expected(its description)`. Raises UnknownDevice when the coordinator lost this device."""
        request = pb.PullRequest(device_id=self.cfg.device_id, after_round=after_round, wait_s=self.cfg.pull_wait_s)
        try:
            header, data = self._retrying("pull", lambda: self._call_pull(request))
        except grpc.RpcError as exc:
            if error_reason(exc) == ErrorReason.UNKNOWN_DEVICE:
                raise UnknownDevice(f"{self.cfg.device_id}: coordinator {self.cfg.coordinator} does not know "
                                    "this device") from None
            if self._stop.is_set():
                return None
            raise self._refused("pull", exc) from None
        received_at = time.monotonic()
        return Delivery(offer=_offer(header, data, expected=expected), received_at=received_at)

    def push(self, report: UpdateReport, delta: Delta, *, timeout_s: float) -> Pushed:
        """Send the update (a late or refused one is this round's loss, not the agent's end)."""
        payload, body = wire.encode(delta) if delta else (pb.Payload(), b"")
        header = pb.UpdateHeader(device_id=self.cfg.device_id, round_id=report.round_id,
                                 updates_completed=report.updates_completed, samples_used=report.samples_used,
                                 train_s=report.train_s, previous_upload_s=report.previous_upload_s,
                                 local_loss=report.local_loss, payload=payload,
                                 stop_reason=wire_stop_reason(report.stop_reason),
                                 resident_bytes=report.resident_bytes)

        def messages() -> Iterator[pb.UpdateChunk]:
            yield pb.UpdateChunk(header=header)
            if body:
                for piece in wire.chunks(body, size=wire.UPLOAD_CHUNK_BYTES):
                    yield pb.UpdateChunk(data=piece)

        started = time.monotonic()
        try:
            if self._session is not None:
                outcome, taken = self._session.push(messages(), limit_s=timeout_s).message, True
            else:
                outcome = self._stub.PushUpdate(messages(), metadata=self._metadata(), timeout=timeout_s).message
                taken = True
        except grpc.RpcError as exc:
            # A refusal ends the session stream: the next pull opens a new one.
            self.end_session()
            outcome, taken = f"rejected: {exc.code().name}: {exc.details()}", False
        return Pushed(outcome=str(outcome), taken=taken, carried_update=bool(body),
                      upload_s=time.monotonic() - started)

    # ---- calls -----------------------------------------------------------------------

    def _metadata(self) -> list[tuple[str, str]]:
        return [(AUTH_HEADER, f"Bearer {self._token}"), (DEVICE_HEADER, self.cfg.device_id)]

    def _call_pull(self, request: pb.PullRequest) -> tuple[pb.RoundHeader, bytes | bytearray]:
        """The next offer: from the session stream (opened if need be), or by a PullRound call."""
        if not self.per_round_calls:
            fresh = self._session is None
            if self._session is None:
                self._session = _Session(self._stub, self._metadata(), request)
            try:
                return self._session.next_round(limit_s=self.cfg.pull_wait_s + self.cfg.rpc_timeout_s)
            except grpc.RpcError as exc:
                self.end_session()
                if not (fresh and exc.code() == grpc.StatusCode.UNIMPLEMENTED):
                    raise
                log.info("%s: coordinator %s has no Session stream; a PullRound and a PushUpdate call per round",
                         self.cfg.device_id, self.cfg.coordinator)
                self.per_round_calls = True
        stream = self._stub.PullRound(request, metadata=self._metadata(),
                                      timeout=self.cfg.pull_wait_s + self.cfg.rpc_timeout_s)
        first = next(stream)
        if first.header.status != pb.RoundHeader.ROUND:
            stream.cancel()
            return first.header, b""
        return first.header, wire.join((c.data for c in stream), limit_bytes=first.header.payload.total_bytes)

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """Run `call()` until it succeeds, retrying with exponential backoff while the coordinator is away.

        Each retry is logged with the address and the reason (from a DNS lookup and a TCP
        connect of our own: refused, unresolvable, no answer, or reachable but the call
        failed). After `give_up_after_s` of failures in a row the agent stops with an AgentError.
        """
        delay = self.cfg.backoff_initial_s
        failing_since = None
        while True:
            try:
                return call()
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or self._stop.is_set():
                    raise
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                reason = self._why_unavailable(exc)
                give_up = self.cfg.give_up_after_s
                if give_up and now - failing_since >= give_up:
                    raise AgentError(f"{self.cfg.device_id}: gave up after {now - failing_since:.0f} s "
                                     f"(give_up_after_s = {give_up:g}): {what} to coordinator "
                                     f"{self.cfg.coordinator} keeps failing: {reason}") from None
                wait = delay * (0.8 + 0.4 * random.random())
                if give_up:
                    wait = min(wait, max(0.0, failing_since + give_up - now))
                log.warning("%s: %s to coordinator %s failed: %s; retrying in %.1f s%s", self.cfg.device_id, what,
                            self.cfg.coordinator, reason, wait,
                            f" (giving up {give_up:g} s after the first failure)" if give_up else "")
                if self._stop.wait(wait):
                    raise
                delay = min(delay * 2, self.cfg.backoff_max_s)

    def _why_unavailable(self, exc: grpc.RpcError) -> str:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"no answer within the call's time limit ({exc.details()})"
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            return f"{exc.code().name}: {exc.details()}"
        return reach_problem(self.cfg.coordinator, timeout_s=min(3.0, self.cfg.rpc_timeout_s))

    def _refused(self, what: str, exc: grpc.RpcError) -> AgentError:
        return AgentError(f"{self.cfg.device_id}: {what} refused by coordinator {self.cfg.coordinator}: "
                          f"{exc.code().name}: {exc.details()}")


# ---- protobuf <-> records -------------------------------------------------------------

_STATUS = {pb.RoundHeader.ROUND: OfferStatus.ROUND, pb.RoundHeader.FINISHED: OfferStatus.FINISHED}


def _offer(header: pb.RoundHeader, data: bytes | bytearray, *,
           expected: Callable[[ModelDescription], Expected]) -> RoundOffer:
    """A round header (and its model's bytes) as an offer; a status this agent does not know reads as WAIT."""
    status = _STATUS.get(header.status, OfferStatus.WAIT)
    if status != OfferStatus.ROUND:
        return RoundOffer(status=status, round_id=header.round_id)
    model = ModelDescription(architecture=header.model.architecture, num_classes=header.model.num_classes,
                             in_features=header.model.in_features)
    arrays = wire.decode(header.payload, data, expected=expected(model))
    terms = RoundTerms(
        required_updates=header.required_updates, learning_rate=header.learning_rate, batch_size=header.batch_size,
        deadline_s=header.deadline_s, model=model, params={n: torch.from_numpy(a) for n, a in arrays.items()},
        seed=header.seed, unit=header.unit or "step", device_index=header.device_index,
        trace_sampling=header.trace_sampling or "iid", s_rule=header.s_rule or "round",
        proximal_mu=header.proximal_mu)
    return RoundOffer(status=status, round_id=header.round_id, terms=terms)


def wire_stop_reason(why: StopReason) -> int:
    """The update header's stop_reason for `why` (fleet.proto names each value after its member)."""
    return int(pb.StopReason.Value(f"STOP_REASON_{why.name}"))


"""The coordinator's Status call as a typed record (flexfl.exchange.FleetState), for whoever watches a run.

`fetch_status(address, access)` asks once; a StatusClient asks again and again on one channel
(`flexfl status`, a campaign's view, the agent before it joins). Both ends' conversions live
here, `status_reply` for the coordinator's servicer and `fleet_state` for the callers, so that
each field is mapped once and a test sends a record through both.

Who may ask: every call carries the fleet token and a device id (proto/fleet.proto). Status
needs no joined device, so the id is a name of the caller's choosing (STATUS_DEVICE_ID unless
told), except under mutual TLS: there the id must be the client certificate's common name
(coordinator/identity.py), and a caller with a certificate claims its CN unless told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto.channel import TlsFiles, certificate_common_name, open_channel
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER

from flexfl.errors import FlexFLError
from flexfl.exchange import DeviceRound, DeviceState, FleetState, RoundState
from flexfl.net import reach_problem

STATUS_DEVICE_ID = "flexfl-status"  # the id a Status call claims when neither the caller nor a certificate names one

# The coordinator is away (starting, restarting, unreachable) or took too long: a watcher asks again.
_AWAY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class StatusError(FlexFLError):
    """The coordinator's status could not be had: unreachable (`away`: worth asking again) or the call refused."""

    def __init__(self, message: str, *, away: bool) -> None:
        super().__init__(message)
        self.away = away


@dataclass(frozen=True)
class Access:
    """What a Status call presents: the fleet token, the device id it claims, and TLS files (None: plaintext)."""

    token: str
    device_id: str = ""  # "": the client certificate's CN under mutual TLS, else STATUS_DEVICE_ID
    tls: TlsFiles | None = None

    def claimed_id(self) -> str:
        if self.device_id:
            return self.device_id
        cn = certificate_common_name(self.tls.client_cert) if self.tls is not None and self.tls.client_cert else None
        return cn or STATUS_DEVICE_ID


class StatusClient:
    """Status calls to the coordinator at `address` on one channel: fetch() as often as wanted, then close()."""

    def __init__(self, address: str, access: Access, *, timeout_s: float = 5.0) -> None:
        self.address = address
        self._channel = open_channel(address, access.tls)
        self._stub = pb_grpc.FleetStub(self._channel)
        self._metadata = [(AUTH_HEADER, f"Bearer {access.token}"), (DEVICE_HEADER, access.claimed_id())]
        self._timeout_s = timeout_s

    def fetch(self) -> FleetState:
        """The coordinator's state now; a StatusError that names the address and why otherwise."""
        try:
            reply = self._stub.Status(pb.StatusRequest(), metadata=self._metadata, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            if exc.code() in _AWAY:
                why = (f"no answer within {self._timeout_s:g} s" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                       else reach_problem(self.address, timeout_s=min(3.0, self._timeout_s)))
                raise StatusError(f"cannot reach coordinator {self.address}: {why}", away=True) from None
            raise StatusError(f"coordinator {self.address} refused Status: {exc.code().name}: {exc.details()}",
                              away=False) from None
        return fleet_state(reply)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> StatusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fetch_status(address: str, access: Access, *, timeout_s: float = 5.0) -> FleetState:
    """The state of the coordinator at `address` (HOST:PORT), asked once; StatusError otherwise."""
    with StatusClient(address, access, timeout_s=timeout_s) as client:
        return client.fetch()


# ---- protobuf <-> record -----------------------------------------------------------------


def status_reply(state: FleetState) -> pb.StatusReply:
    """The coordinator's answer to Status (its servicer's side)."""
    reply = pb.StatusReply(run_id=state.run_id, completed_round=state.completed_round, open_round=state.open_round,
                           started=state.started, finished=state.finished, rounds=state.rounds,
                           devices=[_device_status(d) for d in state.devices], partition_json=state.partition_json,
                           required_updates=state.required_updates, deadline_s=state.deadline_s)
    if state.round_open_s is not None:
        reply.round_open_s = state.round_open_s
    if state.round_closes_in_s is not None:
        reply.round_closes_in_s = state.round_closes_in_s
    return reply


def _device_status(d: DeviceState) -> pb.DeviceStatus:
    msg = pb.DeviceStatus(device_id=d.device_id, departed=d.departed, in_objective=d.in_objective,
                          joined_after_round=d.joined_after_round, connected=d.connected, streaming=d.streaming,
                          round_state=str(d.round_state), resident_bytes=d.resident_bytes or 0,
                          upload_bytes_per_s=d.upload_bytes_per_s or 0.0)
    if d.shard_index is not None:  # optional on the wire: unset is "no shard", not shard 0
        msg.shard_index = d.shard_index
    if d.seen_ago_s is not None:
        msg.seen_ago_s = d.seen_ago_s
    if d.last_round is not None:
        r = d.last_round
        msg.last_round.CopyFrom(pb.DeviceRound(round_id=r.round_id, updates_completed=r.s, stop_reason=r.stop_reason,
                                               bytes_in=r.bytes_in, bytes_out=r.bytes_out, train_s=r.train_s))
    return msg


def fleet_state(reply: pb.StatusReply) -> FleetState:
    """A Status answer as a record (a caller's side); fields an older coordinator leaves unset read as unknown."""
    return FleetState(
        run_id=reply.run_id, completed_round=reply.completed_round, open_round=reply.open_round,
        started=reply.started, finished=reply.finished, rounds=reply.rounds,
        devices=tuple(_device_state(d) for d in reply.devices), partition_json=reply.partition_json,
        required_updates=reply.required_updates, deadline_s=reply.deadline_s,
        round_open_s=reply.round_open_s if reply.HasField("round_open_s") else None,
        round_closes_in_s=reply.round_closes_in_s if reply.HasField("round_closes_in_s") else None)


def _device_state(d: pb.DeviceStatus) -> DeviceState:
    r = d.last_round
    last = DeviceRound(round_id=r.round_id, s=r.updates_completed, stop_reason=r.stop_reason, bytes_in=r.bytes_in,
                       bytes_out=r.bytes_out, train_s=r.train_s) if d.HasField("last_round") else None
    try:
        round_state = RoundState(d.round_state)
    except ValueError:  # a state a newer coordinator knows and this caller does not
        round_state = RoundState.NONE
    return DeviceState(
        device_id=d.device_id, shard_index=d.shard_index if d.HasField("shard_index") else None,
        departed=d.departed, in_objective=d.in_objective, joined_after_round=d.joined_after_round,
        connected=d.connected, streaming=d.streaming, round_state=round_state, last_round=last,
        resident_bytes=d.resident_bytes or None, upload_bytes_per_s=d.upload_bytes_per_s or None,
        seen_ago_s=d.seen_ago_s if d.HasField("seen_ago_s") else None)

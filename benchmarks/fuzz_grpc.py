"""Property-based fuzzing of a live coordinator's gRPC surface (Join, Leave, PullRound, PushUpdate, Session, Status).

The target is a real `flexfl coordinator` process on loopback (loadgen.harness) with one
round open: two honest devices ("honest-a", "honest-b") and one hostile but registered
device ("evil") have joined and received the model. Hypothesis then generates messages:
every call a device could make, with garbage fields, lying headers and sizes, NaN/Inf and
wrongly shaped or typed tensors, truncated and reordered streams, cancelled calls, random
metadata and tokens, undecodable protobuf bytes and raw TCP garbage. Every update it sends
carries at least one defect, so the properties are:

- each call ends with a status the server's ERRORS table gives (or OK where the call is
  legitimate: a Status, a pull, a well-formed join of a new device), never UNKNOWN (an
  unmapped exception) and never an accepted update;
- the coordinator keeps answering Status with round 1 still open.

Afterwards the honest devices and evil send valid updates; the round must close with the
model computed here, independently, from those valid updates alone (fuzz_main checks it).
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field

import grpc
import numpy as np
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from benchmarks.fuzz_support import draws_from_seed_alone
from coordinator.status import ERRORS  # the server's one exception -> status table

HONEST = ("honest-a", "honest-b")
EVIL = "evil"
SAMPLES = {"honest-a": 100, "honest-b": 300, EVIL: 50}
# Ids the fuzzer may use with the real token: evil, and a small pool (joins of new ids succeed
# and are legitimate; the pool keeps the registry bounded). Never an honest device's id.
POOL = tuple(f"fz-{i}" for i in range(24))
Code = grpc.StatusCode
DOMAIN_CODES = {code for code, _ in ERRORS.values()}  # the server's refusals, from its one table
# gRPC's own refusals: a message over the size limit, a call the client cancelled or timed out.
TRANSPORT_CODES = {Code.RESOURCE_EXHAUSTED, Code.CANCELLED, Code.DEADLINE_EXCEEDED}


class Client:
    """Raw calls to the coordinator as any identity, with any metadata."""

    def __init__(self, address: str, token: str) -> None:
        self.address, self.token = address, token
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.FleetStub(self.channel)

    def md(self, device_id: str, *, token: str | None = None) -> list[tuple[str, str]]:
        return [(AUTH_HEADER, f"Bearer {self.token if token is None else token}"), (DEVICE_HEADER, device_id)]

    def join(self, device_id: str, samples: int) -> pb.JoinReply:
        return self.stub.Join(pb.JoinRequest(device_id=device_id, sample_count=samples, protocol_version=1),
                              metadata=self.md(device_id), timeout=10)

    def pull(self, device_id: str) -> tuple[pb.RoundHeader, dict[str, np.ndarray]]:
        chunks = list(self.stub.PullRound(pb.PullRequest(device_id=device_id, wait_s=5), metadata=self.md(device_id),
                                          timeout=20))
        header = chunks[0].header
        return header, wire.decode(header.payload, b"".join(c.data for c in chunks[1:]))

    def push(self, device_id: str, header: pb.UpdateHeader, data: bytes) -> pb.PushReply:
        def messages():
            yield pb.UpdateChunk(header=header)
            for piece in wire.chunks(data):
                yield pb.UpdateChunk(data=piece)

        return self.stub.PushUpdate(messages(), metadata=self.md(device_id), timeout=20)

    def close(self) -> None:
        self.channel.close()


@dataclass
class Target:
    """What the fuzzer knows of the open round: its id, E, the model's tensors."""

    client: Client
    round_id: int
    E: int
    model: dict[str, np.ndarray]
    tally: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


# ---- strategies --------------------------------------------------------------------------

_printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=24)
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1.0, 1e300]))
_u64 = st.one_of(st.integers(0, 8), st.integers(0, 2**64 - 1))
_u32 = st.one_of(st.integers(0, 40), st.integers(0, 2**32 - 1))


@st.composite
def identity(draw, *, allow_evil: bool = True):
    """(device id in metadata, token or None for the real one, drop metadata?): who the call claims to be."""
    kind = draw(st.sampled_from(["evil", "pool", "stranger", "no-token", "no-device", "garbage"]
                                if allow_evil else ["pool", "stranger", "no-token", "no-device", "garbage"]))
    if kind == "evil":
        return {"device": EVIL, "token": None}
    if kind == "pool":
        return {"device": draw(st.sampled_from(POOL)), "token": None}
    if kind == "stranger":
        return {"device": draw(st.sampled_from((EVIL, *POOL))), "token": draw(_printable.filter(bool))}
    if kind == "no-token":
        return {"device": EVIL, "token": "", "bare": True}
    if kind == "no-device":
        return {"device": "", "token": None}
    return {"device": draw(_printable.filter(lambda d: d not in (*HONEST, EVIL))),
            "token": draw(st.one_of(st.none(), _printable))}


def _metadata(client: Client, who: dict, extra: list) -> list[tuple[str, str]]:
    md = [(DEVICE_HEADER, who["device"])] if who.get("bare") else client.md(who["device"], token=who["token"])
    return [(k, v) for k, v in md if v] + extra


_extra_md = st.lists(st.tuples(st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10)
                               .filter(lambda k: not k.startswith("grpc-") and k not in (AUTH_HEADER, DEVICE_HEADER)),
                               _printable), max_size=3)


@st.composite
def join_call(draw, target: Target):
    who = draw(identity())
    claimed = draw(st.one_of(st.just(who["device"]), _printable))
    if who["device"] == EVIL and claimed == EVIL:
        claimed = draw(st.sampled_from(["", EVIL]))  # a rejoin of evil is harmless; "" is an identity mismatch
    partition = draw(st.one_of(st.just(""), st.just(""), _printable, st.sampled_from([
        "{}", "[]", "null", '{"dataset": "mnist"}', '{"dataset": "synthetic", "n_devices": -1}',
        '{"dataset": "synthetic", "n_devices": 1e999}', '{"n_devices": 4, "dataset": "emnist"}']),
        st.text(max_size=100)))
    # Half the time a well-formed join (a new pool device arriving): the arrival path is fuzzed too.
    request = pb.JoinRequest(device_id=claimed, sample_count=draw(_u64), agent_version=draw(_printable),
                             protocol_version=draw(st.one_of(st.just(1), _u32)), partition_json=partition,
                             resident_bytes=draw(_u64),
                             hardware=pb.HardwareFacts(cpu_model=draw(_printable), cpu_count=draw(_u32)))
    if draw(st.booleans()):
        request.shard_index = draw(_u32)
    return "Join", who, request, draw(_extra_md)


@st.composite
def leave_call(draw, target: Target):
    who = draw(identity(allow_evil=False))
    claimed = draw(st.one_of(st.just(who["device"]), _printable.filter(lambda d: d and d not in HONEST)))
    return "Leave", who, pb.LeaveRequest(device_id=claimed, reason=draw(_printable)), draw(_extra_md)


@st.composite
def pull_call(draw, target: Target):
    who = draw(identity())
    request = pb.PullRequest(device_id=draw(st.one_of(st.just(who["device"]), _printable)), after_round=draw(_u64),
                             wait_s=draw(st.one_of(_floats, st.floats(0, 0.05))))
    return "PullRound", who, request, draw(_extra_md)


@st.composite
def status_call(draw, target: Target):
    return "Status", draw(identity()), pb.StatusRequest(), draw(_extra_md)


DEFECTS = {
    "header": ["round", "s>E", "non-finite field", "other device", "s without payload"],
    "spec": ["shape", "negative dim", "dtype", "missing tensor", "extra tensor", "renamed", "duplicate",
             "nbytes", "total_bytes", "huge total", "crc32", "sha256 alone", "no checksum"],
    "data": ["NaN/Inf values", "truncated", "extra bytes", "flipped byte", "wrong dtype bytes"],
    "stream": ["second header", "data first", "empty stream", "chunk > 1 MiB", "header only"],
    "auth": ["wrong token", "no token", "unknown device", "no device header"],
}


@st.composite
def push_call(draw, target: Target):
    """An update from evil with one defect from each of 1-3 categories (so it can never be valid)."""
    chosen = draw(st.lists(st.sampled_from(sorted(DEFECTS)), min_size=1, max_size=3, unique=True))
    defects = {cat: draw(st.sampled_from(DEFECTS[cat])) for cat in chosen}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    delta = {n: (rng.standard_normal(v.shape) * 0.01).astype(np.float32) for n, v in target.model.items()}
    names = list(delta)
    victim = draw(st.sampled_from(names))
    d = defects.get("data")
    if d == "NaN/Inf values":
        delta[victim].flat[draw(st.integers(0, delta[victim].size - 1))] = draw(st.sampled_from([np.nan, np.inf,
                                                                                                 -np.inf]))
    payload, data = wire.encode(delta)  # checksum over the NaN/Inf: only the finiteness check catches it
    if d == "truncated":
        data = data[:-draw(st.integers(1, len(data)))]
    elif d == "extra bytes":
        data = data + draw(st.binary(min_size=1, max_size=64))
    elif d == "flipped byte":
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    elif d == "wrong dtype bytes":  # float64 bytes under float32 specs (checksum matches the bytes)
        data = np.concatenate([v.astype(np.float64).ravel() for v in delta.values()]).tobytes()
        payload.total_bytes, payload.crc32 = len(data), zlib.crc32(data)
    spec = next(t for t in payload.tensors if t.name == victim)
    s = defects.get("spec")
    if s == "shape":
        spec.shape[-1] += draw(st.integers(1, 5))
    elif s == "negative dim":
        spec.shape[0] = -draw(st.integers(1, 2**62))
    elif s == "dtype":
        spec.dtype = draw(st.sampled_from([pb.FLOAT64, pb.INT64, pb.DTYPE_UNSPECIFIED, 7, 2**31 - 1]))
    elif s == "missing tensor":
        payload.tensors.remove(spec)
    elif s == "extra tensor":
        payload.tensors.add(name="extra", shape=[1], dtype=pb.FLOAT32, nbytes=4)
    elif s == "renamed":
        spec.name = draw(_printable.filter(lambda x: x not in names))
    elif s == "duplicate":
        payload.tensors.add().CopyFrom(spec)
    elif s == "nbytes":
        spec.nbytes = draw(st.integers(0, 2**64 - 1).filter(lambda v: v != spec.nbytes))
    elif s == "total_bytes":
        payload.total_bytes = draw(st.integers(0, 2 * len(data) + 8).filter(lambda v: v != len(data)))
    elif s == "huge total":
        payload.total_bytes = draw(st.integers(2**30, 2**64 - 1))
    elif s == "crc32":
        payload.crc32 = draw(st.integers(0, 2**32 - 1).filter(lambda v: v != payload.crc32))
    elif s == "sha256 alone":  # as an agent before protocol 3 sends it, but wrong
        payload.ClearField("crc32")
        payload.sha256 = draw(st.binary(max_size=40).filter(lambda b: b != hashlib.sha256(data).digest()))
    elif s == "no checksum":
        payload.ClearField("crc32")
    # s >= 1: an s = 0 update with an empty payload is legitimate, and defects could combine into one.
    header = pb.UpdateHeader(device_id=EVIL, round_id=target.round_id, updates_completed=draw(st.integers(1, target.E)),
                             samples_used=draw(_u64), train_s=draw(st.floats(0, 100)), payload=payload,
                             previous_upload_s=draw(st.floats(0, 100)), local_loss=draw(st.floats(0, 10)))
    h = defects.get("header")
    if h == "round":
        header.round_id = draw(st.integers(0, 2**64 - 1).filter(lambda r: r != target.round_id))
    elif h == "s>E":
        header.updates_completed = draw(st.integers(target.E + 1, 2**32 - 1))
    elif h == "non-finite field":
        setattr(header, draw(st.sampled_from(["train_s", "previous_upload_s", "local_loss"])),
                draw(st.sampled_from([np.nan, np.inf, -np.inf])))
    elif h == "other device":
        header.device_id = draw(st.sampled_from(HONEST + POOL))
    elif h == "s without payload":
        header.updates_completed = draw(st.integers(1, target.E))
        header.ClearField("payload")
        data = b""
    who = {"device": EVIL, "token": None}
    a = defects.get("auth")
    if a == "wrong token":
        who["token"] = draw(_printable.filter(lambda t: t != target.client.token))
    elif a == "no token":
        who["bare"] = True
    elif a == "unknown device":
        who["device"] = draw(_printable.filter(lambda x: x and x != EVIL and x not in HONEST))
        header.device_id = who["device"] if draw(st.booleans()) else header.device_id
    elif a == "no device header":
        who["device"] = ""
    messages = [pb.UpdateChunk(header=header)] + [pb.UpdateChunk(data=p) for p in wire.chunks(data)]
    st_defect = defects.get("stream")
    # Inside the update, not after its data: on a Session the update ends at its declared size and
    # what follows belongs to the next exchange, so a message after a complete update spoils nothing.
    inside = draw(st.integers(1, max(1, len(messages) - 1)))
    if st_defect == "second header":
        messages.insert(inside, pb.UpdateChunk(header=header))
    elif st_defect == "data first":
        messages = messages[1:] + messages[:1] if len(messages) > 1 else [pb.UpdateChunk(data=b"x")]
    elif st_defect == "empty stream":
        messages = []
    elif st_defect == "chunk > 1 MiB":
        messages.insert(inside, pb.UpdateChunk(data=bytes(wire.MAX_CHUNK_BYTES + 1)))
    elif st_defect == "header only" and data:
        messages = messages[:1]
    # Breakages, not defects: a message over the 4 MiB limit ends the server's request stream
    # as quietly as a client's cancel, so the server judges whatever came before it, which
    # may be a complete update. Only with a defect in the first message or the metadata is
    # every prefix of the stream a defective update.
    cancel_after = None
    if defects.keys() & {"header", "spec", "auth"}:
        if draw(st.integers(0, 9)) == 0:
            messages.insert(draw(st.integers(0, len(messages))), pb.UpdateChunk(data=bytes(5 * wire.MAX_CHUNK_BYTES)))
        if messages:  # cancelled before message i is sent
            cancel_after = draw(st.one_of(st.none(), st.integers(0, len(messages) - 1)))
    return "PushUpdate", who, (messages, cancel_after, defects), draw(_extra_md)


@st.composite
def session_call(draw, target: Target):
    """A Session stream: a defective update (push_call's) after a pull, or in its place.

    Evil has had the round's model, so its session is offered nothing more: the coordinator
    must refuse a stream that opens with neither a pull nor an update (an update first is
    checked as PushUpdate checks it), and otherwise answer WAIT while the client's time limit
    runs out (DEADLINE_EXCEEDED).
    """
    _, who, (messages, _, defects), extra = draw(push_call(target))
    pull = pb.UpdateChunk(pull=pb.PullRequest(device_id=who["device"], wait_s=draw(_floats)))
    if draw(st.booleans()):
        messages = [pull, *messages]
    return "Session", who, (messages, None, defects), extra


@st.composite
def raw_call(draw, target: Target):
    method = draw(st.sampled_from(["Join", "Leave", "PullRound", "PushUpdate", "Session", "Status", "Nope"]))
    # Not as evil where bytes may decode to a legitimate call: b"" is LeaveRequest(), a departure
    # evil may announce; some bytes decode to a valid s = 0 update.
    who = draw(identity(allow_evil=method not in ("Leave", "PushUpdate")))
    return "raw:" + method, who, draw(st.binary(max_size=200)), draw(_extra_md)


@st.composite
def tcp_garbage(draw, target: Target):
    preface = draw(st.sampled_from([b"", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n"]))
    return "tcp", {}, preface + draw(st.binary(max_size=300)), []


KINDS = {"push": push_call, "session": session_call, "join": join_call, "leave": leave_call, "pull": pull_call,
         "status": status_call, "raw": raw_call, "tcp": tcp_garbage}


def calls(target: Target, only: tuple[str, ...] = ()):
    """All kinds of call (`only`: some kinds, to find which one a problem comes from)."""
    if only:
        return st.one_of(*(KINDS[k](target) for k in only))
    # Updates are the richest surface: a third of the calls.
    return st.one_of(push_call(target), push_call(target), push_call(target), session_call(target), join_call(target),
                     leave_call(target), pull_call(target), status_call(target), raw_call(target), tcp_garbage(target))


# ---- sending -----------------------------------------------------------------------------


def send(target: Target, call) -> str:
    """Make the call; returns its status code name (or "tcp")."""
    kind, who, body, extra = call
    c = target.client
    md = _metadata(c, who, extra) if who else []
    try:
        if kind == "tcp":
            host, _, port = c.address.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=1.0) as sock:
                sock.sendall(body)
                sock.settimeout(0.05)
                try:
                    sock.recv(4096)
                except (TimeoutError, OSError):
                    pass
            return "tcp"
        if kind.startswith("raw:"):
            method = f"/flexfl.v1.Fleet/{kind[4:]}"
            if kind.endswith("PushUpdate"):
                c.channel.stream_unary(method)(iter([body, body[::-1]]), metadata=md, timeout=5)
            elif kind.endswith("PullRound"):
                for _ in c.channel.unary_stream(method)(body, metadata=md, timeout=5):
                    pass
            elif kind.endswith("Session"):
                for _ in c.channel.stream_stream(method)(iter([body, body[::-1]]), metadata=md, timeout=0.5):
                    pass
            else:
                c.channel.unary_unary(method)(body, metadata=md, timeout=5)
            return "OK"
        if kind == "PushUpdate":
            messages, cancel_after, _ = body
            if cancel_after is None:
                c.stub.PushUpdate(iter(messages), metadata=md, timeout=10)
                return "OK"
            sent = threading.Event()

            def gen():
                for i, m in enumerate(messages):
                    if i == cancel_after:
                        sent.set()
                        time.sleep(0.05)  # hold the stream open; the cancel below cuts it
                    yield m

            future = c.stub.PushUpdate.future(gen(), metadata=md, timeout=10)
            future.add_done_callback(lambda _: sent.set())  # the server may end the call first
            sent.wait(10)
            future.cancel()
            future.result()
            return "OK"
        if kind == "PullRound":
            for _ in c.stub.PullRound(body, metadata=md, timeout=10):
                pass
            return "OK"
        if kind == "Session":
            for reply in c.stub.Session(iter(body[0]), metadata=md, timeout=0.5):
                if reply.WhichOneof("kind") == "reply":
                    return "OK (update accepted)"  # never allowed: every update has a defect
            return "OK"
        getattr(c.stub, kind)(body, metadata=md, timeout=10)
        return "OK"
    except grpc.FutureCancelledError:
        return "CANCELLED"
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.UNKNOWN and (exc.details() or "").startswith(_UNDECODABLE_DETAILS):
            return UNDECODABLE
        return exc.code().name


# grpc.aio answers a request it cannot parse with UNKNOWN and these details (the sync server
# said INTERNAL); any other UNKNOWN would be a handler that raised something unmapped.
_UNDECODABLE_DETAILS = "Unexpected <class 'google.protobuf.message.DecodeError'>"
UNDECODABLE = "UNKNOWN (undecodable request)"


def allowed(kind: str, code: str) -> bool:
    """May a call of `kind` end with status `code`?"""
    if kind == "tcp":
        return True
    if code == UNDECODABLE:
        return kind.startswith("raw:")
    c = Code[code] if code in Code.__members__ else None
    if c in TRANSPORT_CODES:
        return True
    if kind.startswith("raw:"):
        # Undecodable bytes: gRPC's own INTERNAL; decodable ones reach the handlers; unknown methods.
        return c in DOMAIN_CODES | {Code.OK, Code.INTERNAL, Code.UNIMPLEMENTED}
    if kind == "PushUpdate":
        return c in DOMAIN_CODES  # every fuzzed update has a defect
    if kind == "Session":
        # Refused (a defect the opening shows), WAITs until the client's limit, or OK for a stream
        # that asked nothing; never an accepted update (send() says "OK (update accepted)").
        return c in DOMAIN_CODES | {Code.OK}
    return c in DOMAIN_CODES | {Code.OK}


def fuzz_grpc(target: Target, examples: int, *, random_seed: int = 0, check_every: int = 250,
              on_check=None, only: tuple[str, ...] = ()) -> Counter:
    """Send `examples` generated calls; returns {(kind, code): count}. Raises on a broken property."""
    done = [0]

    @seed(random_seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data) -> None:
        call = data.draw(calls(target, only))
        kind = call[0]
        code = send(target, call)
        target.tally[(kind, code)] += 1
        shown = call[2][2] if kind in ("PushUpdate", "Session") else call
        assert allowed(kind, code), f"{kind} ended with {code}: {shown}"
        done[0] += 1
        if done[0] % check_every == 0 and on_check is not None:
            on_check(done[0])

    with draws_from_seed_alone():  # the calls of a seed, not of what the process imported before
        one()
    return target.tally

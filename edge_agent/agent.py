"""The edge agent: learn the partition, load its shard, join; then pull a round, train, upload; repeat.

Rounds and updates travel on one long-lived Session stream (proto/fleet.proto), reopened
after any error; against a coordinator without it (UNIMPLEMENTED) the agent makes a
PullRound and a PushUpdate call per round instead.

Deadline rule (edge_agent.deadline): after receiving the model the agent has `deadline_s`.
Before each local update it checks that the time left covers one more update plus the
upload (both estimated from what it measured so far) plus a small margin; otherwise it
stops and uploads what it has. It always dials the coordinator and reconnects with
exponential backoff when the coordinator is away. It decides on status codes and the coordinator's
error reason (proto/options.py), never on message text.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import torch
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import fleet_pb2_grpc as pb_grpc
from flexfl.proto import tensors as wire
from flexfl.proto.options import AUTH_HEADER, DEVICE_HEADER, GRPC_OPTIONS, PROTOCOL_VERSION, ErrorReason, error_reason

from edge_agent.config import AgentConfig
from edge_agent.deadline import Estimates, Refusal, RoundBudget, StopReason, why_stopped
from edge_agent.memory import ProcessMemory, release_freed
from edge_agent.trainer import device_rng, train_local
from flexfl import __version__
from flexfl.errors import ConfigError, FlexFLError
from flexfl.net import reach_problem
from loadgen.hostinfo import host_facts
from workloads.datasets import ArrayDataset
from workloads.federated import load_shard
from workloads.models import build_model
from workloads.partition_spec import PartitionSpec

log = logging.getLogger(__name__)

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED}


class AgentError(FlexFLError):
    """The agent cannot go on (its token or partition is refused, ...)."""


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

    def next_round(self, *, limit_s: float) -> tuple[pb.RoundHeader, bytes]:
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
            if self._expired.is_set():
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


class _SlowDevicePadding:
    """participation.min_update_s: each local update lasts at least that long (an emulated slower device).

    Not part of the deadline rule (edge_agent.deadline): the rule sees padded updates
    through the clock and its update estimate, as it would see a slower CPU.
    """

    def __init__(self, min_update_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.min_update_s, self._clock, self._sleep = min_update_s, clock, sleep
        self._started = clock()

    def start_update(self) -> None:
        self._started = self._clock()

    def finish_update(self) -> None:
        """Sleep until the update started last has lasted min_update_s."""
        if self.min_update_s:
            self._sleep(max(0.0, self._started + self.min_update_s - self._clock()))


def hardware_facts() -> pb.HardwareFacts:
    """CPU, memory and OS facts (loadgen.hostinfo, from psutil and platform), sent when joining."""
    f = host_facts()
    return pb.HardwareFacts(
        cpu_model=f["cpu_model"] or f["machine"], cpu_count=f["cpu_count_logical"] or 0,
        memory_bytes=f["memory_bytes"], os=f["os"], machine=f["machine"], python=f["python"],
        hostname=f["hostname"],
    )


class EdgeAgent:
    """One device. run() loops until training finishes, stop() is called, or the coordinator refuses it.

    `shard` is the device's training data when the caller already holds it; by default the
    agent loads its shard of the coordinator's partition before joining.
    """

    def __init__(self, cfg: AgentConfig, *, shard: ArrayDataset | None = None) -> None:
        self.cfg = cfg
        self.shard = shard
        self._token = cfg.token()
        self._stop = threading.Event()
        self._leave_on_stop = False
        self.device_index: int | None = None
        self.partition: PartitionSpec | None = None
        self.rounds_done: list[dict] = []  # what this agent did per round (tests, logs)
        self._model: torch.nn.Module | None = None
        self.estimates = Estimates()  # one local update and one upload, as measured so far (the deadline rule's)
        self._trace = self._load_trace()
        self._samplers: dict[tuple, object] = {}
        self._channel = self._make_channel()
        self._stub = pb_grpc.FleetStub(self._channel)
        self._session: _Session | None = None
        self.per_round_calls = False  # the coordinator has no Session: a PullRound and a PushUpdate per round

    # ---- lifecycle -------------------------------------------------------------------

    def stop(self, *, announce: bool | None = None) -> None:
        """Stop after the current step; announce a departure if configured (or told) to."""
        self._leave_on_stop = self.cfg.announce_departure if announce is None else announce
        self._stop.set()

    def run(self) -> int:
        """Returns 0 when training finished or the agent was stopped."""
        try:
            try:
                self._prepare()
                if self._stop.is_set():  # stopped while waiting for its scripted arrival round
                    return 0
                after_round = self._join()
            except AgentError:
                if self._stop.is_set():  # stopped while still trying to reach the coordinator
                    return 0
                raise
            leave_after = self.cfg.participation.leave_after_round
            while not self._stop.is_set():
                header, data = self._pull(after_round)
                if header is None or self._stop.is_set():
                    continue
                if header.status == pb.RoundHeader.FINISHED:
                    log.info("%s: training finished", self.cfg.device_id)
                    return 0
                if header.status != pb.RoundHeader.ROUND:
                    after_round = max(after_round, header.round_id)
                    continue
                record = self._do_round(header, data)
                del data  # the model's bytes, not kept while waiting for the next round
                self._round_done(record)
                after_round = header.round_id
                if leave_after and header.round_id >= leave_after:
                    log.info("%s: leaving after round %d as scripted", self.cfg.device_id, header.round_id)
                    self.stop(announce=True)
            self._end_session()
            if self._leave_on_stop:
                self._leave()
            return 0
        finally:
            self._end_session()
            self._channel.close()

    # ---- RPCs ------------------------------------------------------------------------

    def _metadata(self) -> list[tuple[str, str]]:
        return [(AUTH_HEADER, f"Bearer {self._token}"), (DEVICE_HEADER, self.cfg.device_id)]

    def _make_channel(self) -> grpc.Channel:
        c = self.cfg
        options = list(GRPC_OPTIONS)
        if c.tls_server_name:
            options.append(("grpc.ssl_target_name_override", c.tls_server_name))
        if c.tls_ca:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(c.tls_ca, what="tls_ca"),
                private_key=_read(c.tls_client_key, what="tls_client_key") if c.tls_client_key else None,
                certificate_chain=_read(c.tls_client_cert, what="tls_client_cert") if c.tls_client_cert else None,
            )
            return grpc.secure_channel(c.coordinator, creds, options=options)
        return grpc.insecure_channel(c.coordinator, options=options)

    def _retrying(self, what: str, call):
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

    def status(self) -> pb.StatusReply:
        """The coordinator's state (retried while it is away)."""
        try:
            return self._retrying("status", lambda: self._stub.Status(
                pb.StatusRequest(), metadata=self._metadata(), timeout=self.cfg.rpc_timeout_s))
        except grpc.RpcError as exc:
            raise self._refused("status", exc) from None

    def _prepare(self) -> None:
        """Learn the coordinator's partition and load this device's shard of it (before joining)."""
        theirs = PartitionSpec.from_json(self.status().partition_json, where=f"coordinator {self.cfg.coordinator}")
        mine = self.cfg.partition
        if mine is not None and mine != theirs:
            raise AgentError(f"{self.cfg.device_id}: this device's partition [{mine.describe()}] differs from the "
                             f"coordinator's [{theirs.describe()}] (device vs coordinator: "
                             f"{'; '.join(mine.differences(theirs))}); fix [partition] in one of the configs")
        # The local copy keeps where this machine keeps its data (emnist_root).
        self.partition = mine if mine is not None else theirs
        if self.shard is None and not self.cfg.participation.no_train:
            started = time.monotonic()
            self.shard = load_shard(self.partition, self.cfg.shard_index, as_bytes=True)
            log.info("%s: shard %d of [%s]: %d samples (%.1f s)", self.cfg.device_id, self.cfg.shard_index,
                     self.partition.describe(), len(self.shard), time.monotonic() - started)
        self._wait_for_join_round()

    def _wait_for_join_round(self) -> None:
        target = self.cfg.participation.join_in_round
        while target and not self._stop.is_set():
            st = self.status()
            if st.open_round >= target or st.completed_round >= target or st.finished:
                if st.open_round != target:
                    log.warning("%s: asked to join in round %d, joining in round %d", self.cfg.device_id, target,
                                st.open_round or st.completed_round + 1)
                return
            self._stop.wait(0.02)

    def _join(self) -> int:
        request = pb.JoinRequest(device_id=self.cfg.device_id, sample_count=len(self.shard) if self.shard else 0,
                                 hardware=hardware_facts(), agent_version=__version__,
                                 protocol_version=PROTOCOL_VERSION, shard_index=self.cfg.shard_index,
                                 partition_json=self.partition.to_json() if self.partition else "",
                                 resident_bytes=psutil.Process().memory_info().rss)
        try:
            reply = self._retrying("join", lambda: self._stub.Join(request, metadata=self._metadata(),
                                                                    timeout=self.cfg.rpc_timeout_s))
        except grpc.RpcError as exc:
            raise self._refused("join", exc) from None
        self.device_index = reply.device_index
        log.info("%s joined as index %d%s (coordinator at round %d, %.0f MiB resident)", self.cfg.device_id,
                 reply.device_index, ", an arrival" if reply.arrival else "", reply.current_round,
                 request.resident_bytes / 2**20)
        return reply.current_round

    def _leave(self) -> None:
        try:
            reply = self._stub.Leave(pb.LeaveRequest(device_id=self.cfg.device_id, reason="agent stopped"),
                                     metadata=self._metadata(), timeout=5)
            log.info("%s: departure announced (coordinator policy: %s)", self.cfg.device_id, reply.policy)
        except grpc.RpcError as exc:
            log.warning("%s: could not announce departure to %s: %s", self.cfg.device_id, self.cfg.coordinator,
                        exc.code().name)

    def _pull(self, after_round: int) -> tuple[pb.RoundHeader | None, bytes]:
        try:
            return self._retrying("pull", lambda: self._call_pull(self._pull_request(after_round)))
        except grpc.RpcError as exc:
            if error_reason(exc) == ErrorReason.UNKNOWN_DEVICE:
                # The coordinator lost us (fresh start without --resume): join again.
                log.info("%s: the coordinator does not know this device (restarted?); joining again",
                         self.cfg.device_id)
                self._join()
                return None, b""
            if self._stop.is_set():
                return None, b""
            raise self._refused("pull", exc) from None

    def _pull_request(self, after_round: int) -> pb.PullRequest:
        return pb.PullRequest(device_id=self.cfg.device_id, after_round=after_round, wait_s=self.cfg.pull_wait_s)

    def _call_pull(self, request: pb.PullRequest) -> tuple[pb.RoundHeader, bytes]:
        """The next offer: from the session stream (opened if need be), or by a PullRound call."""
        if not self.per_round_calls:
            fresh = self._session is None
            if fresh:
                self._session = _Session(self._stub, self._metadata(), request)
            try:
                return self._session.next_round(limit_s=self.cfg.pull_wait_s + self.cfg.rpc_timeout_s)
            except grpc.RpcError as exc:
                self._end_session()
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

    def _end_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    # ---- one round -------------------------------------------------------------------

    def _do_round(self, header: pb.RoundHeader, data: bytes) -> dict:
        received = time.monotonic()
        deadline = received + header.deadline_s
        model = self._ensure_model(header.model)
        expected = {n: (tuple(p.shape), np.dtype(np.float32)) for n, p in model.named_parameters()}
        params = wire.decode(header.payload, data, expected=expected)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(torch.from_numpy(params[n]))
        E = header.required_updates
        cap = self._cap(header)
        part = self.cfg.participation
        budget = RoundBudget(deadline_at=deadline, estimates=self.estimates, margin_s=self.cfg.safety_margin_s)
        padding = _SlowDevicePadding(part.min_update_s)
        refusal: Refusal | None = None  # the budget's no to the next update, if it said one
        stopping = False  # the agent stopped training to shut down

        def keep_going(done: int) -> bool:
            nonlocal refusal, stopping
            if done:
                padding.finish_update()  # before the rule looks at the clock: the padding is part of the update
            padding.start_update()
            if self._stop.is_set():
                stopping = True
                return False
            if part.forced_updates:  # forced participation ignores time (tests, no deadline pressure)
                return True
            refusal = budget.refusal()
            return refusal is None

        started = time.monotonic()
        if part.no_train:
            delta = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
            s, samples, loss = cap, 0, 0.0
        else:
            result = train_local(model, self.shard, updates=cap, lr=header.learning_rate, batch_size=header.batch_size,
                                 rng=device_rng(header.seed, header.round_id, header.device_index),
                                 unit=header.unit or "step", keep_going=keep_going, mu=header.proximal_mu)
            delta, s, samples, loss = result.delta, result.updates_completed, result.samples_used, result.mean_loss
            model.zero_grad(set_to_none=True)  # the last step's gradients (the model's size), not kept between rounds
            if s:
                padding.finish_update()
                self.estimates.measured_updates(updates=s, seconds=time.monotonic() - started)
        train_s = time.monotonic() - started
        why = why_stopped(s=s, E=E, refusal=refusal, agent_stopping=stopping)
        payload, body = wire.encode(delta) if s else (pb.Payload(), b"")
        up = pb.UpdateHeader(device_id=self.cfg.device_id, round_id=header.round_id, updates_completed=s,
                             samples_used=samples, train_s=train_s, previous_upload_s=self.estimates.upload_s or 0.0,
                             local_loss=loss if np.isfinite(loss) else 0.0, payload=payload,
                             stop_reason=wire_stop_reason(why))
        t0 = time.monotonic()
        outcome, taken = self._push(up, body, timeout=max(1.0, deadline - time.monotonic() + 2.0))
        if body and taken:
            self.estimates.measured_upload(time.monotonic() - t0)
        elif body:
            self.estimates.upload_failed(time.monotonic() - t0)
        else:
            # An empty (s = 0) push measures nothing, so an estimate too long for the deadline
            # would never be measured again and one slow stretch of link would idle the device
            # for good (seen in the soak). Each unmeasured round shrinks it until it tries again.
            self.estimates.sent_no_update()
        return {"round": header.round_id, "s": s, "E": E, "cap": cap, "why": str(why), "train_s": train_s,
                "upload_s": self.estimates.upload_s, "outcome": outcome, "lr": header.learning_rate}

    def _round_done(self, record: dict) -> None:
        """Keep and log what the round did, with the process's memory once the round's buffers are given back."""
        release_freed()
        memory = ProcessMemory.now()
        record.update(resident_mib=memory.resident_mib, anonymous_mib=memory.anonymous_mib, peak_mib=memory.peak_mib)
        self.rounds_done.append(record)
        log.info("%s round %d: s = %d/%d (%s) in %.2f s, upload %.2f s: %s; resident %.1f MiB (%.1f anonymous), "
                 "peak %.1f MiB", self.cfg.device_id, record["round"], record["s"], record["E"], record["why"],
                 record["train_s"],
                 record["upload_s"] or 0.0, record["outcome"], memory.resident_mib, memory.anonymous_mib,
                 memory.peak_mib)

    def _push(self, header: pb.UpdateHeader, body: bytes, *, timeout: float) -> tuple[str, bool]:
        """Send the update; (the coordinator's message, True), or (what went wrong, False)."""
        def messages() -> Iterator[pb.UpdateChunk]:
            yield pb.UpdateChunk(header=header)
            if body:
                for piece in wire.chunks(body, size=wire.UPLOAD_CHUNK_BYTES):
                    yield pb.UpdateChunk(data=piece)

        try:
            if self._session is not None:
                return self._session.push(messages(), limit_s=timeout).message, True
            return self._stub.PushUpdate(messages(), metadata=self._metadata(), timeout=timeout).message, True
        except grpc.RpcError as exc:
            # A late or rejected update is this round's loss, not the agent's end. A refusal ends
            # the session stream: the next pull opens a new one.
            self._end_session()
            return f"rejected: {exc.code().name}: {exc.details()}", False

    def _ensure_model(self, desc: pb.ModelDescription) -> torch.nn.Module:
        if self._model is None:
            self._model = build_model(desc.architecture, in_features=desc.in_features or None,
                                      num_classes=desc.num_classes)
        return self._model

    def _cap(self, header: pb.RoundHeader) -> int:
        """Most updates this round may do: E, or what the forced schedule / participation trace allows."""
        from trace_recorder.sampler import TraceSampler

        part, E = self.cfg.participation, header.required_updates
        if part.forced_updates:
            return min(E, part.forced_updates[(header.round_id - 1) % len(part.forced_updates)])
        if self._trace is None:
            return E
        key = (E, header.seed, header.device_index, header.trace_sampling, header.s_rule)
        if key not in self._samplers:  # the simulator's sampler, with the coordinator's seed and rules
            self._samplers[key] = TraceSampler(self._trace, E=E, seed=header.seed, device_index=header.device_index,
                                               sampling=header.trace_sampling or "iid", s_rule=header.s_rule or "round")
        return self._samplers[key].draw(header.round_id)

    def _load_trace(self):
        spec = self.cfg.participation.trace
        if not spec:
            return None
        from trace_recorder.format import read_trace_set

        folder, _, name = spec.rpartition(":")
        return read_trace_set(Path(folder)).get(name)


def wire_stop_reason(why: StopReason) -> int:
    """The update header's stop_reason for `why` (fleet.proto names each value after its member)."""
    return pb.StopReason.Value(f"STOP_REASON_{why.name}")


def _read(path: str, *, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None

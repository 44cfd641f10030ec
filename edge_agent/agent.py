"""The edge agent: join, then pull a round, train until the time budget runs out, upload; repeat.

Deadline rule: after receiving the model the agent has `deadline_s`. Before each local
update it checks that the time left covers one more update plus the upload (both
estimated from what it measured so far) plus a small margin; otherwise it stops and
uploads what it has. It always dials the coordinator and reconnects with exponential
backoff when the coordinator is away.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import torch

from edge_agent.config import AgentConfig
from edge_agent.trainer import device_rng, train_local
from flexfl import __version__
from flexfl.errors import ConfigError, FlexFLError
from loadgen.hostinfo import host_facts
from proto import fleet_pb2 as pb
from proto import fleet_pb2_grpc as pb_grpc
from proto import tensors as wire
from proto.options import AUTH_HEADER, DEVICE_HEADER, GRPC_OPTIONS, PROTOCOL_VERSION
from trace_recorder.replay import fraction_to_updates
from workloads.datasets import ArrayDataset
from workloads.models import build_model

log = logging.getLogger(__name__)

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.RESOURCE_EXHAUSTED}


class AgentError(FlexFLError):
    """The agent cannot go on (e.g. its token is refused)."""


def hardware_facts() -> pb.HardwareFacts:
    """CPU, memory and OS facts (loadgen.hostinfo, from psutil and platform), sent when joining."""
    f = host_facts()
    return pb.HardwareFacts(
        cpu_model=f["cpu_model"] or f["machine"], cpu_count=f["cpu_count_logical"] or 0,
        memory_bytes=f["memory_bytes"], os=f["os"], machine=f["machine"], python=f["python"],
        hostname=f["hostname"],
    )


class EdgeAgent:
    """One device. run() loops until training finishes, stop() is called, or the token is refused."""

    def __init__(self, cfg: AgentConfig, shard: ArrayDataset) -> None:
        self.cfg = cfg
        self.shard = shard
        self._token = cfg.token()
        self._stop = threading.Event()
        self._leave_on_stop = False
        self.device_index: int | None = None
        self.rounds_done: list[dict] = []  # what this agent did per round (tests, logs)
        self._model: torch.nn.Module | None = None
        self._update_s: float | None = None  # running estimate of one local update
        self._upload_s: float | None = None  # last measured upload
        self._trace = self._load_trace()
        self._channel = self._make_channel()
        self._stub = pb_grpc.FleetStub(self._channel)

    # ---- lifecycle -------------------------------------------------------------------

    def stop(self, *, announce: bool | None = None) -> None:
        """Stop after the current step; announce a departure if configured (or told) to."""
        self._leave_on_stop = self.cfg.announce_departure if announce is None else announce
        self._stop.set()

    def run(self) -> int:
        """Returns 0 when training finished or the agent was stopped."""
        try:
            try:
                after_round = self._join()
            except AgentError:
                if self._stop.is_set():  # stopped while still trying to reach the coordinator
                    return 0
                raise
            while not self._stop.is_set():
                header, data = self._pull(after_round)
                if header is None:
                    continue
                if header.status == pb.RoundHeader.FINISHED:
                    log.info("%s: training finished", self.cfg.device_id)
                    return 0
                if header.status != pb.RoundHeader.ROUND:
                    after_round = max(after_round, header.round_id)
                    continue
                self._do_round(header, data)
                after_round = header.round_id
            if self._leave_on_stop:
                self._leave()
            return 0
        finally:
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
                root_certificates=c.path(c.tls_ca).read_bytes(),
                private_key=c.path(c.tls_client_key).read_bytes() if c.tls_client_key else None,
                certificate_chain=c.path(c.tls_client_cert).read_bytes() if c.tls_client_cert else None,
            )
            return grpc.secure_channel(c.coordinator, creds, options=options)
        return grpc.insecure_channel(c.coordinator, options=options)

    def _retrying(self, what: str, call):
        """Run `call()` until it succeeds, retrying with exponential backoff while the coordinator is away."""
        delay = self.cfg.backoff_initial_s
        while True:
            try:
                return call()
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or self._stop.is_set():
                    raise
                log.info("%s: %s failed (%s); retrying in %.1f s", self.cfg.device_id, what, exc.code().name, delay)
                if self._stop.wait(delay * (0.8 + 0.4 * random.random())):
                    raise
                delay = min(delay * 2, self.cfg.backoff_max_s)

    def _join(self) -> int:
        request = pb.JoinRequest(device_id=self.cfg.device_id, sample_count=len(self.shard), hardware=hardware_facts(),
                                 agent_version=__version__, protocol_version=PROTOCOL_VERSION,
                                 shard_index=self.cfg.data.shard_index)
        try:
            reply = self._retrying("join", lambda: self._stub.Join(request, metadata=self._metadata(),
                                                                    timeout=self.cfg.rpc_timeout_s))
        except grpc.RpcError as exc:
            raise AgentError(f"{self.cfg.device_id}: join refused: {exc.code().name}: {exc.details()}") from None
        self.device_index = reply.device_index
        log.info("%s joined as index %d%s (coordinator at round %d)", self.cfg.device_id, reply.device_index,
                 ", an arrival" if reply.arrival else "", reply.current_round)
        return reply.current_round

    def _leave(self) -> None:
        try:
            reply = self._stub.Leave(pb.LeaveRequest(device_id=self.cfg.device_id, reason="agent stopped"),
                                     metadata=self._metadata(), timeout=5)
            log.info("%s: departure announced (coordinator policy: %s)", self.cfg.device_id, reply.policy)
        except grpc.RpcError as exc:
            log.warning("%s: could not announce departure: %s", self.cfg.device_id, exc.code().name)

    def _pull(self, after_round: int) -> tuple[pb.RoundHeader | None, bytes]:
        def call():
            stream = self._stub.PullRound(
                pb.PullRequest(device_id=self.cfg.device_id, after_round=after_round, wait_s=self.cfg.pull_wait_s),
                metadata=self._metadata(), timeout=self.cfg.pull_wait_s + self.cfg.rpc_timeout_s)
            first = next(stream)
            if first.header.status != pb.RoundHeader.ROUND:
                stream.cancel()
                return first.header, b""
            data = wire.join((c.data for c in stream), limit_bytes=first.header.payload.total_bytes)
            return first.header, data

        try:
            return self._retrying("pull", call)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED and "unknown device" in (exc.details() or ""):
                # The coordinator lost us (fresh start without --resume): join again.
                self._join()
                return None, b""
            if self._stop.is_set():
                return None, b""
            raise AgentError(f"{self.cfg.device_id}: pull failed: {exc.code().name}: {exc.details()}") from None

    # ---- one round -------------------------------------------------------------------

    def _do_round(self, header: pb.RoundHeader, data: bytes) -> None:
        received = time.monotonic()
        deadline = received + header.deadline_s
        model = self._ensure_model(header.model)
        expected = {n: (tuple(p.shape), np.dtype(np.float32)) for n, p in model.named_parameters()}
        params = wire.decode(header.payload, data, expected=expected)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(torch.from_numpy(params[n]))
        E = header.required_updates
        cap = self._cap(header.round_id, E)
        part = self.cfg.participation

        last = [time.monotonic()]

        def keep_going(done: int) -> bool:
            if part.min_update_s and done:
                # Pad the update that just finished (emulated slow device), then measure as usual.
                time.sleep(max(0.0, last[0] + part.min_update_s - time.monotonic()))
            last[0] = time.monotonic()
            if self._stop.is_set():
                return False
            if part.forced_updates:  # forced participation ignores time (tests, no deadline pressure)
                return True
            need = (self._update_s or 0.0) + (self._upload_s or 0.0) + self.cfg.safety_margin_s
            return time.monotonic() + need <= deadline

        started = time.monotonic()
        if part.no_train:
            delta = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
            s, samples, loss = cap, 0, 0.0
        else:
            result = train_local(model, self.shard, updates=cap, lr=header.learning_rate, batch_size=header.batch_size,
                                 rng=device_rng(header.seed, header.round_id, header.device_index),
                                 unit=header.unit or "step", keep_going=keep_going)
            delta, s, samples, loss = result.delta, result.updates_completed, result.samples_used, result.mean_loss
            if part.min_update_s and s:
                time.sleep(max(0.0, last[0] + part.min_update_s - time.monotonic()))
            if s:
                per_update = (time.monotonic() - started) / s
                self._update_s = per_update if self._update_s is None else 0.5 * self._update_s + 0.5 * per_update
        train_s = time.monotonic() - started
        payload, body = wire.encode(delta) if s else (pb.Payload(), b"")
        up = pb.UpdateHeader(device_id=self.cfg.device_id, round_id=header.round_id, updates_completed=s,
                             samples_used=samples, train_s=train_s, previous_upload_s=self._upload_s or 0.0,
                             local_loss=loss if np.isfinite(loss) else 0.0, payload=payload)
        t0 = time.monotonic()
        outcome = self._push(up, body, timeout=max(1.0, deadline - time.monotonic() + 2.0))
        if body:  # an empty (s = 0) push says nothing about how long a real upload takes
            self._upload_s = time.monotonic() - t0
        self.rounds_done.append({"round": header.round_id, "s": s, "E": E, "train_s": train_s,
                                 "upload_s": self._upload_s, "outcome": outcome, "lr": header.learning_rate})
        log.info("%s round %d: s = %d/%d in %.2f s, upload %.2f s: %s", self.cfg.device_id, header.round_id, s, E,
                 train_s, self._upload_s, outcome)

    def _push(self, header: pb.UpdateHeader, body: bytes, *, timeout: float) -> str:
        def messages() -> Iterator[pb.UpdateChunk]:
            yield pb.UpdateChunk(header=header)
            if body:
                for piece in wire.chunks(body):
                    yield pb.UpdateChunk(data=piece)

        try:
            reply = self._stub.PushUpdate(messages(), metadata=self._metadata(), timeout=timeout)
            return reply.message
        except grpc.RpcError as exc:
            # A late or rejected update is this round's loss, not the agent's end.
            return f"rejected: {exc.code().name}: {exc.details()}"

    def _ensure_model(self, desc: pb.ModelDescription) -> torch.nn.Module:
        if self._model is None:
            self._model = build_model(desc.architecture, in_features=desc.in_features or None,
                                      num_classes=desc.num_classes)
        return self._model

    def _cap(self, round_id: int, E: int) -> int:
        """Most updates this round may do: E, or what the forced schedule / participation trace allows."""
        part = self.cfg.participation
        if part.forced_updates:
            return min(E, part.forced_updates[(round_id - 1) % len(part.forced_updates)])
        if self._trace is not None:
            fractions = self._trace.fraction
            if part.trace_sampling == "replay":
                f = fractions[(round_id - 1) % len(fractions)]
            else:
                f = fractions[np.random.default_rng([self.device_index or 0, round_id, 4]).integers(len(fractions))]
            return int(fraction_to_updates(np.array([f]), E=E)[0])
        return E

    def _load_trace(self):
        spec = self.cfg.participation.trace
        if not spec:
            return None
        from trace_recorder.format import read_trace_set

        folder, _, name = spec.rpartition(":")
        if not folder or not name:
            raise ConfigError(f"participation.trace must be FOLDER:NAME, got {spec!r}")
        return read_trace_set(self.cfg.path(folder)).get(name)


def load_shard(cfg: AgentConfig) -> ArrayDataset:
    """This device's training data: shard `shard_index` of the seeded partition the coordinator also uses."""
    from workloads.federated import build_federated

    d = cfg.data
    if not 0 <= d.shard_index < d.n_devices:
        raise ConfigError(f"data.shard_index {d.shard_index} is outside 0..{d.n_devices - 1}")
    data = build_federated(d.dataset, n_devices=d.n_devices, iid=d.iid, seed=d.data_seed, alpha=d.alpha, beta=d.beta,
                           total_samples=d.total_samples or None, sizes=d.sizes)
    return data.train[d.shard_index]

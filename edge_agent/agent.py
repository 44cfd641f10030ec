"""The edge agent: learn the partition, load its shard, join; then pull a round, train, upload; repeat.

Three parts, as on the coordinator's side: the transport (edge_agent/transport.py: the
channel, the Session stream, retries with backoff, protobuf) delivers each round as records
(flexfl/exchange.py); the device's round (edge_agent/device_round.py) trains under the
deadline rule (edge_agent/deadline.py) and says what it did; this module runs the loop
between them: joining, scripted arrivals and departures, and what each round is kept as. Its log
records go to the coordinator after each round (edge_agent/log_shipping.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import psutil
import torch

from edge_agent.config import AgentConfig
from edge_agent.deadline import Estimates
from edge_agent.device_round import RoundCaps, expected_parameters, run_round
from edge_agent.log_shipping import LogBuffer, ship
from edge_agent.memory import ProcessMemory, release_freed
from edge_agent.transport import AgentError, Delivery, Expected, Transport, UnknownDevice
from flexfl import __version__
from flexfl.exchange import Join, ModelDescription, OfferStatus, RoundTerms
from flexfl.vocabulary import StopReason
from loadgen.hostinfo import host_facts
from workloads.datasets import ArrayDataset
from workloads.federated import load_shard
from workloads.models import build_model
from workloads.partition_spec import PartitionSpec

log = logging.getLogger(__name__)

__all__ = ["AgentError", "EdgeAgent", "RoundDone", "hardware_facts"]


@dataclass(frozen=True)
class RoundDone:
    """What this agent did in one round, as kept (EdgeAgent.rounds_done) and logged."""

    round_id: int
    s: int
    E: int
    cap: int  # the most updates the round allowed (E, or its forced schedule / trace draw)
    why: StopReason
    train_s: float
    upload_s: float | None  # the upload estimate after this round (None: never measured)
    outcome: str  # the coordinator's answer to the update, or what went wrong
    lr: float
    memory: ProcessMemory  # the process's, once the round's buffers were given back


def hardware_facts() -> dict[str, object]:
    """CPU, memory and OS facts (loadgen.hostinfo, from psutil and platform), sent when joining."""
    f = host_facts()
    return {"cpu_model": f["cpu_model"] or f["machine"], "cpu_count": f["cpu_count_logical"] or 0,
            "memory_bytes": f["memory_bytes"], "os": f["os"], "machine": f["machine"], "python": f["python"],
            "hostname": f["hostname"]}


class EdgeAgent:
    """One device. run() loops until training finishes, stop() is called, or the coordinator refuses it.

    `shard` is the device's training data when the caller already holds it; by default the
    agent loads its shard of the coordinator's partition before joining.
    """

    def __init__(self, cfg: AgentConfig, *, shard: ArrayDataset | None = None,
                 log_buffer: LogBuffer | None = None) -> None:
        self.cfg = cfg
        self.log_buffer = log_buffer  # this process's log records, sent to the coordinator (edge_agent/log_shipping.py)
        self.shard = shard
        self._stop = threading.Event()
        self._leave_on_stop = False
        self.device_index: int | None = None
        self.run_id = ""  # the run it joined (serve_runs waits for another one once it finished)
        self._given_shard = shard is not None  # a caller's shard is kept across runs; a loaded one is reloaded
        self.partition: PartitionSpec | None = None
        self.rounds_done: list[RoundDone] = []  # what this agent did per round (tests, logs)
        self._model: torch.nn.Module | None = None
        self.estimates = Estimates()  # one local update and one upload, as measured so far (the deadline rule's)
        self._caps = RoundCaps(cfg.participation)
        self.transport = Transport(cfg, stop=self._stop)

    @property
    def per_round_calls(self) -> bool:
        """The coordinator has no Session stream: a PullRound and a PushUpdate call per round."""
        return self.transport.per_round_calls

    # ---- lifecycle -------------------------------------------------------------------

    def stop(self, *, announce: bool | None = None) -> None:
        """Stop after the current step; announce a departure if configured (or told) to."""
        self._leave_on_stop = self.cfg.announce_departure if announce is None else announce
        self._stop.set()

    def run(self) -> int:
        """Returns 0 when training finished or the agent was stopped; with serve_runs, goes on to the next run."""
        try:
            while self._one_run() and self.cfg.serve_runs and not self._stop.is_set():
                self._await_next_run()
            return 0
        except AgentError as exc:
            if self.log_buffer is not None:  # the copy the coordinator keeps says why it ended (the CLI says it here)
                self.log_buffer.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s: stopping: %s",
                                                      (self.cfg.device_id, exc), None))
            raise
        finally:
            self._send_log(timeout_s=3.0)
            self.transport.close()

    def _send_log(self, *, timeout_s: float = 10.0) -> None:
        """Send the log records kept since the last time (a failure leaves them for the next try)."""
        if self.log_buffer is not None:
            ship(self.log_buffer, partial(self.transport.send_log, timeout_s=timeout_s))

    def _one_run(self) -> bool:
        """Take part in the coordinator's run; True when it finished training, False when this agent stopped."""
        try:
            self._prepare()
            if self._stop.is_set():  # stopped while waiting for its scripted arrival round
                return False
            after_round = self._join()
            self._send_log()
        except AgentError:
            if self._stop.is_set():  # stopped while still trying to reach the coordinator
                return False
            raise
        leave_after = self.cfg.participation.leave_after_round
        while not self._stop.is_set():
            delivery = self._pull(after_round)
            if delivery is None or self._stop.is_set():
                continue
            offer = delivery.offer
            if offer.status == OfferStatus.FINISHED:
                log.info("%s: training finished", self.cfg.device_id)
                self.transport.end_session()
                self._send_log()
                return True
            if offer.terms is None:  # WAIT (or a status this agent does not know)
                after_round = max(after_round, offer.round_id)
                continue
            finish = self._do_round(offer.round_id, offer.terms, received_at=delivery.received_at)
            del delivery, offer  # the model's tensors: given back before the round's memory is read
            self._round_done(finish)
            self._send_log()
            after_round = self.rounds_done[-1].round_id
            if leave_after and after_round >= leave_after:
                log.info("%s: leaving after round %d as scripted", self.cfg.device_id, after_round)
                self.stop(announce=True)
        self.transport.end_session()
        if self._leave_on_stop:
            self._leave()
        return False

    def _await_next_run(self) -> None:
        """serve_runs: wait (Status, retried while no coordinator answers) until a run other than the finished one
        is under way, then start afresh: its partition may differ, and nothing measured in the last run carries
        over (another deadline, model or load)."""
        finished = self.run_id
        log.info("%s: waiting for the coordinator's next run (serve_runs)", self.cfg.device_id)
        while not self._stop.is_set():
            try:
                st = self.transport.status()
            except AgentError:
                if self._stop.is_set():
                    return
                raise
            if st.run_id != finished and not st.finished:
                break
            self._stop.wait(1.0)
        if not self._given_shard:
            self.shard = None  # the next run's partition may split the data otherwise
        self.device_index = None
        self.rounds_done = []
        self.estimates = Estimates()

    # ---- the coordinator -------------------------------------------------------------

    def _prepare(self) -> None:
        """Learn the coordinator's partition and load this device's shard of it (before joining)."""
        theirs = PartitionSpec.from_json(self.transport.status().partition_json,
                                         where=f"coordinator {self.cfg.coordinator}")
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
            st = self.transport.status()
            if st.open_round >= target or st.completed_round >= target or st.finished:
                if st.open_round != target:
                    log.warning("%s: asked to join in round %d, joining in round %d", self.cfg.device_id, target,
                                st.open_round or st.completed_round + 1)
                return
            self._stop.wait(0.02)

    def _join(self) -> int:
        join = Join(device_id=self.cfg.device_id, sample_count=len(self.shard) if self.shard else 0,
                    shard_index=self.cfg.shard_index, partition_json=self.partition.to_json() if self.partition else "",
                    hardware=hardware_facts(), agent_version=__version__,
                    resident_bytes=psutil.Process().memory_info().rss)
        joined = self.transport.join(join)
        self.device_index = joined.device_index
        self.run_id = joined.run_id
        log.info("%s joined as index %d%s (coordinator at round %d, %.0f MiB resident)", self.cfg.device_id,
                 joined.device_index, ", an arrival" if joined.arrival else "", joined.current_round,
                 join.resident_bytes / 2**20)
        return joined.current_round

    def _leave(self) -> None:
        policy = self.transport.leave("agent stopped")
        if policy is not None:
            log.info("%s: departure announced (coordinator policy: %s)", self.cfg.device_id, policy)

    def _pull(self, after_round: int) -> Delivery | None:
        try:
            return self.transport.pull(after_round, expected=self._expected)
        except UnknownDevice:
            # The coordinator lost us (fresh start without --resume): join again.
            log.info("%s: the coordinator does not know this device (restarted?); joining again", self.cfg.device_id)
            self._join()
            return None

    # ---- one round -------------------------------------------------------------------

    def _do_round(self, round_id: int, terms: RoundTerms, *, received_at: float) -> Callable[..., RoundDone]:
        """Train the round delivered at `received_at` and send its update; what the round did, to be
        completed with `memory=`."""
        deadline_at = received_at + terms.deadline_s
        cap = self._caps.cap(round_id=round_id, terms=terms)
        update = run_round(round_id=round_id, terms=terms, model=self._ensure_model(terms.model),
                           shard=self.shard, cap=cap, deadline_at=deadline_at, estimates=self.estimates,
                           margin_s=self.cfg.safety_margin_s, participation=self.cfg.participation,
                           stopping=self._stop.is_set)
        # The resident memory goes with the update: the coordinator's Status shows each device's (flexfl status).
        report = replace(update.report, resident_bytes=psutil.Process().memory_info().rss)
        pushed = self.transport.push(report, update.delta, timeout_s=max(1.0, deadline_at - time.monotonic() + 2.0))
        self.estimates.after_upload(carried_update=pushed.carried_update, taken=pushed.taken,
                                    seconds=pushed.upload_s)
        r = update.report
        return partial(RoundDone, round_id=round_id, s=r.updates_completed, E=terms.required_updates, cap=cap,
                       why=r.stop_reason, train_s=r.train_s, upload_s=self.estimates.upload_s,
                       outcome=pushed.outcome, lr=terms.learning_rate)

    def _round_done(self, finish: Callable[..., RoundDone]) -> None:
        """Keep and log what the round did, with the process's memory once the round's buffers are given back."""
        release_freed()
        done = finish(memory=ProcessMemory.now())
        self.rounds_done.append(done)
        m = done.memory
        log.info("%s round %d: s = %d/%d (%s) in %.2f s, upload %.2f s: %s; resident %.1f MiB (%.1f anonymous), "
                 "peak %.1f MiB", self.cfg.device_id, done.round_id, done.s, done.E, done.why, done.train_s,
                 done.upload_s or 0.0, done.outcome, m.resident_mib, m.anonymous_mib, m.peak_mib)

    def _expected(self, model: ModelDescription) -> Expected:
        return expected_parameters(self._ensure_model(model))

    def _ensure_model(self, desc: ModelDescription) -> torch.nn.Module:
        if self._model is None:
            self._model = build_model(desc.architecture, in_features=desc.in_features or None,
                                      num_classes=desc.num_classes)
        return self._model

"""The live round engine: opens rounds, offers the model, collects updates until the deadlines.

The round's rules are coordinator.rules.round.Federation, shared with the simulator; this module
runs them over a live fleet, with neighbours that do one job each: membership (joins, leaves,
reconnections: coordinator/membership.py), the open round and each device's deadline
(open_round.py), parked pulls (parking.py), the finisher that evaluates and writes closed
rounds (finisher.py) and the resume of a crashed run (resume.py). It takes and gives domain
records (records.py): the wire format stops at the gRPC servicer (server.py).

One engine thread runs rounds; the servicer calls join/leave/offer/push/status from others,
all under one lock. A round closes when every participant has answered (or left) or the
last deadline has passed; whatever has not fully arrived by then counts as s = 0. Arrivals
and announced departures take effect when the round closes, so its objective never changes
under it. What a round costs does not grow with the fleet beyond what each device needs:
an update enters the round's running sum as it arrives (coordinator.rules.round.RoundSum) and is
dropped; the engine thread is woken when the last participant answered or left, a parked
pull only when a round opens for its device; the finisher works beside the next round.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from coordinator.checkpoint import Checkpoint
from coordinator.config import CoordinatorConfig
from coordinator.finisher import ClosedRound, Finisher
from coordinator.membership import Membership
from coordinator.open_round import OpenRound, check_open, check_report
from coordinator.parking import ParkedPulls
from coordinator.registry import Registry
from coordinator.resume import CHECKPOINT_NAME, EVENTS_NAME, open_run
from coordinator.rules.objective import Objective
from coordinator.rules.round import Federation
from coordinator.rules.round_record import rules_record
from flexfl.errors import PluginError, UpdateRejected
from flexfl.exchange import (
    Accepted,
    Delta,
    FleetState,
    Join,
    Joined,
    ModelDescription,
    OfferStatus,
    RoundOffer,
    RoundTerms,
    UpdateReport,
)
from workloads.federated import EvaluationData, FederatedData, initial_model, model_spec

log = logging.getLogger(__name__)


class RoundEngine:
    """Runs `run.rounds` federated rounds against whichever devices join."""

    def __init__(self, cfg: CoordinatorConfig, *, data: EvaluationData | FederatedData, resume: bool = False,
                 fresh: bool = False, allow_rule_change: bool = False) -> None:
        self.cfg = cfg
        # A plug-in model travels as its name (an import path): each agent builds it from that.
        workload = model_spec(cfg.partition.dataset, model=cfg.rules.model)
        model, params = initial_model(workload, seed=cfg.run.seed)
        self.model_description = ModelDescription(architecture=workload.name, num_classes=workload.num_classes,
                                                  in_features=workload.in_features)
        self.expected = {n: (tuple(p.shape), np.dtype(np.float32)) for n, p in params.items()}
        self.federation = Federation(rules=cfg.rules, dataset=cfg.partition.dataset, params=params,
                                     horizon=cfg.run.rounds, seed=cfg.run.seed)
        self.partition_json = cfg.partition.to_json()
        self.run_id = uuid.uuid4().hex[:12]
        self.started = False
        self.finished = False
        self.current: OpenRound | None = None
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # the engine thread waits here
        self._parked = ParkedPulls()
        self._stop = threading.Event()
        self.failure: PluginError | None = None  # a plug-in's fault met while taking an update (push)
        self._closed: list[ClosedRound] = []  # closed, not yet handed to the finisher (engine thread only)
        self._last_close: float | None = None
        self.out_dir = out = Path(cfg.output.dir)
        self.checkpoint_path = out / CHECKPOINT_NAME
        self.membership = Membership(cfg, federation=self.federation, shard_samples=data.sample_counts,
                                     events_path=out / EVENTS_NAME)
        # Held until run() ends: a second coordinator on this folder is refused, and an earlier
        # run in it is continued (resume), moved aside (fresh) or refused, never overwritten.
        rules = rules_record(cfg.rules, dataset=cfg.partition.dataset)
        self.folder, self.metrics, resumed_id, resumed_rules = open_run(
            out, federation=self.federation, membership=self.membership, expected=self.expected,
            strategy=cfg.rules.aggregation.name, resume=resume, fresh=fresh, rules=rules,
            allow_rule_change=allow_rule_change)
        self.run_id = resumed_id or self.run_id
        self.finisher = Finisher(model=model, data=data, evaluate=cfg.run.evaluate, metrics=self.metrics,
                                 checkpoint_path=self.checkpoint_path, rules=rules, resumed_rules=resumed_rules)

    @property
    def completed_round(self) -> int:
        return self.federation.completed_round

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return self.federation.params

    @property
    def objective(self) -> Objective:
        return self.federation.objective

    @property
    def registry(self) -> Registry:
        return self.membership.registry

    @property
    def pull_wakeups(self) -> int:
        """Parked pulls woken so far."""
        return self._parked.woken

    @property
    def ended_empty(self) -> bool:
        """run.on_empty = stop ended the run: no device was left."""
        return self.membership.ended_empty

    @property
    def _training_begun(self) -> bool:
        # A resumed coordinator has trained before it starts again: events then wait for a round's close.
        return self.started or self.completed_round > 0

    # ---- called by the servicer ---------------------------------------------------------

    def join(self, join: Join) -> Joined:
        n_samples = self.membership.admit(join)
        with self._lock:
            record, arrival = self.membership.join(join, n_samples=n_samples, training_begun=self._training_begun)
            self._cond.notify_all()
            return Joined(device_id=join.device_id, device_index=self.membership.seed_index(record), arrival=arrival,
                          current_round=self.completed_round, run_id=self.run_id, partition_json=self.partition_json)

    def leave(self, device_id: str, reason: str) -> str:
        """An announced departure; returns the departure policy (auto, threshold: decided when the round closes)."""
        with self._lock:
            if self.membership.leave(device_id, reason, training_begun=self._training_begun):
                r = self.current
                if r is not None and not r.closed and device_id in r.taking_part:
                    r.left.add(device_id)  # the round does not wait for a device that is gone
                    self._answered(r, device_id)
            self._cond.notify_all()
            return str(self.cfg.rules.departure_policy)

    def offer(self, device_id: str, *, wake: Callable[[], None] | None = None) -> RoundOffer | None:
        """The round this device should train in now, or FINISHED; else None, after parking `wake`.

        A parked `wake` is called once, under the engine's lock, when a round opens for this
        device or training ends (it must only signal, e.g. set an event); unpark() withdraws
        it. Checking and parking are one step, so an opening cannot slip between them.
        """
        run, rules = self.cfg.run, self.cfg.rules
        with self._lock:
            record = self.membership.known(device_id)
            record.last_seen = time.time()
            if device_id not in self.membership.seen:
                self.membership.seen.add(device_id)
                self._cond.notify_all()  # a resumed engine counts devices back
            if self.finished:
                return RoundOffer(OfferStatus.FINISHED, self.completed_round)
            r = self.current
            # No "after round": a restarted (resumed) coordinator may reopen a round the device
            # already saw, and it must be served again.
            if r is not None and r.offers_model_to(device_id, now=time.monotonic()):
                return RoundOffer(OfferStatus.ROUND, r.round_id, RoundTerms(
                    required_updates=rules.required_updates, learning_rate=r.lr, batch_size=self.cfg.batch_size,
                    deadline_s=r.deadline_s, model=self.model_description, params=r.params, seed=run.seed,
                    unit=str(rules.unit), device_index=self.membership.seed_index(record),
                    trace_sampling=str(rules.trace_sampling), s_rule=str(rules.s_rule),
                    proximal_mu=rules.aggregation.proximal_mu))
            if wake is not None:
                self._parked.park(device_id, wake)
            return None

    def unpark(self, device_id: str, wake: Callable[[], None]) -> None:
        """Withdraw a `wake` parked by offer() (nothing happens if it was already called)."""
        with self._lock:
            self._parked.unpark(device_id, wake)

    def waiting_reply(self) -> RoundOffer:
        """What a pull that waited its time answers: nothing yet, ask again."""
        with self._lock:
            return RoundOffer(OfferStatus.WAIT, self.completed_round)

    def delivered(self, device_id: str, round_id: int, nbytes: int) -> None:
        """The model of `round_id` has been fully handed to `device_id`: its deadline starts now."""
        with self._lock:
            r = self.current
            if r is not None and r.round_id == round_id:
                # No wake-up: the engine reads this device's deadline when it next wakes.
                r.mark_delivered(device_id, nbytes, now=time.monotonic())

    def check_update(self, device_id: str, report: UpdateReport) -> None:
        """Cheap checks of an update's report before its delta is read, so a doomed upload fails fast."""
        with self._lock:
            self.membership.known(device_id)
            self._round_taking(device_id, report.round_id)
        check_report(report, required_updates=self.cfg.rules.required_updates)

    def push(self, device_id: str, report: UpdateReport, delta: Delta, *, bytes_in: int) -> Accepted:
        """Take an update into the open round; raises UpdateRejected (with the reason) and changes nothing.

        `delta` is checked against the model (coordinator/uploading.py decodes it so); {} with s = 0.
        """
        self.check_update(device_id, report)
        s = int(report.updates_completed)
        if s > 0 and not delta:
            raise UpdateRejected(f"s = {s} updates completed but the update carries no model delta (empty payload); "
                                 "a device that trained must send its delta, one that did not must send s = 0")
        with self._lock:
            r = self._round_taking(device_id, report.round_id)  # again: the round may have moved meanwhile
            try:
                r.take(device_id, report, delta, bytes_in=bytes_in, now=time.monotonic())
            except PluginError as exc:  # the run's strategy failed, not this update: the run stops (run() raises it)
                self.failure = exc
                self.stop()
                raise
            self._answered(r, device_id)
            self.membership.reported_memory(device_id, report.resident_bytes)
            return Accepted(round_id=r.round_id, message=f"s = {s} accepted")

    def note_rejection(self, device_id: str, round_id: int, reason: str) -> None:
        """Record a refused update of the open round in its metrics (s = 0 unless a valid one follows)."""
        with self._lock:
            r = self.current
            if r is not None and r.round_id == round_id:
                r.note_rejection(device_id, reason)  # no wake-up: the device may still send a valid update

    def status(self) -> FleetState:
        """The run, its open round and every device: registry and membership, the open round, and each device's
        newest closed round as the finisher noted it (its row may still be on its way to disk)."""
        now = time.monotonic()
        with self._lock:
            r = self.current if self.current is not None and not self.current.closed else None
            rounds = self.finisher.device_rounds
            devices = tuple(replace(d, round_state=r.state_of(d.device_id, now=now) if r is not None else d.round_state,
                                    last_round=rounds.last_round(d.device_id),
                                    upload_bytes_per_s=rounds.upload_bytes_per_s(d.device_id))
                            for d in self.membership.states(now=time.time()))
            return FleetState(run_id=self.run_id, completed_round=self.completed_round,
                              open_round=r.round_id if r is not None else 0, started=self.started,
                              finished=self.finished, rounds=self.cfg.run.rounds, devices=devices,
                              partition_json=self.partition_json, required_updates=self.cfg.rules.required_updates,
                              deadline_s=self.cfg.run.deadline_s,
                              round_open_s=now - r.opened_at if r is not None else None,
                              round_closes_in_s=max(0.0, r.closes_at() - now) if r is not None else None)

    def parked(self) -> int:
        """Pulls waiting for a round right now."""
        with self._lock:
            return len(self._parked)

    def _round_taking(self, device_id: str, round_id: int) -> OpenRound:
        """The open round, if it can take `device_id`'s update for `round_id` now (lock held)."""
        r = check_open(self.current, round_id)
        r.check_update(device_id, round_id, now=time.monotonic())
        return r

    def _answered(self, r: OpenRound, device_id: str) -> None:
        """`device_id` answered or left round `r`: wake the engine when it was the last one."""
        if r.answered(device_id):
            self._cond.notify_all()

    # ---- the engine thread ------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._cond.notify_all()
            self._parked.wake()

    def run(self) -> None:
        """Run rounds until `run.rounds` are done or stop() is called."""
        self.finisher.start()
        try:
            with self._lock:
                self.started = self.membership.wait_for_start(self._cond, self._stop)
            if not self.started:
                return
            while self.completed_round < self.cfg.run.rounds and not self._stop.is_set():
                if not self._wait_for_members():
                    break
                self._run_round(self.completed_round + 1)
            self._hand_over()
            if self.completed_round >= self.cfg.run.rounds:
                self.finisher.drain()  # FINISHED means every round's row and checkpoint are on disk
                with self._lock:
                    self.finished = True
                    self._parked.wake()
                log.info("training finished after %d rounds", self.completed_round)
        finally:
            try:
                self._hand_over()  # stopped or failed between a close and the next opening
                self.finisher.close()
                if self.finisher.failed is None:
                    # Else rounds closed after the last written row would be checkpointed without theirs:
                    # the checkpoint on disk stays the one written after that row.
                    self._save()
                self.metrics.close()
            finally:
                self.folder.release()  # (a dead process releases it too: the kernel drops the flock)
        self.finisher.raise_error()
        if self.failure is not None:
            raise self.failure

    def _wait_for_members(self) -> bool:
        """True when the objective has a device to train; else pause until one joins (run.on_empty)."""
        with self._lock:
            if self.membership.can_train():
                return True
        self._hand_over()  # the last closed round's row and checkpoint are written before the pause
        self.finisher.drain()
        with self._lock:
            if not self.membership.wait_for_members(self._cond, self._stop):
                return False
        self._save()  # a crash now must not lose the new members
        return True

    def _hand_over(self) -> None:
        """Give the closed round(s) not yet handed over to the finisher, in order."""
        while self._closed:
            self.finisher.put(self._closed.pop(0))

    def _run_round(self, tau: int) -> None:
        """Open round tau, hand the previous one to the finisher, wait for answers, close."""
        self.finisher.raise_error()
        with self._lock:
            opening = self.federation.open(tau)
            participants = [d for d in self.registry.ordered(list(opening.participants))
                            if not self.registry.record(d).departed]
            self.current = r = OpenRound(round_id=tau, lr=opening.lr, opened_at=time.monotonic(),
                                         deadline_s=self.cfg.run.deadline_s, opening=opening,
                                         participants=participants, params=self.params,
                                         summed=self.federation.start_sum(opening))
            overhead = None if self._last_close is None else r.opened_at - self._last_close
            wakeups_before = self.pull_wakeups
            self._parked.wake(participants)
        # Only now, with this round open, does the last one's evaluation start competing for the CPU.
        self._hand_over()
        with self._lock:
            reason = r.wait_for_close(self._cond, self._stop,
                                      held=lambda now: self.membership.scripted_events_due(r, now=now))
            r.closed = True
            if reason is None:
                log.info("round %d abandoned: stopping", tau)
                return
            if r.deserted():  # its departures take effect before the next opening (_wait_for_members)
                log.info("round %d: every device taking part left before sending an update; it does not count",
                         tau)
                return
            closed_at = time.monotonic()
            r.pull_wakeups = self.pull_wakeups - wakeups_before  # its opening's included
            self._closed.append(self._close(r, reason=reason, overhead_s=overhead, closed_at=closed_at))

    def _close(self, r: OpenRound, *, reason: str, overhead_s: float | None, closed_at: float) -> ClosedRound:
        """Aggregate and apply the round's events (under the lock); the rest goes to the finisher."""
        weighing = self.federation.weigh(r.round_id, r.summed.s)
        arrivals, departures = self.membership.take_events()
        outcome = self.federation.close_summed(weighing, summed=r.summed, arrivals=arrivals, departures=departures)
        # Overhead of the next round = its opening time minus this close (deadline or all answered).
        self._last_close = closed_at
        shards = [self.registry.record(d).shard_index for d in self.objective.members()]
        return ClosedRound(r=r, outcome=outcome, reason=reason, overhead_s=overhead_s, closed_at=closed_at,
                           aggregate_s=time.monotonic() - closed_at, shards=shards, run_id=self.run_id,
                           objective=self.objective.to_dict(), registry=self.registry.snapshot(),
                           memory=self._memory_snapshot())

    def _memory_snapshot(self) -> dict | None:
        # UpdateMemory replaces its tensors, never changes them: a shallow copy stays as it was at the close
        memory = self.federation.memory
        return memory.snapshot() if memory is not None else None

    def _save(self) -> None:
        with self._lock:
            ckpt = Checkpoint(params=self.params, completed_round=self.completed_round, run_id=self.run_id,
                              registry=self.registry.to_dict(), objective=self.objective.to_dict(),
                              memory=self._memory_snapshot())
        self.finisher.save(ckpt)

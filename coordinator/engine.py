"""The round engine: opens rounds, serves the model, collects updates until the deadline, aggregates.

One engine thread runs rounds; gRPC handler threads call join/leave/pull/push. All shared
state is guarded by one condition variable. A round closes when every participant has
answered or its deadline has passed; whatever has not fully arrived by then counts as
s = 0. Arrivals and announced departures take effect when the current round closes, so
a round's objective never changes under it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from coordinator.aggregation import apply_update, coefficients
from coordinator.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from coordinator.config import CoordinatorConfig
from coordinator.metrics import MetricsWriter
from coordinator.participation import DeparturePolicy, FastReboot, LearningRate, Objective
from coordinator.registry import Registry
from flexfl.errors import ConfigError, FlexFLError, UpdateRejected
from proto import fleet_pb2 as pb
from proto import tensors as wire
from workloads.datasets import ArrayDataset
from workloads.evaluation import evaluate
from workloads.federated import DEFAULTS
from workloads.models import build_model

log = logging.getLogger(__name__)


class UnknownDevice(FlexFLError):
    """A call names a device that never joined (or whose credentials do not match)."""


class WrongRoundState(UpdateRejected):
    """An update for a round that is not open, a device not in it, a duplicate, or too late."""


@dataclass
class Update:
    s: int
    delta: dict[str, np.ndarray]
    samples_used: int
    train_s: float
    local_loss: float
    bytes_in: int
    previous_upload_s: float = 0.0  # the device's own measure of its previous upload (0: none yet)
    arrived_after_s: float = 0.0  # from the model's delivery to this update's arrival


@dataclass
class OpenRound:
    round_id: int
    lr: float
    opened_at: float  # time.monotonic()
    participants: list[str]
    payload: pb.Payload
    data: bytes
    delivered: dict[str, float] = field(default_factory=dict)
    updates: dict[str, Update] = field(default_factory=dict)
    bytes_out: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    closed: bool = False


class RoundEngine:
    """Runs `training.rounds` federated rounds against whichever devices join."""

    def __init__(self, cfg: CoordinatorConfig, *, test_data: ArrayDataset,
                 device_test: tuple[ArrayDataset, ...] | None = None, resume: bool = False) -> None:
        self.cfg = cfg
        t = cfg.training
        d = DEFAULTS[t.dataset]
        self.test_data = test_data
        self.device_test = device_test
        self._test_cache: tuple[tuple[int, ...], ArrayDataset] | None = None
        torch.manual_seed(t.seed)  # same initial model as the simulator for this seed
        self.model = build_model(d.model, in_features=d.in_features, num_classes=d.num_classes)
        self.model_description = pb.ModelDescription(architecture=d.model, num_classes=d.num_classes, in_features=d.in_features)
        self.params = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.expected = {n: (tuple(p.shape), np.dtype(np.float32)) for n, p in self.params.items()}
        self.schedule = LearningRate(t.resolved_eta0)
        self.fast_reboot = FastReboot(boost=t.fast_reboot_boost, decay_power=t.fast_reboot_decay_power)
        self.registry = Registry()
        self.objective = Objective()
        self.completed_round = 0
        self.run_id = uuid.uuid4().hex[:12]
        self.started = False
        self.finished = False
        self.current: OpenRound | None = None
        self._seen: set[str] = set()  # devices that called in since this process started
        self._pending_arrivals: list[str] = []
        self._pending_departures: list[str] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.out_dir = cfg.path(cfg.output.dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_path = self.out_dir / "checkpoint.pt"
        if resume:
            self._restore()
        self.metrics = MetricsWriter(self.out_dir / "metrics.jsonl", append=resume)
        self._last_close: float | None = None

    # ---- state shared with handlers -------------------------------------------------

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        device_id = request.device_id
        if request.sample_count < 1:
            raise ConfigError(f"device {device_id!r}: sample_count must be >= 1, got {request.sample_count}")
        hardware = {f.name: v for f, v in request.hardware.ListFields()}
        with self._cond:
            record = self.registry.get(device_id)
            arrival = False
            if record is None:
                shard = request.shard_index if request.HasField("shard_index") else None
                if shard is not None and self.device_test is not None and shard >= len(self.device_test):
                    raise ConfigError(f"device {device_id!r}: shard_index {shard} is outside the partition's "
                                      f"0..{len(self.device_test) - 1}")
                record = self.registry.add(device_id, sample_count=request.sample_count, hardware=hardware,
                                           agent_version=request.agent_version, after_round=self.completed_round,
                                           shard_index=shard)
                if self.started:
                    arrival = True
                    self._pending_arrivals.append(device_id)
                else:
                    self.objective.add_initial(device_id, request.sample_count)
                log.info("device %s joined (index %d, %d samples)%s", device_id, record.index,
                         request.sample_count, " as an arrival" if arrival else "")
            elif record.departed:
                # A departed device that comes back is a new arrival into the objective.
                record.departed = False
                record.sample_count = request.sample_count
                record.joined_after_round = self.completed_round
                if device_id not in self.objective.sample_counts:
                    arrival = True
                    self._pending_arrivals.append(device_id)
                else:
                    self.objective.departed_included.discard(device_id)
                log.info("device %s rejoined after departing", device_id)
            else:
                log.info("device %s reconnected", device_id)
            record.last_seen = time.time()
            record.hardware = hardware or record.hardware
            self._seen.add(device_id)
            self._cond.notify_all()
            return pb.JoinReply(device_id=device_id, device_index=record.index, arrival=arrival,
                                current_round=self.completed_round, run_id=self.run_id)

    def leave(self, device_id: str, reason: str) -> str:
        with self._cond:
            record = self._known(device_id)
            if not record.departed:
                record.departed = True
                self._pending_departures.append(device_id)
                if not self.started:
                    self._apply_membership_changes()
                log.info("device %s announced departure (%s); policy %s", device_id, reason or "no reason",
                         self.cfg.training.departure_policy)
            self._cond.notify_all()
            return self.cfg.training.departure_policy

    def pull(self, device_id: str, *, after_round: int, wait_s: float) -> tuple[pb.RoundHeader, bytes]:
        """Wait up to `wait_s` for an open round this device should train in."""
        limit = time.monotonic() + max(0.0, min(wait_s, self.cfg.server.pull_wait_s))
        t = self.cfg.training
        with self._cond:
            self._known(device_id).last_seen = time.time()
            if device_id not in self._seen:
                self._seen.add(device_id)
                self._cond.notify_all()
            while True:
                if self.finished:
                    return pb.RoundHeader(status=pb.RoundHeader.FINISHED, round_id=self.completed_round), b""
                r = self.current
                # `after_round` is informational: a restarted (resumed) coordinator may reopen a
                # round the device already saw, and it must be served again.
                if (r is not None and not r.closed and device_id in r.participants
                        and device_id not in r.delivered and time.monotonic() < r.opened_at + t.deadline_s):
                    header = pb.RoundHeader(
                        status=pb.RoundHeader.ROUND, round_id=r.round_id, required_updates=t.required_updates,
                        learning_rate=r.lr, batch_size=t.resolved_batch_size, deadline_s=t.deadline_s,
                        model=self.model_description, payload=r.payload, seed=t.seed, unit=t.unit,
                        device_index=self.registry.get(device_id).index,
                    )
                    return header, r.data
                left = limit - time.monotonic()
                if left <= 0:
                    return pb.RoundHeader(status=pb.RoundHeader.WAIT, round_id=self.completed_round), b""
                self._cond.wait(timeout=left)

    def delivered(self, device_id: str, round_id: int, nbytes: int) -> None:
        """The model of `round_id` has been fully handed to `device_id`: its deadline starts now."""
        with self._cond:
            r = self.current
            if r is not None and r.round_id == round_id and not r.closed:
                r.delivered[device_id] = time.monotonic()
                r.bytes_out[device_id] = r.bytes_out.get(device_id, 0) + nbytes

    def check_push_header(self, device_id: str, header: pb.UpdateHeader) -> None:
        """Cheap checks before the payload is read, so a doomed upload fails fast."""
        with self._cond:
            self._known(device_id)
            self._check_round(device_id, header)

    def push(self, device_id: str, header: pb.UpdateHeader, data: bytes, *, message_bytes: int | None = None) -> pb.PushReply:
        """Validate and store an update; raises UpdateRejected (with the reason) and changes nothing."""
        E = self.cfg.training.required_updates
        if not 0 <= header.updates_completed <= E:
            raise UpdateRejected(f"updates_completed = {header.updates_completed} is outside 0..E (E = {E})")
        for name in ("train_s", "previous_upload_s", "local_loss"):
            value = getattr(header, name)
            if not np.isfinite(value):
                raise UpdateRejected(f"header field {name} is not finite ({value})")
        s = int(header.updates_completed)
        if s == 0 and header.payload.total_bytes == 0:
            delta: dict[str, np.ndarray] = {}
        else:
            delta = wire.decode(header.payload, data, expected=self.expected)
        with self._cond:
            self._known(device_id)
            r = self._check_round(device_id, header)
            r.updates[device_id] = Update(s=s, delta=delta, samples_used=int(header.samples_used),
                                          train_s=float(header.train_s), local_loss=float(header.local_loss),
                                          bytes_in=len(data) if message_bytes is None else message_bytes,
                                          previous_upload_s=float(header.previous_upload_s),
                                          arrived_after_s=time.monotonic() - r.delivered[device_id])
            self._cond.notify_all()
            return pb.PushReply(round_id=r.round_id, accepted=True, message=f"s = {s} accepted")

    def note_rejection(self, device_id: str, round_id: int, reason: str) -> None:
        """Record a rejected update of the open round in its metrics (s = 0 unless a valid one follows)."""
        with self._cond:
            r = self.current
            if r is not None and not r.closed and r.round_id == round_id and device_id in r.participants:
                r.rejected[device_id] = reason
                self._cond.notify_all()

    def _known(self, device_id: str):
        record = self.registry.get(device_id)
        if record is None:
            raise UnknownDevice(f"unknown device {device_id!r}: call Join first")
        return record

    def _check_round(self, device_id: str, header: pb.UpdateHeader) -> OpenRound:
        r = self.current
        if header.device_id and header.device_id != device_id:
            raise UnknownDevice(f"update header names device {header.device_id!r} but the call is from {device_id!r}")
        if r is None or r.closed or header.round_id != r.round_id:
            open_id = r.round_id if r is not None and not r.closed else None
            raise WrongRoundState(f"round {header.round_id} is not open (open round: {open_id}); stale or early update")
        if device_id not in r.participants:
            raise WrongRoundState(f"device {device_id!r} does not take part in round {r.round_id}")
        if device_id in r.updates:
            raise WrongRoundState(f"device {device_id!r} already sent its update for round {r.round_id}")
        if device_id not in r.delivered:
            raise WrongRoundState(f"device {device_id!r} has not received round {r.round_id}'s model")
        if time.monotonic() > r.delivered[device_id] + self._deadline_with_grace():
            raise WrongRoundState(f"round {r.round_id}: the deadline of device {device_id!r} has passed")
        return r

    def _deadline_with_grace(self) -> float:
        # Grace covers the gap between "handed to gRPC" and "received by the device".
        t = self.cfg.training
        return t.deadline_s + max(0.2, 0.05 * t.deadline_s)

    # ---- the engine thread ------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def run(self) -> None:
        """Run rounds until `training.rounds` are done or stop() is called."""
        t = self.cfg.training
        try:
            if not self._wait_for_start():
                return
            while self.completed_round < t.rounds and not self._stop.is_set():
                self._run_round(self.completed_round + 1)
            if self.completed_round >= t.rounds:
                with self._cond:
                    self.finished = True
                    self._cond.notify_all()
                log.info("training finished after %d rounds", self.completed_round)
        finally:
            self._save()
            self.metrics.close()

    def _wait_for_start(self) -> bool:
        t = self.cfg.training
        ready_since = None
        with self._cond:
            if self.completed_round > 0:  # resumed: give the fleet a moment to reconnect
                active = [d for d, r in self.registry.devices.items() if not r.departed]
                need = min(t.min_devices, len(active))
                limit = time.monotonic() + t.resume_wait_s
                while not self._stop.is_set() and len(self._seen) < need and time.monotonic() < limit:
                    self._cond.wait(timeout=0.05)
                self.started = True
                log.info("resuming at round %d with %d of %d devices back", self.completed_round + 1,
                         len(self._seen), len(active))
                return not self._stop.is_set()
            while not self._stop.is_set():
                active = [d for d, r in self.registry.devices.items() if not r.departed]
                if len(active) >= t.min_devices:
                    ready_since = ready_since or time.monotonic()
                    if time.monotonic() - ready_since >= t.start_grace_s:
                        self.started = True
                        log.info("starting training with %d devices", len(active))
                        return True
                self._cond.wait(timeout=0.05)
        return False

    def _run_round(self, tau: int) -> None:
        t = self.cfg.training
        with self._cond:
            participants = [d for d in self.registry.ordered(self.objective.members())
                            if not self.registry.get(d).departed]
            payload, data = wire.encode(self.params)
            lr = self.schedule.at(round_index=tau, shift_round=self.objective.shift_round)
            self.current = r = OpenRound(round_id=tau, lr=lr, opened_at=time.monotonic(),
                                         participants=participants, payload=payload, data=data)
            overhead = None if self._last_close is None else r.opened_at - self._last_close
            self._cond.notify_all()
            # Wait until every participant answered or its deadline passed.
            while not self._stop.is_set():
                now = time.monotonic()
                # A rejected update does not end a device's round: it may still send a valid one.
                pending = [d for d in participants if d not in r.updates]
                if not pending:
                    reason = "all answered"
                    break
                limits = [r.opened_at + t.deadline_s]
                limits += [r.delivered[d] + self._deadline_with_grace() for d in pending if d in r.delivered]
                if now >= max(limits):
                    reason = "deadline"
                    break
                self._cond.wait(timeout=min(0.05, max(limits) - now))
            else:
                r.closed = True
                log.info("round %d abandoned: stopping", tau)
                return
            r.closed = True
            closed_at = time.monotonic()
        self._aggregate(r, reason=reason, overhead_s=overhead, closed_at=closed_at)

    def _aggregate(self, r: OpenRound, *, reason: str, overhead_s: float | None, closed_at: float) -> None:
        t = self.cfg.training
        with self._cond:
            ids = self.registry.ordered(self.objective.members())
            s = np.array([r.updates[d].s if d in r.updates else 0 for d in ids], dtype=np.int64)
            p = self.objective.weights(ids, round_index=r.round_id, fast_reboot=self.fast_reboot)
            coef = coefficients(t.scheme, s=s, E=t.required_updates, p=p)
            rows = coef.contributors
            if len(rows) and not coef.discarded:
                deltas = {n: torch.stack([torch.from_numpy(r.updates[ids[i]].delta[n]) for i in rows]) for n in self.params}
                self.params = apply_update(global_state=self.params, deltas=deltas, coefficients=coef, rows=rows)
            arrivals, departures = list(self._pending_arrivals), list(self._pending_departures)
            self.completed_round = r.round_id
            self._apply_membership_changes()
        acc, loss = evaluate(self.model, self.params, self._objective_test_set())
        self._save()
        done = time.monotonic()
        # Overhead of the next round = its opening time minus this close (deadline or all answered).
        self._last_close = closed_at
        updates = {d: u for d, u in r.updates.items()}
        self.metrics.write({
            "round": r.round_id, "time": time.time(), "lr": r.lr, "close_reason": reason,
            "participants": r.participants, "devices": ids,
            "s": {d: int(v) for d, v in zip(ids, s)}, "p": {d: float(v) for d, v in zip(ids, p)},
            "coefficients": {d: float(v) for d, v in zip(ids, coef.values)}, "discarded": coef.discarded,
            "test_acc": acc, "test_loss": loss,
            "bytes_out": r.bytes_out, "bytes_in": {d: u.bytes_in for d, u in updates.items()},
            "train_s": {d: u.train_s for d, u in updates.items()},
            "local_loss": {d: u.local_loss for d, u in updates.items()},
            "previous_upload_s": {d: u.previous_upload_s for d, u in updates.items()},
            "arrived_after_s": {d: u.arrived_after_s for d, u in updates.items()},
            "rejected": r.rejected, "arrivals": arrivals, "departures": departures,
            "round_s": closed_at - r.opened_at, "aggregate_eval_s": done - closed_at,
            "overhead_s": overhead_s,
        })
        log.info("round %d: acc %.2f%% loss %.3f, s=%s (%s)", r.round_id, 100 * acc, loss, s.tolist(), reason)

    def _objective_test_set(self) -> ArrayDataset:
        """The holdout data of the devices in the objective, where devices hold per-device holdouts.

        As in the paper's experiments, an arrival's holdout joins the test set and an
        excluded device's leaves it. Without per-device holdouts (MNIST, EMNIST) or with a
        device of unknown shard, the global test set is used.
        """
        if self.device_test is None:
            return self.test_data
        with self._cond:
            shards = [self.registry.get(d).shard_index for d in self.registry.ordered(self.objective.members())]
        if not shards or any(s is None for s in shards):
            return self.test_data
        key = tuple(sorted(shards))
        if self._test_cache is None or self._test_cache[0] != key:
            parts = [self.device_test[i] for i in key]
            self._test_cache = (key, ArrayDataset(x=np.concatenate([p.x for p in parts]),
                                                  y=np.concatenate([p.y for p in parts])))
        return self._test_cache[1]

    def _apply_membership_changes(self) -> None:
        """Arrivals and departures announced during a round take effect after it (lock held)."""
        for d in self._pending_arrivals:
            self.objective.arrive(d, self.registry.get(d).sample_count, round_index=self.completed_round)
        for d in self._pending_departures:
            if d in self.objective.sample_counts:
                self.objective.depart(d, round_index=self.completed_round,
                                      policy=DeparturePolicy(self.cfg.training.departure_policy))
        self._pending_arrivals.clear()
        self._pending_departures.clear()

    # ---- checkpoints ------------------------------------------------------------------

    def _save(self) -> None:
        with self._cond:
            ckpt = Checkpoint(params=self.params, completed_round=self.completed_round, run_id=self.run_id,
                              registry=self.registry.to_dict(), objective=self.objective.to_dict())
        save_checkpoint(self.checkpoint_path, ckpt)

    def _restore(self) -> None:
        ckpt = load_checkpoint(self.checkpoint_path, expected=self.expected)
        self.params = {n: v.clone() for n, v in ckpt.params.items()}
        self.completed_round = ckpt.completed_round
        self.run_id = ckpt.run_id
        self.registry = Registry.from_dict(ckpt.registry)
        self.objective = Objective.from_dict(ckpt.objective)
        log.info("resumed from %s after round %d", self.checkpoint_path, self.completed_round)

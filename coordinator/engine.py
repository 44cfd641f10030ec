"""The live round engine: opens rounds, serves the model, collects updates until the deadline.

The round's rules (participants, learning rate, coefficients, the update, arrivals and
departures) are coordinator.round.Federation, shared with the simulator; this module adds
what only a live fleet needs: a registry of devices that join and leave over gRPC,
deadlines, per-round transfer accounting, metrics and checkpoints.

One engine thread runs rounds; gRPC handler threads call join/leave/pull/push/status. All
shared state is guarded by one lock. A round closes when every participant has answered (or
left) or its deadline has passed; whatever has not fully arrived by then counts as s = 0.
Arrivals and announced departures take effect when the current round closes, so a round's
objective never changes under it.

What a round costs does not grow with the fleet beyond what each device needs itself:
- an update enters the round's running sum as it arrives (coordinator.round.RoundSum) and
  is dropped, so closing a round is one model-sized addition, not a stack of N deltas;
- waiters are woken only when their condition may have changed: the engine thread when the
  last participant answered or left, a parked PullRound (a callback parked per device, see
  offer()) only when a round opens for its device or training ends, never on a push;
- the finisher, two threads, handles a closed round once the next one is open: an
  evaluator tests its model and makes its metrics row, a writer then writes the row and
  the checkpoint (so evaluating round k overlaps writing round k - 1).

Crash safety: the finisher takes closed rounds in order and writes (and fsyncs) each round's
metrics row before its checkpoint; a resumed coordinator drops rows of rounds its checkpoint
does not hold (they run again) and reports rounds that have no row.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from coordinator.checkpoint import Checkpoint, checkpointed_round, load_checkpoint, save_checkpoint
from coordinator.config import CoordinatorConfig, OnEmpty
from coordinator.metrics import MetricsWriter, read_metrics_and_torn, round_row
from coordinator.objective import Objective
from coordinator.registry import DeviceRecord, Registry
from coordinator.round import Arrival, Departure, Federation, RoundOpening, RoundOutcome, RoundSum
from flexfl.errors import (AggregationError, ConfigError, FlexFLError, PartitionMismatch, UnknownDevice, UpdateRejected,
                           WrongRoundState)
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import tensors as wire
from flexfl.run_folder import claim_run_folder
from workloads.evaluation import evaluate
from workloads.federated import EvaluationData, FederatedData, initial_model, model_spec
from workloads.partition_spec import PartitionSpec

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"  # in the output folder, beside metrics.jsonl
# Announced departures and returns, appended (fsynced) as they happen: a crash before the next
# checkpoint must not lose a departure, since the device is gone and will not announce it again.
EVENTS_NAME = "events.jsonl"
MAX_REJECTIONS_KEPT = 32  # reasons per device and round in the metrics row


@dataclass
class Update:
    """What the round keeps of an accepted update (its delta went into the round's sum)."""

    s: int
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
    opening: RoundOpening
    participants: list[str]
    payload: pb.Payload
    chunks: tuple[pb.RoundChunk, ...]  # the model's data messages, built once for every pull
    summed: RoundSum  # the accepted updates, summed as they arrive
    delivered: dict[str, float] = field(default_factory=dict)
    updates: dict[str, Update] = field(default_factory=dict)
    bytes_out: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, list[str]] = field(default_factory=dict)  # every reason, in order (capped per device)
    left: set[str] = field(default_factory=set)  # participants that departed during the round
    gave_up_waiting: bool = False  # for a scripted event (run.expected_*) that did not happen
    closed: bool = False
    pull_wakeups: int = 0  # parked PullRound calls woken while this round was open

    def __post_init__(self) -> None:
        self.taking_part = frozenset(self.participants)  # O(1) membership for every pull and push
        self.waiting = set(self.participants)  # neither answered nor left: the round waits for these


@dataclass
class _Closed:
    """A closed round, handed to the finisher: everything it needs, taken at the close."""

    r: OpenRound
    outcome: RoundOutcome
    reason: str
    overhead_s: float | None
    closed_at: float
    aggregate_s: float
    shards: list[int | None]  # of the objective's members after the close: they choose the test set
    objective: dict  # the objective and the registry as they were at the close, for its checkpoint
    registry: Registry
    memory: dict | None  # the update memory at the close (MIFA), for its checkpoint; None: the strategy has none


class _Stage:
    """A worker thread taking items in order from a bounded queue (put() blocks while it is `depth` behind).

    `work` gets the items waiting when it is free, in order (one or more: a stage that fell
    behind catches up in one go). Its first failure is kept in `error` and ends its work:
    later items are dropped, so nothing is written out of order after a failed write.
    """

    def __init__(self, name: str, work: Callable[[list], None], *, depth: int = 2) -> None:
        self.error: BaseException | None = None
        self._work = work
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: object) -> None:
        self._queue.put(item)

    def drain(self) -> None:
        """Wait until every item put so far is done (or dropped)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        closing = False
        while not closing:
            items = [self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())  # only this thread takes items
            if items[-1] is None:
                closing = True
                items.pop()
            try:
                if self.error is None and items:
                    self._work(items)
            except BaseException as exc:  # noqa: BLE001 - the engine thread raises it (_raise_finisher_error)
                log.exception("%s failed", self._thread.name)
                self.error = exc
            finally:
                for _ in range(len(items) + closing):
                    self._queue.task_done()


def earlier_run(folder: Path) -> str | None:
    """What run a coordinator's output folder holds (flexfl.run_folder), None if nothing worth keeping.

    A checkpoint of round 0 (a coordinator stopped before its first round) holds no training.
    """
    found = []
    metrics = folder / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size > 0:
        with open(metrics, "rb") as f:
            found.append(f"metrics.jsonl with {sum(1 for _ in f)} rows")
    checkpoint = folder / CHECKPOINT_NAME
    if checkpoint.exists():
        done = checkpointed_round(checkpoint)
        if done is None:
            found.append("an unreadable checkpoint.pt")
        elif done > 0:
            found.append(f"a checkpoint after round {done}")
    return "; ".join(found) or None


class RoundEngine:
    """Runs `run.rounds` federated rounds against whichever devices join."""

    def __init__(self, cfg: CoordinatorConfig, *, data: EvaluationData | FederatedData, resume: bool = False,
                 fresh: bool = False) -> None:
        self.cfg = cfg
        self.data = data
        # A plug-in model travels as its name (an import path): each agent builds it from that.
        workload = model_spec(cfg.partition.dataset, model=cfg.rules.model)
        self.model, params = initial_model(workload, seed=cfg.run.seed)
        self.model_description = pb.ModelDescription(architecture=workload.name, num_classes=workload.num_classes,
                                                      in_features=workload.in_features)
        self.expected = {n: (tuple(p.shape), np.dtype(np.float32)) for n, p in params.items()}
        self.federation = Federation(rules=cfg.rules, dataset=cfg.partition.dataset, params=params,
                                     horizon=cfg.run.rounds)
        self.partition_json = cfg.partition.to_json()
        self.registry = Registry()
        self.run_id = uuid.uuid4().hex[:12]
        self.started = False
        self.finished = False
        self.current: OpenRound | None = None
        self._seen: set[str] = set()  # devices that called in since this process started
        self._pending_arrivals: list[str] = []
        self._pending_departures: list[str] = []
        self._founding: set[str] = set()  # pending arrivals that joined in the founding window
        self.ended_empty = False  # run.on_empty = stop ended the run: no device was left
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # the engine thread waits here
        self._waiters: dict[str, list[Callable[[], None]]] = {}  # parked PullRound calls, per device
        self.pull_wakeups = 0  # parked PullRound calls woken so far
        self._stop = threading.Event()
        # Closed rounds go to an evaluator, then to a writer (metrics row, then checkpoint), each a
        # thread at most two rounds behind: evaluating round k overlaps writing round k - 1.
        self._evaluator: _Stage | None = None
        self._writer: _Stage | None = None
        self._closed: list[_Closed] = []  # closed, not yet handed to the finisher (engine thread only)
        self.out_dir = Path(cfg.output.dir)
        # Held until run() ends: a second coordinator on this folder is refused, and an earlier
        # run in it is continued (resume), moved aside (fresh) or refused, never overwritten.
        self.folder = claim_run_folder(self.out_dir, what="flexfl coordinator", holds_run=earlier_run,
                                       resume=resume, fresh=fresh)
        if self.folder.moved_aside is not None:
            log.info("--fresh: moved the earlier run in %s to %s", self.out_dir, self.folder.moved_aside)
        self.checkpoint_path = self.out_dir / CHECKPOINT_NAME
        self.events_path = self.out_dir / EVENTS_NAME
        metrics_path = self.out_dir / "metrics.jsonl"
        try:
            if resume:
                self._restore()
                self._repair_metrics(metrics_path)
            self.metrics = MetricsWriter(metrics_path, append=resume)
        except BaseException:
            self.folder.release()
            raise
        self._last_close: float | None = None

    @property
    def _training_begun(self) -> bool:
        # A resumed coordinator has trained before it starts again: events then wait for a round's close.
        return self.started or self.completed_round > 0

    @property
    def completed_round(self) -> int:
        return self.federation.completed_round

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return self.federation.params

    @property
    def objective(self) -> Objective:
        return self.federation.objective

    # ---- state shared with handlers -------------------------------------------------

    def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        device_id = request.device_id
        shard = request.shard_index if request.HasField("shard_index") else None
        self._check_partition(device_id, request.partition_json)
        n_samples = self._sample_count(device_id, shard, request.sample_count)
        hardware = {f.name: v for f, v in request.hardware.ListFields()}
        with self._lock:
            record = self.registry.get(device_id)
            arrival = False
            self.registry.check_claim(device_id, shard)
            if record is None:
                record = self.registry.add(device_id, sample_count=n_samples, hardware=hardware,
                                           agent_version=request.agent_version, after_round=self.completed_round,
                                           shard_index=shard)
                if self._training_begun:
                    arrival = not self._founding_window_open(device_id)
                    if not arrival:
                        self._founding.add(device_id)
                    self._pending_arrivals.append(device_id)
                else:
                    self.federation.apply_events(arrivals=[Arrival(device_id, n_samples)])
                log.info("device %s joined (shard %s, %d samples, %.0f MiB resident)%s", device_id, shard, n_samples,
                         request.resident_bytes / 2**20, " as an arrival" if arrival else
                         " in the founding rounds (run.founding_rounds): a member from the next close" if device_id in self._founding else "")
            elif record.departed:
                # A departed device that comes back: an arrival (excluded) or back in training (included).
                record.departed = False
                record.sample_count = n_samples
                record.joined_after_round = self.completed_round
                self._journal("rejoin", device_id)
                if device_id in self._pending_departures:
                    self._pending_departures.remove(device_id)
                elif self._training_begun:
                    arrival = device_id not in self.objective.sample_counts
                    self._pending_arrivals.append(device_id)
                else:
                    self.federation.apply_events(arrivals=[Arrival(device_id, n_samples)])
                log.info("device %s rejoined after departing", device_id)
            else:
                log.info("device %s reconnected", device_id)
            record.last_seen = time.time()
            record.hardware = hardware or record.hardware
            record.resident_bytes = int(request.resident_bytes)
            self._seen.add(device_id)
            self._cond.notify_all()
            return pb.JoinReply(device_id=device_id, device_index=self._seed_index(record), arrival=arrival,
                                current_round=self.completed_round, run_id=self.run_id,
                                partition_json=self.partition_json)

    def _founding_window_open(self, device_id: str) -> bool:
        """A device joining now founds the objective rather than arriving (run.founding_rounds)."""
        run = self.cfg.run
        return self.completed_round < run.founding_rounds and device_id not in run.expected_arrivals

    def _check_partition(self, device_id: str, partition_json: str) -> None:
        if not partition_json:
            return  # the agent adopts ours
        theirs = PartitionSpec.from_json(partition_json, where=f"device {device_id!r}", ours=self.cfg.partition)
        if theirs != self.cfg.partition:
            raise PartitionMismatch(
                f"device {device_id!r} has partition [{theirs.describe()}] but the coordinator trains on "
                f"[{self.cfg.partition.describe()}]; differences (device vs coordinator): "
                + "; ".join(theirs.differences(self.cfg.partition)))

    def _sample_count(self, device_id: str, shard: int | None, reported: int) -> int:
        if shard is None:
            if reported < 1:
                raise ConfigError(f"device {device_id!r}: sample_count must be >= 1, got {reported}")
            return int(reported)
        counts = self.data.sample_counts
        if shard >= len(counts):
            raise ConfigError(f"device {device_id!r}: shard_index {shard} is outside the partition's "
                              f"0..{len(counts) - 1}")
        n = int(counts[shard])
        if reported not in (0, n):  # 0: the device does not hold data (benchmark agents)
            raise PartitionMismatch(f"device {device_id!r} holds {reported} samples, but shard {shard} of "
                                    f"[{self.cfg.partition.describe()}] has {n}")
        return n

    def _seed_index(self, record: DeviceRecord) -> int:
        # The simulator seeds device k's streams with k = its shard: so does a live device.
        return record.shard_index if record.shard_index is not None else record.index

    def leave(self, device_id: str, reason: str) -> str:
        with self._lock:
            record = self._known(device_id)
            if not record.departed:
                record.departed = True
                self._journal("leave", device_id)
                r = self.current
                if r is not None and not r.closed and device_id in r.taking_part:
                    r.left.add(device_id)  # the round does not wait for a device that is gone
                    self._answered(r, device_id)
                if self._training_begun:
                    self._pending_departures.append(device_id)
                else:
                    self.federation.apply_events(departures=[Departure(device_id)])
                log.info("device %s announced departure (%s); policy %s", device_id, reason or "no reason",
                         self.cfg.rules.departure_policy)
            self._cond.notify_all()
            return str(self.cfg.rules.departure_policy)  # auto, threshold: decided when the round closes (metrics)

    def _journal(self, event: str, device_id: str) -> None:
        """Append a membership event to events.jsonl and fsync it (lock held; departures are rare)."""
        with open(self.events_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "device": device_id, "after_round": self.completed_round}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _replay_journal(self) -> None:
        """After a restore: apply each device's last journaled event that the checkpoint does not hold.

        A departure announced after the checkpoint's close (or held pending when a stop saved
        it) leaves a member in the objective: it departs at the next close. A device that came
        back after its departure was checkpointed is back (its agent is running and will not
        join again). Replaying is idempotent: what the checkpoint holds is left alone.
        """
        if not self.events_path.exists():
            return
        last: dict[str, str] = {}
        for n, line in enumerate(self.events_path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                e = json.loads(line)
                last[str(e["device"])] = str(e["event"])
            except (ValueError, KeyError, TypeError):
                log.warning("%s line %d is unreadable (a crash mid-write?): skipped", self.events_path, n)
        objective = self.objective
        for device_id, event in last.items():
            record = self.registry.get(device_id)
            if record is None:
                continue
            if event == "leave" and device_id in objective.active_members():
                record.departed = True
                self._pending_departures.append(device_id)
                log.info("device %s announced its departure after the checkpoint: it takes effect at the next close",
                         device_id)
            elif event == "rejoin" and record.departed:
                record.departed = False
                log.info("device %s came back after the checkpoint", device_id)

    def pull_wait_s(self, wait_s: float) -> float:
        """How long a PullRound asking for `wait_s` may be held (server.pull_wait_s at most)."""
        return max(0.0, min(wait_s, self.cfg.server.pull_wait_s))

    def offer(self, device_id: str, *,
              wake: Callable[[], None] | None = None) -> tuple[pb.RoundHeader, tuple[pb.RoundChunk, ...]] | None:
        """The round this device should train in now (header, the model's data messages), or FINISHED;
        else None, after parking `wake`.

        A parked `wake` is called once, under the engine's lock, when a round opens for this
        device or training ends (it must only signal, e.g. set an event); unpark() withdraws
        it. Checking and parking are one step, so an opening cannot slip between them.
        """
        run, rules = self.cfg.run, self.cfg.rules
        with self._lock:
            record = self._known(device_id)
            record.last_seen = time.time()
            if device_id not in self._seen:
                self._seen.add(device_id)
                self._cond.notify_all()  # a resumed engine counts devices back
            if self.finished:
                return pb.RoundHeader(status=pb.RoundHeader.FINISHED, round_id=self.completed_round), ()
            r = self.current
            # `after_round` is not needed: a restarted (resumed) coordinator may reopen a round
            # the device already saw, and it must be served again.
            if (r is not None and not r.closed and device_id in r.taking_part and device_id not in r.left
                    and device_id not in r.delivered and time.monotonic() < r.opened_at + run.deadline_s):
                header = pb.RoundHeader(
                    status=pb.RoundHeader.ROUND, round_id=r.round_id, required_updates=rules.required_updates,
                    learning_rate=r.lr, batch_size=self.cfg.batch_size, deadline_s=run.deadline_s,
                    model=self.model_description, payload=r.payload, seed=run.seed, unit=str(rules.unit),
                    device_index=self._seed_index(record), trace_sampling=str(rules.trace_sampling),
                    s_rule=str(rules.s_rule), proximal_mu=rules.aggregation.proximal_mu,
                )
                return header, r.chunks
            if wake is not None:
                self._waiters.setdefault(device_id, []).append(wake)
            return None

    def unpark(self, device_id: str, wake: Callable[[], None]) -> None:
        """Withdraw a `wake` parked by offer() (nothing happens if it was already called)."""
        with self._lock:
            waiting = self._waiters.get(device_id)
            if waiting and wake in waiting:
                waiting.remove(wake)

    def waiting_reply(self) -> pb.RoundHeader:
        """What a PullRound that timed out answers: nothing yet, pull again."""
        with self._lock:
            return pb.RoundHeader(status=pb.RoundHeader.WAIT, round_id=self.completed_round)

    def pull(self, device_id: str, *, after_round: int, wait_s: float) -> tuple[pb.RoundHeader, bytes]:
        """Wait (blocking this thread) up to `wait_s` for a round this device should train in."""
        limit = time.monotonic() + self.pull_wait_s(wait_s)
        while True:
            woken = threading.Event()
            offered = self.offer(device_id, wake=woken.set)
            if offered is not None:
                header, chunks = offered
                return header, b"".join(c.data for c in chunks)
            woken.wait(max(0.0, limit - time.monotonic()))
            self.unpark(device_id, woken.set)
            if not woken.is_set():
                return self.waiting_reply(), b""

    def delivered(self, device_id: str, round_id: int, nbytes: int) -> None:
        """The model of `round_id` has been fully handed to `device_id`: its deadline starts now."""
        with self._lock:
            r = self.current
            if r is not None and r.round_id == round_id and not r.closed:
                # No wake-up: the engine reads this device's extended deadline when it next wakes.
                r.delivered[device_id] = time.monotonic()
                r.bytes_out[device_id] = r.bytes_out.get(device_id, 0) + nbytes

    def check_push_header(self, device_id: str, header: pb.UpdateHeader) -> None:
        """Cheap checks before the payload is read, so a doomed upload fails fast."""
        with self._lock:
            self._known(device_id)
            self._check_round(device_id, header)

    def push(self, device_id: str, header: pb.UpdateHeader, data: bytes, *, message_bytes: int | None = None) -> pb.PushReply:
        """Validate and store an update; raises UpdateRejected (with the reason) and changes nothing."""
        E = self.cfg.rules.required_updates
        if not 0 <= header.updates_completed <= E:
            raise UpdateRejected(f"updates_completed = {header.updates_completed} is outside 0..E (E = {E})")
        for name in ("train_s", "previous_upload_s", "local_loss"):
            value = getattr(header, name)
            if not np.isfinite(value):
                raise UpdateRejected(f"header field {name} is not finite ({value})")
        s = int(header.updates_completed)
        if s == 0 and header.payload.total_bytes == 0:
            delta: dict[str, np.ndarray] = {}
        elif header.payload.total_bytes == 0 and not header.payload.tensors:
            raise UpdateRejected(f"s = {s} updates completed but the update carries no model delta (empty payload); "
                                 "a device that trained must send its delta, one that did not must send s = 0")
        else:
            delta = wire.decode(header.payload, data, expected=self.expected)  # views of `data`, checked
        with self._lock:
            self._known(device_id)
            r = self._check_round(device_id, header)
            r.summed.add(device_id, s=s, delta=delta)  # one model-sized multiply-add; the delta is not kept
            r.updates[device_id] = Update(s=s, samples_used=int(header.samples_used),
                                          train_s=float(header.train_s), local_loss=float(header.local_loss),
                                          bytes_in=len(data) if message_bytes is None else message_bytes,
                                          previous_upload_s=float(header.previous_upload_s),
                                          arrived_after_s=time.monotonic() - r.delivered[device_id])
            self._answered(r, device_id)
            return pb.PushReply(round_id=r.round_id, accepted=True, message=f"s = {s} accepted")

    def note_rejection(self, device_id: str, round_id: int, reason: str) -> None:
        """Record a rejected update of the open round in its metrics (s = 0 unless a valid one follows)."""
        with self._lock:
            r = self.current
            if r is not None and not r.closed and r.round_id == round_id and device_id in r.taking_part:
                # No wake-up: the device may still send a valid update. A device may retry many
                # times in one round: keep the metrics row bounded.
                reasons = r.rejected.setdefault(device_id, [])
                if len(reasons) < MAX_REJECTIONS_KEPT:
                    reasons.append(reason)
                elif len(reasons) == MAX_REJECTIONS_KEPT:
                    reasons.append("(further rejections in this round not recorded)")

    def status(self) -> pb.StatusReply:
        with self._lock:
            r = self.current
            members = set(self.objective.sample_counts)
            devices = [pb.DeviceStatus(device_id=d.device_id, shard_index=d.shard_index, departed=d.departed,
                                       in_objective=d.device_id in members, joined_after_round=d.joined_after_round,
                                       connected=d.device_id in self._seen)
                       for d in self.registry.devices.values()]
            return pb.StatusReply(run_id=self.run_id, completed_round=self.completed_round,
                                  open_round=r.round_id if r is not None and not r.closed else 0,
                                  started=self.started, finished=self.finished, rounds=self.cfg.run.rounds,
                                  devices=devices, partition_json=self.partition_json)

    def _known(self, device_id: str) -> DeviceRecord:
        record = self.registry.get(device_id)
        if record is None:
            raise UnknownDevice(f"unknown device {device_id!r}: call Join first")
        return record

    def _check_round(self, device_id: str, header: pb.UpdateHeader) -> OpenRound:
        r = self.current
        if r is None or r.closed or header.round_id != r.round_id:
            open_id = r.round_id if r is not None and not r.closed else None
            raise WrongRoundState(f"round {header.round_id} is not open (open round: {open_id}); stale or early update")
        if device_id not in r.taking_part:
            raise WrongRoundState(f"device {device_id!r} does not take part in round {r.round_id}")
        if device_id in r.updates:
            raise WrongRoundState(f"device {device_id!r} already sent its update for round {r.round_id}")
        if device_id not in r.delivered:
            raise WrongRoundState(f"device {device_id!r} has not received round {r.round_id}'s model")
        if time.monotonic() > r.delivered[device_id] + self._deadline_with_grace():
            raise WrongRoundState(f"round {r.round_id}: the deadline of device {device_id!r} has passed")
        return r

    def _answered(self, r: OpenRound, device_id: str) -> None:
        """`device_id` answered or left round `r`: wake the engine when it was the last one."""
        r.waiting.discard(device_id)
        if not r.waiting:
            self._cond.notify_all()

    def parked(self) -> int:
        """PullRound calls waiting for a round right now."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    def _wake_pulls(self, devices: Iterable[str]) -> int:
        """Wake the PullRound calls parked by these devices (lock held); returns how many."""
        woken = 0
        for d in devices:
            for wake in self._waiters.pop(d, ()):
                wake()
                woken += 1
        self.pull_wakeups += woken
        return woken

    def _deadline_with_grace(self) -> float:
        # Grace covers the gap between "handed to gRPC" and "received by the device".
        deadline = self.cfg.run.deadline_s
        return deadline + max(0.2, 0.05 * deadline)

    # ---- the engine thread ------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._cond.notify_all()
            self._wake_pulls(list(self._waiters))

    def run(self) -> None:
        """Run rounds until `run.rounds` are done or stop() is called."""
        self._writer = _Stage("round-writer", self._write)
        self._evaluator = _Stage("round-evaluator", self._evaluate)
        try:
            if not self._wait_for_start():
                return
            while self.completed_round < self.cfg.run.rounds and not self._stop.is_set():
                if not self._wait_for_members():
                    break
                self._run_round(self.completed_round + 1)
            self._hand_over()
            if self.completed_round >= self.cfg.run.rounds:
                self._drain()  # FINISHED means every round's row and checkpoint are on disk
                with self._lock:
                    self.finished = True
                    self._wake_pulls(list(self._waiters))
                log.info("training finished after %d rounds", self.completed_round)
        finally:
            try:
                self._hand_over()  # stopped or failed between a close and the next opening
                self._evaluator.close()  # after the evaluator: it hands its last rounds to the writer
                self._writer.close()
                if self._evaluator.error is None and self._writer.error is None:
                    # Else rounds closed after the last written row would be checkpointed without theirs:
                    # the checkpoint on disk stays the one written after that row.
                    self._save()
                self.metrics.close()
            finally:
                self.folder.release()  # (a dead process releases it too: the kernel drops the flock)
        self._raise_finisher_error()

    def _wait_for_start(self) -> bool:
        run = self.cfg.run
        ready_since = None
        with self._lock:
            if self.completed_round > 0:  # resumed: give the fleet a moment to reconnect
                active = [d for d, r in self.registry.devices.items() if not r.departed]
                need = min(run.min_devices, len(active))
                if not self.objective.active_members():
                    need = max(need, 1)  # every device had left: wait for one here, not in _wait_for_members
                limit = time.monotonic() + run.resume_wait_s
                while not self._stop.is_set() and len(self._seen) < need and time.monotonic() < limit:
                    self._cond.wait(timeout=0.05)
                self.started = True
                log.info("resuming at round %d with %d of %d devices back", self.completed_round + 1,
                         len(self._seen), len(active))
                return not self._stop.is_set()
            while not self._stop.is_set():
                active = [d for d, r in self.registry.devices.items() if not r.departed]
                if len(active) >= run.min_devices:
                    ready_since = ready_since or time.monotonic()
                    if time.monotonic() - ready_since >= run.start_grace_s:
                        self.started = True
                        log.info("starting training with %d device%s", len(active), "" if len(active) == 1 else "s")
                        return True
                self._cond.wait(timeout=0.05)
        return False

    def _wait_for_members(self) -> bool:
        """True when the objective has a device to train; else pause until one joins (run.on_empty).

        When every device has left, no round can run: under `wait` the run pauses before the
        next round, and a device that joins (or comes back) enters the objective at once, as
        an arrival after the last closed round; under `stop` the run ends (ended_empty).
        """
        with self._lock:
            if self.objective.active_members():
                return True
        self._hand_over()  # the last closed round's row and checkpoint are written before the pause
        self._drain()
        tau = self.completed_round + 1
        warned = False
        with self._lock:
            while not self._stop.is_set():
                if self._pending_arrivals:  # joined (or came back) since the last close
                    changes = self.federation.apply_between_rounds(
                        arrivals=self._pending_arrival_events(),
                        departures=[Departure(d) for d in self._pending_departures])
                    self._pending_departures.clear()
                    if self.objective.active_members():
                        log.info("round %d: %s joined; training goes on", tau,
                                 ", ".join(changes["arrivals"] + changes["founded"]))
                        self._save()  # a crash now must not lose the new members
                        return True
                if self.cfg.run.on_empty is OnEmpty.STOP:
                    self.ended_empty = True
                    log.error("no device is left to train (every one departed) before round %d: ending the run "
                              "(run.on_empty = stop); --resume continues it once devices join", tau)
                    return False
                if not warned:
                    warned = True
                    log.warning("no device is left to train (every one departed): round %d waits until a device "
                                "joins (run.on_empty = wait)", tau)
                self._cond.wait(timeout=0.5)
        return False

    def _pending_arrival_events(self) -> list[Arrival]:
        """The pending arrivals as events (lock held), which clears them."""
        events = [Arrival(d, self.registry.get(d).sample_count, founding=d in self._founding)
                  for d in self._pending_arrivals]
        self._pending_arrivals.clear()
        self._founding.clear()
        return events

    def _hand_over(self) -> None:
        """Give the closed round(s) not yet handed over to the evaluator, in order."""
        while self._closed:
            self._evaluator.put(self._closed.pop(0))  # blocks while it is two rounds behind

    def _run_round(self, tau: int) -> None:
        """Open round tau, hand the previous one to the finisher, wait for answers, close."""
        self._raise_finisher_error()
        deadline_s = self.cfg.run.deadline_s
        grace_s = self._deadline_with_grace()
        payload, data = wire.encode(self.params)  # only this thread changes the params
        chunks = tuple(pb.RoundChunk(data=piece) for piece in wire.chunks(data))
        with self._lock:
            opening = self.federation.open(tau)
            participants = [d for d in self.registry.ordered(list(opening.participants))
                            if not self.registry.get(d).departed]
            self.current = r = OpenRound(round_id=tau, lr=opening.lr, opened_at=time.monotonic(), opening=opening,
                                         participants=participants, payload=payload, chunks=chunks,
                                         summed=self.federation.start_sum(opening))
            overhead = None if self._last_close is None else r.opened_at - self._last_close
            wakeups_before = self.pull_wakeups
            self._wake_pulls(participants)
        # Only now, with this round open, does the last one's evaluation start competing for the CPU.
        self._hand_over()
        with self._lock:
            # Wait until every participant answered (or left) or its deadline passed, and no
            # scripted event of this round is still to come. Pushes wake this thread only when
            # the last one answers; deadlines are recomputed on waking.
            while not self._stop.is_set():
                held = self._scripted_events_due(tau, r, time.monotonic())
                if not r.waiting and not held:
                    reason = "all answered"
                    break
                limit = r.opened_at + deadline_s
                for d in r.waiting:  # a device's deadline runs from the delivery of its model
                    delivered = r.delivered.get(d)
                    if delivered is not None and delivered + grace_s > limit:
                        limit = delivered + grace_s
                now = time.monotonic()
                if now >= limit and not held:
                    reason = "deadline"
                    break
                self._cond.wait(timeout=0.05 if held else limit - now)  # held: joins and leaves are polled
            else:
                r.closed = True
                log.info("round %d abandoned: stopping", tau)
                return
            r.closed = True
            closed_at = time.monotonic()
            r.pull_wakeups = self.pull_wakeups - wakeups_before  # its opening's included
            self._closed.append(self._close(r, reason=reason, overhead_s=overhead, closed_at=closed_at))

    def _scripted_events_due(self, tau: int, r: OpenRound, now: float) -> bool:
        """True while a device scripted to arrive in (or depart after) round `tau` has not done so yet.

        run.expected_arrivals / expected_departures make scripted experiments exact: the round
        is held open for them at most run.expected_wait_s, then closes with an error logged.
        """
        run = self.cfg.run
        due = [d for d, rnd in run.expected_arrivals.items() if rnd == tau and self.registry.get(d) is None]
        # A departure is awaited only from a device that uploaded (it leaves right after); a
        # dead device is not waited for.
        due += [d for d, rnd in run.expected_departures.items()
                if rnd == tau and d in r.updates and not self.registry.get(d).departed]
        if not due:
            return False
        if now < r.opened_at + run.expected_wait_s:
            return True
        if not r.gave_up_waiting:
            r.gave_up_waiting = True
            log.error("round %d: scripted arrival/departure of %s did not happen within run.expected_wait_s = %g s; "
                      "closing the round without it", tau, ", ".join(sorted(due)), run.expected_wait_s)
        return False

    def _close(self, r: OpenRound, *, reason: str, overhead_s: float | None, closed_at: float) -> _Closed:
        """Aggregate and apply the round's events (under the lock); the rest goes to the finisher."""
        weighing = self.federation.weigh(r.round_id, r.summed.s)
        outcome = self.federation.close(
            weighing, summed=r.summed, arrivals=self._pending_arrival_events(),
            departures=[Departure(d) for d in self._pending_departures])
        self._pending_departures.clear()
        # Overhead of the next round = its opening time minus this close (deadline or all answered).
        self._last_close = closed_at
        shards = [self.registry.get(d).shard_index for d in self.objective.members()]
        return _Closed(r=r, outcome=outcome, reason=reason, overhead_s=overhead_s, closed_at=closed_at,
                       aggregate_s=time.monotonic() - closed_at, shards=shards, objective=self.objective.to_dict(),
                       registry=self.registry.snapshot(), memory=self._memory_snapshot())

    def _memory_snapshot(self) -> dict | None:
        # UpdateMemory replaces its tensors, never changes them: a shallow copy stays as it was at the close
        memory = self.federation.memory
        return memory.snapshot() if memory is not None else None

    # ---- after the close, beside the next round: evaluation, metrics row, checkpoint -------

    def _evaluate(self, closed: list[_Closed]) -> None:
        """Evaluator thread: test each round's model and make its metrics row; the writer takes both."""
        for c in closed:
            self._writer.put((c, self._row(c)))

    def _row(self, c: _Closed) -> dict:
        r = c.r
        started = time.monotonic()
        if self.cfg.run.evaluate:
            test = self.data.test_for(c.shards) if None not in c.shards else self.data.test
            acc, loss = evaluate(self.model, c.outcome.params, test)
        else:
            acc, loss = math.nan, math.nan
        evaluated = time.monotonic()
        updates = r.updates
        row = round_row(r.opening, c.outcome, test_acc=acc, test_loss=loss)
        row.update({
            "time": time.time(), "close_reason": c.reason, "left_during_round": sorted(r.left),
            "bytes_out": r.bytes_out, "bytes_in": {d: u.bytes_in for d, u in updates.items()},
            "train_s": {d: u.train_s for d, u in updates.items()},
            "local_loss": {d: u.local_loss for d, u in updates.items()},
            "previous_upload_s": {d: u.previous_upload_s for d, u in updates.items()},
            "arrived_after_s": {d: u.arrived_after_s for d, u in updates.items()},
            "delivered_after_s": {d: t - r.opened_at for d, t in r.delivered.items()},  # opening -> model handed over
            "rejected": {d: list(v) for d, v in r.rejected.items()},
            "round_s": c.closed_at - r.opened_at, "overhead_s": c.overhead_s,
            # aggregate_s is on the path between rounds; evaluation runs while the next round is open.
            "aggregate_s": c.aggregate_s, "eval_s": evaluated - started,
            "aggregate_eval_s": evaluated - c.closed_at, "pull_wakeups": r.pull_wakeups,
        })
        return row

    def _write(self, done: list[tuple[_Closed, dict]]) -> None:
        """Writer thread: the rounds' metrics rows, then the last one's checkpoint (each write fsynced).

        A writer that fell behind writes the rows of all waiting rounds with one fsync and
        only the newest checkpoint: it holds everything the older ones would, and every row
        is on disk before the checkpoint of its round or a later one.
        """
        self.metrics.write_many([row for _, row in done])
        c, _ = done[-1]
        save_checkpoint(self.checkpoint_path, Checkpoint(
            params=c.outcome.params, completed_round=c.r.round_id, run_id=self.run_id,
            registry=c.registry.to_dict(), objective=c.objective, memory=c.memory))
        for c, row in done:
            log.info("round %d: acc %.2f%% loss %.3f, s=%s (%s)", c.r.round_id, 100 * row["test_acc"],
                     row["test_loss"], row["s"], c.reason)

    def _drain(self) -> None:
        """Wait until every closed round is evaluated and written."""
        self._evaluator.drain()
        self._writer.drain()
        self._raise_finisher_error()

    def _raise_finisher_error(self) -> None:
        error = (self._evaluator and self._evaluator.error) or (self._writer and self._writer.error)
        if isinstance(error, FlexFLError):
            raise error  # says what failed in one line (a plug-in model that raised, ...)
        if error is not None:
            raise RuntimeError("evaluating or writing a closed round failed (see the log)") from error

    # ---- checkpoints ------------------------------------------------------------------

    def _save(self) -> None:
        with self._lock:
            ckpt = Checkpoint(params=self.params, completed_round=self.completed_round, run_id=self.run_id,
                              registry=self.registry.to_dict(), objective=self.objective.to_dict(),
                              memory=self._memory_snapshot())
        save_checkpoint(self.checkpoint_path, ckpt)

    def _restore(self) -> None:
        ckpt = load_checkpoint(self.checkpoint_path, expected=self.expected)
        self.federation.params = {n: v.clone() for n, v in ckpt.params.items()}
        self.federation.completed_round = ckpt.completed_round
        self.federation.objective = Objective.from_dict(ckpt.objective)
        if self.federation.memory is not None:
            if ckpt.memory is None:
                raise ConfigError(f"checkpoint {self.checkpoint_path} holds no update memory, which strategy "
                                  f"{self.cfg.rules.aggregation.name!r} needs to resume (written under another strategy)")
            try:
                self.federation.memory.restore(ckpt.memory)
            except (AggregationError, KeyError, TypeError) as exc:
                raise ConfigError(f"checkpoint {self.checkpoint_path}: its update memory is malformed: {exc}") from None
        self.run_id = ckpt.run_id
        self.registry = Registry.from_dict(ckpt.registry)
        self._replay_journal()
        # Devices that joined (or came back) after the checkpoint's last close are in the registry
        # but not (or no longer) training in the objective: they still arrive.
        objective = self.objective
        self._pending_arrivals = [d for d, rec in self.registry.devices.items()
                                  if not rec.departed and (d not in objective.sample_counts
                                                           or d in objective.departed_included)]
        log.info("resumed from %s after round %d", self.checkpoint_path, self.completed_round)

    def _repair_metrics(self, path: Path) -> None:
        """Keep rows of checkpointed rounds only; say which rounds have no row."""
        if not path.exists():
            return
        rows, torn = read_metrics_and_torn(path)
        kept = [row for row in rows if row["round"] <= self.completed_round]
        if torn:
            # A crash mid-write left part of a row: appending after it would glue the next row to
            # it. Set the fragments aside (nothing is deleted) and rewrite the file clean.
            aside = path.with_name(path.name + ".torn")
            with open(aside, "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in torn))
            log.warning("metrics.jsonl held %d torn line(s) from a crash: moved to %s", len(torn), aside)
        if len(kept) != len(rows):
            redo = sorted({row["round"] for row in rows} - {row["round"] for row in kept})
            log.warning("metrics hold rows of rounds %s that the checkpoint does not: they run again", redo)
        if torn or len(kept) != len(rows):
            MetricsWriter.rewrite(path, kept)
        missing = sorted(set(range(1, self.completed_round + 1)) - {row["round"] for row in kept})
        if missing:
            log.warning("metrics have no row for rounds %s (written by a version that checkpointed first)", missing)
